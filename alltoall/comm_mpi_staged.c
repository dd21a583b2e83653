/* comm_mpi_staged.c — the mpi-staged transport (comm_gpu.h): the MPI transport (comm_mpi.c) on device
 * buffers, staged through pinned host memory. A payload exchange copies the device rows to the host,
 * waits for the context's stream (which orders the copy after the kernels that wrote the rows), runs the
 * MPI exchange with its watchdog on the host copies, and queues the copy back on the stream, which orders
 * it before the kernels that read the result. It makes no assumption about CUDA-aware MPI, and several
 * ranks may share one GPU (NCCL refuses that), which is what it is for: tests and small machines.
 * Control entries are the inner MPI transport's, unchanged; point-to-point messages are too, on host copies.
 * Checked by tests/test_gpu_alltoall.c and, for the fixed-tree all-reduce, tests/test_gpu_tree_allreduce.c
 * (meson test --suite gpu; skips without a GPU). */
#include <stdlib.h>

#include "alltoall/comm_forward.h"
#include "alltoall/comm_gpu_mpi.h"
#include "alltoall/comm_mpi.h"
#include "alltoall/tree_allreduce.h"
#include "core/gpu_cuda.h"

enum { STAGING_ALIGN = 256, STAGING_MIN_NBYTES = 4096 };

typedef struct {
    moe_comm *inner; /* the MPI transport: control entries, and the payload exchanges on the host copies */
    moe_gpu *gpu;
    /* Pinned staging, grown on demand: [send copy | pad to STAGING_ALIGN | recv copy], i.e.
     * round_up(send_nbytes, 256) + recv_nbytes bytes for an exchange, count * sizeof(moe_real) for an
     * all-reduce (in place), the window's n * sizeof(moe_real) for a half of the fixed tree. A copy back to the
     * device queued by the previous exchange may still read it until the next synchronisation of gpu->stream. */
    void *pinned;
    size_t pinned_nbytes;
} staged_state;

static moe_status reserve_pinned(staged_state *s, size_t nbytes) {
    if (nbytes < STAGING_MIN_NBYTES) nbytes = STAGING_MIN_NBYTES;
    if (nbytes <= s->pinned_nbytes) return MOE_OK;
    /* the previous exchange's copy back may still be reading the old buffer */
    MOE_TRY(moe_gpu_wait(s->gpu, "MPI staging growth"));
    MOE_CUDA_TRY(cudaFreeHost(s->pinned));
    s->pinned = NULL, s->pinned_nbytes = 0;
    const size_t grow = nbytes + nbytes / 4;
    moe_gpu_count_allocation(s->gpu);
    MOE_CUDA_TRY(cudaMallocHost(&s->pinned, grow));
    s->pinned_nbytes = grow;
    return MOE_OK;
}

/* Device -> pinned copy, then wait for the stream: the host copy is complete, and so is every copy back
 * queued by earlier exchanges (same stream), so the staging buffer is free for MPI. */
static moe_status stage_out(staged_state *s, void *host, const void *device, size_t nbytes) {
    if (nbytes) MOE_CUDA_TRY(cudaMemcpyAsync(host, device, nbytes, cudaMemcpyDeviceToHost, s->gpu->stream));
    return moe_gpu_wait(s->gpu, "MPI staging");
}

/* Pinned -> device copy, queued: kernels queued after it on the stream see the result. */
static moe_status stage_in(staged_state *s, void *device, const void *host, size_t nbytes) {
    if (nbytes) MOE_CUDA_TRY(cudaMemcpyAsync(device, host, nbytes, cudaMemcpyHostToDevice, s->gpu->stream));
    return MOE_OK;
}

static moe_status staged_alltoallv_rows(moe_comm *c, const void *send, const int *send_rows, void *recv,
                                        const int *recv_rows, size_t row_nbytes) {
    staged_state *s = c->impl;
    size_t send_count = 0, recv_count = 0;
    for (int p = 0; p < c->size; p++) {
        if (send_rows[p] < 0 || recv_rows[p] < 0) return MOE_ERR_INVALID_ARG;
        send_count += (size_t)send_rows[p], recv_count += (size_t)recv_rows[p];
    }
    const size_t send_nbytes = send_count * row_nbytes, recv_nbytes = recv_count * row_nbytes;
    const size_t recv_offset = (send_nbytes + STAGING_ALIGN - 1) / STAGING_ALIGN * STAGING_ALIGN;
    MOE_TRY(reserve_pinned(s, recv_offset + recv_nbytes));
    char *host_send = s->pinned, *host_recv = host_send + recv_offset;
    MOE_TRY(stage_out(s, host_send, send, send_nbytes));
    moe_comm *in = moe__comm_forward_enter(c);
    MOE_TRY(moe__comm_forward_leave(
        c, moe_comm_alltoallv_rows(in, host_send, send_rows, host_recv, recv_rows, row_nbytes)));
    return stage_in(s, recv, host_recv, recv_nbytes);
}

/* On a host copy of buf's count values, in place: the inner MPI transport's all-reduce, or with a job its fixed
 * tree (whose window is buf's count values). */
static moe_status staged_reduce(moe_comm *c, moe_real *buf, size_t count, const moe__tree_job *job) {
    staged_state *s = c->impl;
    const size_t nbytes = count * sizeof(moe_real);
    MOE_TRY(reserve_pinned(s, nbytes));
    MOE_TRY(stage_out(s, s->pinned, buf, nbytes));
    moe_comm *in = moe__comm_forward_enter(c);
    MOE_TRY(moe__comm_forward_leave(c, job ? moe__comm_tree_real(in, s->pinned, job)
                                           : moe_comm_allreduce_sum_real(in, s->pinned, count)));
    return stage_in(s, buf, s->pinned, nbytes);
}

static moe_status staged_allreduce_real(moe_comm *c, moe_real *buf, size_t count) {
    return staged_reduce(c, buf, count, NULL);
}

/* the tree's steps and adds run on a host copy of the window (the MPI transport's), the same bits as on the host */
static moe_status staged_tree_real(moe_comm *c, moe_real *buf, const moe__tree_job *job) {
    return staged_reduce(c, buf, job->n, job);
}

/* device to device, queued on the stream; dst and src must not overlap unless equal */
static moe_status staged_copy_payload(moe_comm *c, void *dst, const void *src, size_t nbytes) {
    return moe_gpu_copy(((staged_state *)c->impl)->gpu, dst, src, nbytes);
}

/* ---- point-to-point (comm.h): the inner MPI transport's, on a host copy per request ----
 * A send's bytes are copied out at the post (its host sync: the copy follows the kernels that wrote them), so the
 * device buffer is handed off when the post returns; a receive's host copy goes up at its wait, queued on the
 * stream. The host copies are pageable (malloc): a request costs no pinned allocation. A receive's copy is freed by a
 * host function queued on the stream after its upload (free_after_upload), with no host wait: CUDA documents that
 * cudaMemcpyAsync from pageable memory "might be synchronous", not that the source has been read when it returns. */

typedef struct {
    moe_comm_request base;
    moe_comm_request *inner; /* the MPI transport's request on `host` */
    void *host;              /* nbytes, malloc'ed (NULL for an empty message) */
} staged_request;

static moe_status staged_post(moe_comm *c, const moe_comm_request *what, moe_comm_request **req) {
    staged_state *s = c->impl;
    staged_request *r = calloc(1, sizeof *r);
    if (!r || (what->nbytes && !(r->host = malloc(what->nbytes)))) return free(r), MOE_ERR_OUT_OF_MEMORY;
    r->base = *what;
    moe_status st = what->sending ? stage_out(s, r->host, what->buf, what->nbytes) : MOE_OK;
    if (st == MOE_OK) {
        moe_comm *in = moe__comm_forward_enter(c);
        st = moe__comm_forward_leave(
            c, what->sending ? moe_comm_isend_bytes(in, r->host, what->nbytes, what->peer, what->tag, &r->inner)
                             : moe_comm_irecv_bytes(in, r->host, what->nbytes, what->peer, what->tag, &r->inner));
    }
    if (st != MOE_OK) return free(r->host), free(r), st;
    *req = &r->base;
    return MOE_OK;
}

static void CUDART_CB free_after_upload(void *host) { free(host); }

static moe_status staged_wait(moe_comm *c, moe_comm_request *req) {
    staged_request *r = (staged_request *)req;
    staged_state *s = c->impl;
    moe_comm *in = moe__comm_forward_enter(c);
    moe_status st = moe__comm_forward_leave(c, moe_comm_wait(in, r->inner));
    if (st != MOE_OK) return free(r), st; /* MPI may still write r->host: left to the ending job */
    if (!req->sending && r->host) {
        st = stage_in(s, req->buf, r->host, req->nbytes);
        /* the upload may still read r->host: freed once the stream has done it (or, failing that, after a wait) */
        const cudaError_t queued = cudaLaunchHostFunc(s->gpu->stream, free_after_upload, r->host);
        if (queued == cudaSuccess) {
            r->host = NULL;
        } else { /* a broken context: the copy is waited for (whatever the wait says), the failure reported */
            cudaStreamSynchronize(s->gpu->stream);
            if (st == MOE_OK)
                st = moe__gpu_call_failed(MOE_ERR_CUDA, __FILE__, __LINE__, "cudaLaunchHostFunc",
                                          cudaGetErrorString(queued));
        }
    }
    free(r->host), free(r);
    return st;
}

static void staged_destroy(moe_comm *c) {
    staged_state *s = c->impl;
    cudaStreamSynchronize(s->gpu->stream); /* a queued copy back may still read the staging buffer */
    cudaFreeHost(s->pinned);
    moe_comm_destroy(s->inner);
    free(s);
    free(c);
}

static const moe_transport_ops staged_ops = {
    .name = "mpi-staged",
    .alltoall_ints = moe__comm_forward_alltoall_ints,
    .alltoallv_rows = staged_alltoallv_rows,
    .alltoallv_host_rows = moe__comm_forward_alltoallv_host_rows,
    .allgatherv_bytes = moe__comm_forward_allgatherv_bytes,
    .allreduce_sum_real = staged_allreduce_real,
    .allreduce_sum_f64 = moe__comm_forward_allreduce_f64,
    .tree_real = staged_tree_real,
    .allreduce_tree_f64 = moe__comm_forward_allreduce_tree_f64,
    .scan_sum_ints = moe__comm_forward_scan_ints,
    .barrier = moe__comm_forward_barrier,
    .copy_payload = staged_copy_payload,
    .post = staged_post,
    .wait = staged_wait,
    .batch = moe__comm_batch_none, /* MPI's posts start at once */
    .destroy = staged_destroy,
};

moe_status moe_comm_create_mpi_staged(moe_gpu *gpu, MPI_Comm comm, const char *label, double timeout_s,
                                      moe_comm **out) {
    if (!gpu || !out || comm == MPI_COMM_NULL) return MOE_ERR_INVALID_ARG;
    moe_comm *c = calloc(1, sizeof *c);
    staged_state *s = calloc(1, sizeof *s);
    if (!c || !s) return free(c), free(s), MOE_ERR_OUT_OF_MEMORY;
    /* last step that can fail: on failure comm is still the caller's, on success it is the inner comm's */
    moe_comm *inner = NULL;
    moe_status st = moe_comm_create_mpi(comm, label, timeout_s, &inner);
    if (st != MOE_OK) return free(c), free(s), st;
    *s = (staged_state){.inner = inner, .gpu = gpu};
    *c = (moe_comm){.ops = &staged_ops, .rank = inner->rank, .size = inner->size, .label = inner->label,
                    .world_rank = inner->world_rank, .timeout_s = inner->timeout_s, .impl = s};
    *out = c;
    return MOE_OK;
}
