/* comm_nccl.c — the nccl transport (comm_gpu.h), built only with NCCL (meson: MOE_HAVE_NCCL).
 *
 * Payload entries run on a communication stream of this comm, ordered against the context's stream by
 * two events: `ready` (recorded on gpu->stream, waited for by the comm stream: the rows are written)
 * and `done` (recorded on the comm stream, waited for by gpu->stream: later kernels see the result).
 * The host then polls `done` and ncclCommGetAsyncError until the exchange is complete, so a peer that
 * never arrives or a failed connection becomes MOE_ERR_TIMEOUT / MOE_ERR_COMM with a message
 * (nccl-tests' watchdog), after ncclCommAbort; an aborted comm fails every later payload entry.
 *
 * Point-to-point sends and receives (comm.h) are ncclSend / ncclRecv on the same stream, each with an event of its
 * own that its wait polls the same way; a batch of them is one ncclGroup.
 *
 * Limits of the watchdog: the communicator is blocking (default config), so ncclCommInitRank and the
 * connection setup inside the first ncclGroupEnd with a new peer run inside NCCL calls that the
 * watchdog cannot interrupt; only the transfers themselves are covered. A non-blocking config
 * (ncclConfig_t.blocking = 0, polling ncclInProgress) would cover them too, at the price of a state
 * machine around every call.
 *
 * Bootstrap: rank 0 of the MPI communicator makes the unique id, MPI_Bcast sends it, every rank calls
 * ncclCommInitRank on its context's device; the ranks agree on the outcome of each step over the inner
 * MPI transport (on a dup of the communicator), which also carries the control entries.
 * Checked by tests/test_gpu_alltoall.c and, for the fixed-tree all-reduce, tests/test_gpu_tree_allreduce.c
 * (meson test --suite gpu; skips without a GPU). */
#include <nccl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "alltoall/comm_forward.h"
#include "alltoall/comm_gpu_mpi.h"
#include "alltoall/comm_mpi.h"
#include "alltoall/tree_add_cuda.h"
#include "alltoall/tree_allreduce.h"
#include "core/gpu_cuda.h"

#ifdef MOE_REAL_IS_DOUBLE
#error "the NCCL transport reduces float payloads: libmoe_cuda is built with moe_real = float only"
#endif

typedef struct {
    moe_comm *inner;     /* the MPI transport on a dup of `comm`: control entries */
    MPI_Comm comm;       /* the communicator given to moe_comm_create_nccl (owned; the bootstrap's) */
    moe_gpu *gpu;
    ncclComm_t nccl;     /* NULL once aborted */
    cudaStream_t stream; /* communication stream (non-blocking, on gpu->device) */
    cudaEvent_t ready, done;
    void *tree_scratch;  /* device: the fixed tree's moe__tree_scratch_count floats, grown on demand */
    size_t tree_scratch_nbytes;
    struct nccl_request *batch; /* point-to-point posts of the open batch, recorded at its end */
} nccl_state;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static moe_status nccl_failed(const moe_comm *c, const char *call, ncclResult_t r) {
    return moe_fail(MOE_ERR_COMM, "world rank %d: %s on communicator '%s' (rank %d of %d) failed: %s", c->world_rank,
                    call, c->label, c->rank, c->size, ncclGetErrorString(r));
}

#define MOE_NCCL_TRY(c, call)                                                        \
    do {                                                                             \
        ncclResult_t moe_nccl_r_ = (call);                                           \
        if (moe_nccl_r_ != ncclSuccess) return nccl_failed((c), #call, moe_nccl_r_); \
    } while (0)

/* Records what the exchange was doing (in the MPI transport's words), then aborts the NCCL communicator,
 * which also ends its kernels, so that `done` and the compute stream waiting for it can complete. */
static moe_status abort_with_message(moe_comm *c, moe_status status, const char *what, const char *op,
                                     const char *state, const char *detail) {
    nccl_state *s = c->impl;
    moe_fail(status,
             "world rank %d: %s: %s on communicator '%s' (rank %d of %d) %s; %ld exchanges completed on it before "
             "this one; NCCL: %s; the NCCL communicator was aborted",
             c->world_rank, what, op, c->label, c->rank, c->size, state, c->completed, detail);
    ncclCommAbort(s->nccl);
    s->nccl = NULL;
    return status;
}

/* Ordering before the operation: the comm stream waits for everything queued on the compute stream. */
static moe_status begin(moe_comm *c, const char *op) {
    nccl_state *s = c->impl;
    if (!s->nccl)
        return moe_fail(MOE_ERR_COMM, "world rank %d: %s on communicator '%s': its NCCL communicator was aborted "
                                      "after an earlier failure", c->world_rank, op, c->label);
    MOE_CUDA_TRY(cudaEventRecord(s->ready, s->gpu->stream));
    MOE_CUDA_TRY(cudaStreamWaitEvent(s->stream, s->ready, 0));
    return MOE_OK;
}

/* The watchdog's poll of `done` (recorded after the operation on the comm stream): one exchange more completed, or
 * the communicator aborted with a message. */
static moe_status poll_done(moe_comm *c, cudaEvent_t done, const char *op) {
    nccl_state *s = c->impl;
    const double start = now_s();
    moe_gpu_count_wait(s->gpu, "NCCL completion");
    for (long polls = 0;; polls++) {
        cudaError_t q = cudaEventQuery(done);
        if (q == cudaSuccess) {
            c->completed++;
            return MOE_OK;
        }
        if (q != cudaErrorNotReady) {
            char state[256];
            snprintf(state, sizeof state, "failed (%s)", cudaGetErrorString(q));
            return abort_with_message(c, MOE_ERR_CUDA, "CUDA error", op, state, ncclGetLastError(s->nccl));
        }
        /* "not yet" is an answer, but the runtime keeps it as its last error, which the next launch check
         * (cudaGetLastError) or CUB's error peek would report as a failure: clear it. */
        cudaGetLastError();
        ncclResult_t async = ncclSuccess, r = ncclCommGetAsyncError(s->nccl, &async);
        if (r != ncclSuccess) async = r;
        if (async != ncclSuccess && async != ncclInProgress) {
            char detail[512];
            snprintf(detail, sizeof detail, "%s (%s)", ncclGetErrorString(async), ncclGetLastError(s->nccl));
            return abort_with_message(c, MOE_ERR_COMM, "asynchronous NCCL error", op, "failed", detail);
        }
        if (c->timeout_s > 0 && now_s() - start > c->timeout_s) {
            char state[64];
            snprintf(state, sizeof state, "still incomplete after %.1f s", c->timeout_s);
            return abort_with_message(c, MOE_ERR_TIMEOUT, "watchdog", op, state, ncclGetLastError(s->nccl));
        }
        if (polls > 100) sched_yield();
    }
}

/* Ordering after the operation (the compute stream waits for `done`), then the watchdog's poll. */
static moe_status finish(moe_comm *c, const char *op) {
    nccl_state *s = c->impl;
    MOE_CUDA_TRY(cudaEventRecord(s->done, s->stream));
    MOE_CUDA_TRY(cudaStreamWaitEvent(s->gpu->stream, s->done, 0));
    return poll_done(c, s->done, op);
}

static moe_status nccl_alltoallv_rows(moe_comm *c, const void *send, const int *send_rows, void *recv,
                                      const int *recv_rows, size_t row_nbytes) {
    static const char op[] = "alltoallv of rows";
    nccl_state *s = c->impl;
    for (int p = 0; p < c->size; p++)
        if (send_rows[p] < 0 || recv_rows[p] < 0) return MOE_ERR_INVALID_ARG;
    if (send_rows[c->rank] != recv_rows[c->rank]) return MOE_ERR_COUNT_MISMATCH;
    MOE_TRY(begin(c, op));
    /* rows are opaque bytes: counts in ncclUint8; a peer with no rows either way gets no call */
    MOE_NCCL_TRY(c, ncclGroupStart());
    ncclResult_t r = ncclSuccess;
    size_t send_offset = 0, recv_offset = 0;
    for (int p = 0; p < c->size && r == ncclSuccess; p++) {
        const size_t send_nbytes = (size_t)send_rows[p] * row_nbytes, recv_nbytes = (size_t)recv_rows[p] * row_nbytes;
        if (send_nbytes) r = ncclSend((const char *)send + send_offset, send_nbytes, ncclUint8, p, s->nccl, s->stream);
        if (recv_nbytes && r == ncclSuccess)
            r = ncclRecv((char *)recv + recv_offset, recv_nbytes, ncclUint8, p, s->nccl, s->stream);
        send_offset += send_nbytes, recv_offset += recv_nbytes;
    }
    /* the group is closed whatever happened inside it */
    ncclResult_t end = ncclGroupEnd();
    if (r != ncclSuccess) return nccl_failed(c, "ncclSend/ncclRecv", r);
    if (end != ncclSuccess) return nccl_failed(c, "ncclGroupEnd", end);
    return finish(c, op);
}

static moe_status nccl_allreduce_real(moe_comm *c, moe_real *buf, size_t count) {
    static const char op[] = "allreduce";
    nccl_state *s = c->impl;
    MOE_TRY(begin(c, op));
    MOE_NCCL_TRY(c, ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, s->nccl, s->stream));
    return finish(c, op);
}

/* The fixed tree (tree_allreduce.h: the all-reduce or a half): every round's grouped ncclSend/ncclRecv and every add
 * kernel are queued in order on the communication stream, so the whole schedule runs without the host, which waits
 * once at the end (finish: the watchdog). */
static moe_status tree_sendrecv(void *ctx, const void *send, size_t send_nbytes, void *recv, size_t recv_nbytes,
                                int peer) {
    moe_comm *c = ctx;
    nccl_state *s = c->impl;
    MOE_NCCL_TRY(c, ncclGroupStart());
    ncclResult_t r = ncclSuccess;
    if (send_nbytes) r = ncclSend(send, send_nbytes, ncclUint8, peer, s->nccl, s->stream);
    if (recv_nbytes && r == ncclSuccess) r = ncclRecv(recv, recv_nbytes, ncclUint8, peer, s->nccl, s->stream);
    ncclResult_t end = ncclGroupEnd(); /* closed whatever happened inside */
    if (r != ncclSuccess) return nccl_failed(c, "ncclSend/ncclRecv", r);
    if (end != ncclSuccess) return nccl_failed(c, "ncclGroupEnd", end);
    return MOE_OK;
}

static moe_status tree_add(void *ctx, void *y, const void *lower, const void *higher, size_t count) {
    return moe__tree_add_f32_cuda(((nccl_state *)((moe_comm *)ctx)->impl)->stream, y, lower, higher, count);
}

static moe_status nccl_tree_real(moe_comm *c, moe_real *buf, const moe__tree_job *job) {
    static const moe__tree_ops ops = {tree_sendrecv, tree_add};
    const char *op = moe__tree_job_name(job);
    nccl_state *s = c->impl;
    const size_t scratch_nbytes = moe__tree_scratch_count(c, job, sizeof *buf) * sizeof *buf;
    if (scratch_nbytes > s->tree_scratch_nbytes) {
        /* the last exchange's finish saw the stream drained, so no queued step still reads the old buffer */
        MOE_CUDA_TRY(cudaSetDevice(s->gpu->device));
        MOE_CUDA_TRY(cudaFree(s->tree_scratch));
        s->tree_scratch = NULL, s->tree_scratch_nbytes = 0;
        moe_gpu_count_allocation(s->gpu);
        MOE_CUDA_TRY(cudaMalloc(&s->tree_scratch, scratch_nbytes));
        s->tree_scratch_nbytes = scratch_nbytes;
    }
    MOE_TRY(begin(c, op));
    MOE_TRY(moe__tree_run(&ops, c, c, job, buf, sizeof *buf, s->tree_scratch));
    return finish(c, op);
}

/* device to device on the compute stream (no communication: no watchdog); dst and src must not overlap
 * unless equal */
static moe_status nccl_copy_payload(moe_comm *c, void *dst, const void *src, size_t nbytes) {
    return moe_gpu_copy(((nccl_state *)c->impl)->gpu, dst, src, nbytes);
}

/* ---- point-to-point (comm.h): ncclSend / ncclRecv on the communication stream ----
 * A post queues the operation after the kernels queued on the compute stream before it (begin) and records the
 * request's event after it; inside a batch (one ncclGroup) the operations launch at its end, and so the events are
 * recorded there. A wait makes the compute stream wait for the event and polls it under the watchdog. NCCL carries
 * no tags and no sizes: messages between a pair match in posting order, and an empty one is no call at all (both
 * sides skip it alike, the sizes being equal). */

typedef struct nccl_request {
    moe_comm_request base;
    cudaEvent_t done;                  /* recorded on the comm stream after the operation */
    int queued;                        /* done is recorded: the operation was launched */
    struct nccl_request *next_in_batch; /* posted in the open batch, waiting for its launch */
} nccl_request;

static void request_free(nccl_request *r) {
    if (r->done) cudaEventDestroy(r->done); /* released by CUDA once complete, if it is still pending */
    free(r);
}

static moe_status record_done(nccl_request *r, cudaStream_t stream) {
    MOE_CUDA_TRY(cudaEventRecord(r->done, stream));
    r->queued = 1;
    return MOE_OK;
}

static moe_status post_on_stream(moe_comm *c, nccl_request *r) {
    nccl_state *s = c->impl;
    const moe_comm_request *m = &r->base;
    char op[128];
    moe__comm_request_describe(m, op, sizeof op);
    MOE_CUDA_TRY(cudaEventCreateWithFlags(&r->done, cudaEventDisableTiming));
    MOE_TRY(begin(c, op)); /* inside a group too: the wait is queued on the stream before the group's launch */
    if (m->nbytes && m->sending) MOE_NCCL_TRY(c, ncclSend(m->buf, m->nbytes, ncclUint8, m->peer, s->nccl, s->stream));
    if (m->nbytes && !m->sending) MOE_NCCL_TRY(c, ncclRecv(m->buf, m->nbytes, ncclUint8, m->peer, s->nccl, s->stream));
    if (!c->in_batch) return record_done(r, s->stream);
    r->next_in_batch = s->batch;
    s->batch = r;
    return MOE_OK;
}

static moe_status nccl_post(moe_comm *c, const moe_comm_request *what, moe_comm_request **req) {
    nccl_request *r = calloc(1, sizeof *r);
    if (!r) return MOE_ERR_OUT_OF_MEMORY;
    r->base = *what;
    const moe_status st = post_on_stream(c, r);
    if (st != MOE_OK) return request_free(r), st; /* a failed post inside a batch is not in its list */
    *req = &r->base;
    return MOE_OK;
}

/* begin: ncclGroupStart; end: ncclGroupEnd launches the batch, then its requests' events are recorded. */
static moe_status nccl_batch(moe_comm *c, int begin) {
    nccl_state *s = c->impl;
    if (begin) {
        if (!s->nccl)
            return moe_fail(MOE_ERR_COMM, "world rank %d: a batch of posts on communicator '%s': its NCCL "
                                          "communicator was aborted after an earlier failure", c->world_rank, c->label);
        MOE_NCCL_TRY(c, ncclGroupStart());
        return MOE_OK;
    }
    const ncclResult_t end = ncclGroupEnd();
    moe_status st = end == ncclSuccess ? MOE_OK : nccl_failed(c, "ncclGroupEnd", end);
    for (nccl_request *r = s->batch; r && st == MOE_OK; r = r->next_in_batch) st = record_done(r, s->stream);
    s->batch = NULL; /* after a failure its requests stay unqueued: their waits fail */
    return st;
}

static moe_status nccl_wait(moe_comm *c, moe_comm_request *req) {
    nccl_state *s = c->impl;
    nccl_request *r = (nccl_request *)req;
    char op[128];
    moe__comm_request_describe(req, op, sizeof op);
    moe_status st = MOE_OK;
    if (!r->queued)
        st = moe_fail(MOE_ERR_COMM, "world rank %d: %s on communicator '%s': never launched (its batch failed)",
                      c->world_rank, op, c->label);
    else if (!s->nccl)
        st = moe_fail(MOE_ERR_COMM, "world rank %d: %s on communicator '%s': its NCCL communicator was aborted after "
                                    "an earlier failure", c->world_rank, op, c->label);
    else {
        const cudaError_t e = cudaStreamWaitEvent(s->gpu->stream, r->done, 0);
        st = e == cudaSuccess ? poll_done(c, r->done, op)
                              : moe_fail(MOE_ERR_CUDA, "world rank %d: %s: cudaStreamWaitEvent failed: %s",
                                         c->world_rank, op, cudaGetErrorString(e));
    }
    request_free(r);
    return st;
}

/* Frees what exists of a partly built state; `comm` stays with whoever owns it. */
static void release(nccl_state *s) {
    if (s->stream) cudaStreamSynchronize(s->stream);
    if (s->nccl) ncclCommDestroy(s->nccl);
    if (s->ready) cudaEventDestroy(s->ready);
    if (s->done) cudaEventDestroy(s->done);
    if (s->tree_scratch) cudaFree(s->tree_scratch);
    if (s->stream) cudaStreamDestroy(s->stream);
    moe_comm_destroy(s->inner);
    free(s);
}

static void nccl_destroy(moe_comm *c) {
    nccl_state *s = c->impl;
    MPI_Comm comm = s->comm;
    release(s);
    MPI_Comm_free(&comm);
    free(c);
}

static const moe_transport_ops nccl_ops = {
    .name = "nccl",
    .alltoall_ints = moe__comm_forward_alltoall_ints,
    .alltoallv_rows = nccl_alltoallv_rows,
    .alltoallv_host_rows = moe__comm_forward_alltoallv_host_rows,
    .allgatherv_bytes = moe__comm_forward_allgatherv_bytes,
    .allreduce_sum_real = nccl_allreduce_real,
    .allreduce_sum_f64 = moe__comm_forward_allreduce_f64,
    .tree_real = nccl_tree_real,
    .allreduce_tree_f64 = moe__comm_forward_allreduce_tree_f64,
    .scan_sum_ints = moe__comm_forward_scan_ints,
    .barrier = moe__comm_forward_barrier,
    .copy_payload = nccl_copy_payload,
    .post = nccl_post,
    .wait = nccl_wait,
    .batch = nccl_batch,
    .destroy = nccl_destroy,
};

/* The stream, the events and (on rank 0) the unique id: local steps, agreed on by the caller. */
static moe_status create_local(moe_comm *c, ncclUniqueId *id) {
    nccl_state *s = c->impl;
    MOE_CUDA_TRY(cudaSetDevice(s->gpu->device));
    MOE_CUDA_TRY(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking));
    MOE_CUDA_TRY(cudaEventCreateWithFlags(&s->ready, cudaEventDisableTiming));
    MOE_CUDA_TRY(cudaEventCreateWithFlags(&s->done, cudaEventDisableTiming));
    if (c->rank == 0) MOE_NCCL_TRY(c, ncclGetUniqueId(id));
    return MOE_OK;
}

static moe_status bootstrap(moe_comm *c, MPI_Comm comm) {
    nccl_state *s = c->impl;
    ncclUniqueId id = {{0}};
    MOE_TRY(moe_comm_agree(s->inner, create_local(c, &id)));
    int rc = MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, comm);
    MOE_TRY(moe_comm_agree(s->inner, rc == MPI_SUCCESS ? MOE_OK : MOE_ERR_COMM));
    ncclResult_t r = ncclCommInitRank(&s->nccl, c->size, id, c->rank);
    if (r != ncclSuccess) s->nccl = NULL;
    return moe_comm_agree(s->inner, r == ncclSuccess ? MOE_OK : nccl_failed(c, "ncclCommInitRank", r));
}

moe_status moe_comm_create_nccl(moe_gpu *gpu, MPI_Comm comm, const char *label, double timeout_s, moe_comm **out) {
    if (!gpu || !out || comm == MPI_COMM_NULL) return MOE_ERR_INVALID_ARG;
    moe_comm *c = calloc(1, sizeof *c);
    nccl_state *s = calloc(1, sizeof *s);
    if (!c || !s) return free(c), free(s), MOE_ERR_OUT_OF_MEMORY;
    MPI_Comm dup = MPI_COMM_NULL;
    moe_comm *inner = NULL;
    moe_status st = MPI_Comm_dup(comm, &dup) == MPI_SUCCESS ? MOE_OK : MOE_ERR_COMM;
    if (st == MOE_OK) st = moe_comm_create_mpi(dup, label, timeout_s, &inner);
    if (st != MOE_OK) {
        if (dup != MPI_COMM_NULL) MPI_Comm_free(&dup);
        return free(c), free(s), st;
    }
    *s = (nccl_state){.inner = inner, .comm = comm, .gpu = gpu};
    *c = (moe_comm){.ops = &nccl_ops, .rank = inner->rank, .size = inner->size, .label = inner->label,
                    .world_rank = inner->world_rank, .timeout_s = inner->timeout_s, .impl = s};
    st = bootstrap(c, comm);
    if (st != MOE_OK) {
        /* this rank's init may have succeeded while another's failed: that communicator is unusable */
        if (s->nccl) {
            ncclCommAbort(s->nccl);
            s->nccl = NULL;
        }
        release(s); /* comm is still the caller's */
        free(c);
        return st;
    }
    *out = c;
    return MOE_OK;
}

moe_status moe_comm_nccl_version(char *out, size_t n) {
    int v = 0;
    const ncclResult_t r = ncclGetVersion(&v);
    if (r != ncclSuccess) return moe_fail(MOE_ERR_COMM, "ncclGetVersion failed: %s", ncclGetErrorString(r));
    /* NCCL_VERSION_CODE: major * 10000 + minor * 100 + patch since 2.9 (major * 1000 + minor * 100 + patch before) */
    if (v >= 20900) snprintf(out, n, "NCCL %d.%d.%d", v / 10000, v % 10000 / 100, v % 100);
    else snprintf(out, n, "NCCL %d.%d.%d", v / 1000, v % 1000 / 100, v % 100);
    return MOE_OK;
}
