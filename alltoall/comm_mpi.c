/* comm_mpi.c — the MPI transport: every collective (and every round of the fixed tree's all-reduce and halves, a pair
 * of MPI_Irecv / MPI_Isend) is started non-blocking and polled, so a peer that never arrives turns into
 * MOE_ERR_TIMEOUT with a message naming the operation and the missing peers (comm_mpi_probe.h), instead of a
 * silent hang (nccl-tests' watchdog, in MPI terms). Point-to-point sends and receives (comm.h) are MPI_Isend /
 * MPI_Irecv, polled the same way when waited on. */
#include "alltoall/comm_mpi.h"
#include "alltoall/comm_mpi_probe.h"
#include "alltoall/comm_transport.h"
#include "alltoall/tree_add.h"
#include "alltoall/tree_allreduce.h"
#include "alltoall/wait_policy.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/fail.h"

#ifdef MOE_REAL_IS_DOUBLE
#define MOE_MPI_REAL MPI_DOUBLE
#else
#define MOE_MPI_REAL MPI_FLOAT
#endif

typedef struct {
    MPI_Comm comm;
    moe_mpi_probe *probe; /* the watchdog's twin: who is missing */
    void *tree_scratch;   /* the fixed tree's: moe__tree_scratch_count values, grown on demand */
    size_t tree_scratch_nbytes;
    moe_wait_policy wait; /* between polls: yield, or sleep (MOE_WAIT_POLICY=passive, wait_policy.h) */
} mpi_state;

/* TAG_ROWS: the row exchange's messages; TAG_TREE: the fixed tree's (collectives never match either); a caller's tag t
 * travels as TAG_P2P + t, so that none of these match each other */
enum { PROBE_MESSAGE_NBYTES = 4096, TAG_ROWS = 14, TAG_TREE = 15, TAG_P2P = 16 };
static const double kAnswerAfterS = 0.05; /* a wait this long answers the watchdog questions of other ranks */

static MPI_Comm comm_of(const moe_comm *c) { return ((const mpi_state *)c->impl)->comm; }

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static moe_status mpi_failed(const moe_comm *c, const char *op, int rc) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    return moe_fail(MOE_ERR_COMM, "world rank %d: %s on communicator '%s' (rank %d of %d) failed: %s", c->world_rank,
                    op, c->label, c->rank, c->size, text);
}

/* Polls the requests until all complete or the watchdog expires, `start` being when the exchange began (not yet
 * counted as a completed exchange: the fixed tree waits for several rounds of one exchange). Open MPI moves
 * data only inside MPI calls, so the loop keeps calling MPI_Test, yielding the CPU between polls, or sleeping with
 * MOE_WAIT_POLICY=passive (wait_policy.h: sleeping makes 2-rank exchanges of 1 MiB and more 1.5-3x slower on free
 * cores). */
static moe_status poll_all(moe_comm *c, int count, MPI_Request *req, const char *op, double start,
                           MPI_Status *statuses) {
    for (long polls = 0;; polls++) {
        int done = 0, rc = MPI_Testall(count, req, &done, statuses);
        if (rc == MPI_ERR_IN_STATUS && statuses != MPI_STATUSES_IGNORE)
            for (int i = 0; i < count; i++)
                if (statuses[i].MPI_ERROR != MPI_SUCCESS) rc = statuses[i].MPI_ERROR; /* what went wrong */
        if (rc != MPI_SUCCESS) return mpi_failed(c, op, rc);
        if (done) return MOE_OK;
        const double waited = now_s() - start;
        if (waited > kAnswerAfterS) moe__mpi_probe_answer(c, op);
        if (c->timeout_s > 0 && waited > c->timeout_s) {
            /* the answers come within milliseconds from ranks that wait; a short window is enough */
            const double window_s = c->timeout_s / 4 < 2 ? c->timeout_s / 4 : 2;
            char missing[PROBE_MESSAGE_NBYTES];
            moe__mpi_probe_ask(((mpi_state *)c->impl)->probe, c, window_s, missing, sizeof missing);
            return moe_fail(MOE_ERR_TIMEOUT,
                            "world rank %d: watchdog: %s on communicator '%s' (rank %d of %d) still incomplete after "
                            "%.1f s; %ld exchanges completed on it before this one; %s",
                            c->world_rank, op, c->label, c->rank, c->size, c->timeout_s, c->completed, missing);
        }
        moe_wait_pause(((const mpi_state *)c->impl)->wait, polls, waited);
    }
}

/* poll_all, then one exchange more completed */
static moe_status wait_all(moe_comm *c, int count, MPI_Request *req, const char *op) {
    MOE_TRY(poll_all(c, count, req, op, now_s(), MPI_STATUSES_IGNORE));
    c->completed++;
    return MOE_OK;
}

static moe_status wait_for(moe_comm *c, MPI_Request *req, const char *op) { return wait_all(c, 1, req, op); }

static moe_status mpi_alltoall_ints(moe_comm *c, const int *send, int *recv, int count_per_peer) {
    MPI_Request req;
    int rc = MPI_Ialltoall(send, count_per_peer, MPI_INT, recv, count_per_peer, MPI_INT, comm_of(c), &req);
    return rc == MPI_SUCCESS ? wait_for(c, &req, "alltoall of counts") : mpi_failed(c, "MPI_Ialltoall", rc);
}

/* The row exchange as point-to-point messages: every receive posted first, then the sends (to the next ranks first,
 * so that not every rank sends to rank 0 at once), this rank's own rows copied, all polled together. Within 1.06x
 * of the blocking MPI_Alltoallv at every size from 64 KiB on 2 and 4 ranks; Open MPI's MPI_Ialltoallv (libnbc),
 * used before, was 1.06-1.08x at 64-128 KiB on 4 ranks (docs/BENCHMARKS.md, issue 29). */
static moe_status mpi_alltoallv_rows(moe_comm *c, const void *send, const int *send_rows, void *recv,
                                     const int *recv_rows, size_t row_nbytes) {
    if (row_nbytes > INT_MAX) return MOE_ERR_INVALID_ARG;
    const int n = c->size, me = c->rank;
    size_t *sdispl = malloc(2 * (size_t)n * sizeof(size_t)), *rdispl = sdispl + n;
    MPI_Request *req = malloc(2 * (size_t)n * sizeof *req);
    if (!sdispl || !req) {
        free(sdispl), free(req);
        return MOE_ERR_OUT_OF_MEMORY;
    }
    size_t s = 0, r = 0;
    for (int p = 0; p < n; p++) {
        sdispl[p] = s, rdispl[p] = r;
        s += (size_t)send_rows[p] * row_nbytes, r += (size_t)recv_rows[p] * row_nbytes;
    }
    moe_status st = MOE_OK;
    MPI_Datatype row;
    int posted = 0;
    if (recv_rows[me] != send_rows[me])
        st = moe_fail(MOE_ERR_INVALID_ARG, "world rank %d: alltoallv of rows on '%s': %d rows to itself but %d "
                      "expected from itself", c->world_rank, c->label, send_rows[me], recv_rows[me]);
    else if (MPI_Type_contiguous((int)row_nbytes, MPI_BYTE, &row) != MPI_SUCCESS ||
             MPI_Type_commit(&row) != MPI_SUCCESS)
        st = mpi_failed(c, "MPI_Type_contiguous", MPI_ERR_TYPE);
    else {
        for (int i = 1; i < n && st == MOE_OK; i++) {
            const int p = (me - i + n) % n; /* the ranks that send to this one first */
            if (recv_rows[p] == 0) continue;
            int rc = MPI_Irecv((char *)recv + rdispl[p], recv_rows[p], row, p, TAG_ROWS, comm_of(c), &req[posted]);
            if (rc == MPI_SUCCESS) posted++;
            else st = mpi_failed(c, "MPI_Irecv", rc);
        }
        for (int i = 1; i < n && st == MOE_OK; i++) {
            const int p = (me + i) % n;
            if (send_rows[p] == 0) continue;
            int rc = MPI_Isend((const char *)send + sdispl[p], send_rows[p], row, p, TAG_ROWS, comm_of(c),
                               &req[posted]);
            if (rc == MPI_SUCCESS) posted++;
            else st = mpi_failed(c, "MPI_Isend", rc);
        }
        if (st == MOE_OK && send_rows[me])
            memcpy((char *)recv + rdispl[me], (const char *)send + sdispl[me], (size_t)send_rows[me] * row_nbytes);
        if (st == MOE_OK) st = wait_all(c, posted, req, "alltoallv of rows"); /* else the job ends: requests left */
        MPI_Type_free(&row);
    }
    free(sdispl), free(req);
    return st;
}

static moe_status mpi_allgatherv_bytes(moe_comm *c, const void *send, size_t send_nbytes, void *recv,
                                       const size_t *recv_nbytes) {
    int n = c->size, *counts = malloc(2 * (size_t)n * sizeof(int)), *displ = counts + n;
    if (!counts) return MOE_ERR_OUT_OF_MEMORY;
    size_t total = 0;
    for (int p = 0; p < n; p++) {
        counts[p] = (int)recv_nbytes[p], displ[p] = (int)total;
        total += recv_nbytes[p];
    }
    moe_status st;
    MPI_Request req;
    if (total > INT_MAX || send_nbytes != recv_nbytes[c->rank]) st = MOE_ERR_INVALID_ARG;
    else {
        int rc = MPI_Iallgatherv(send, (int)send_nbytes, MPI_BYTE, recv, counts, displ, MPI_BYTE, comm_of(c), &req);
        st = rc == MPI_SUCCESS ? wait_for(c, &req, "allgather") : mpi_failed(c, "MPI_Iallgatherv", rc);
    }
    free(counts);
    return st;
}

static moe_status allreduce(moe_comm *c, void *buf, size_t count, MPI_Datatype type) {
    if (count > INT_MAX) return MOE_ERR_INVALID_ARG;
    MPI_Request req;
    int rc = MPI_Iallreduce(MPI_IN_PLACE, buf, (int)count, type, MPI_SUM, comm_of(c), &req);
    return rc == MPI_SUCCESS ? wait_for(c, &req, "allreduce") : mpi_failed(c, "MPI_Iallreduce", rc);
}

static moe_status mpi_allreduce_real(moe_comm *c, moe_real *buf, size_t count) {
    return allreduce(c, buf, count, MOE_MPI_REAL);
}

static moe_status mpi_allreduce_f64(moe_comm *c, double *buf, size_t count) {
    return allreduce(c, buf, count, MPI_DOUBLE);
}

/* ---- the fixed tree (tree_allreduce.h): host buffers, one step at a time ---- */

typedef struct {
    moe_comm *c;
    moe_tree_dtype dtype;
    const char *op; /* the job's name, for messages */
    double start_s; /* the watchdog times the whole job, not each step */
} tree_ctx;

static moe_status tree_sendrecv(void *ctx, const void *send, size_t send_nbytes, void *recv, size_t recv_nbytes,
                                int peer) {
    const tree_ctx *t = ctx;
    moe_comm *c = t->c;
    if (send_nbytes > INT_MAX || recv_nbytes > INT_MAX)
        return moe_fail(MOE_ERR_INVALID_ARG, "%s: a step of %zu bytes is beyond MPI's int counts", t->op,
                        send_nbytes > recv_nbytes ? send_nbytes : recv_nbytes);
    MPI_Request req[2];
    int rc = MPI_Irecv(recv, (int)recv_nbytes, MPI_BYTE, peer, TAG_TREE, comm_of(c), &req[0]);
    if (rc != MPI_SUCCESS) return mpi_failed(c, "MPI_Irecv", rc);
    rc = MPI_Isend(send, (int)send_nbytes, MPI_BYTE, peer, TAG_TREE, comm_of(c), &req[1]);
    if (rc != MPI_SUCCESS) return mpi_failed(c, "MPI_Isend", rc); /* the job ends: req[0] is left */
    return poll_all(c, 2, req, t->op, t->start_s, MPI_STATUSES_IGNORE);
}

static moe_status tree_add(void *ctx, void *y, const void *lower, const void *higher, size_t count) {
    moe_tree_add_cpu(((tree_ctx *)ctx)->dtype, y, lower, higher, count);
    return MOE_OK;
}

static moe_status run_tree(moe_comm *c, void *buf, const moe__tree_job *job, moe_tree_dtype dtype) {
    static const moe__tree_ops ops = {tree_sendrecv, tree_add};
    const size_t elem_nbytes = dtype == MOE_TREE_F64 ? sizeof(double) : sizeof(float);
    mpi_state *s = c->impl;
    const size_t scratch_nbytes = moe__tree_scratch_count(c, job, elem_nbytes) * elem_nbytes;
    if (scratch_nbytes > s->tree_scratch_nbytes) {
        free(s->tree_scratch);
        s->tree_scratch_nbytes = 0;
        if (!(s->tree_scratch = malloc(scratch_nbytes))) return MOE_ERR_OUT_OF_MEMORY;
        s->tree_scratch_nbytes = scratch_nbytes;
    }
    tree_ctx ctx = {.c = c, .dtype = dtype, .op = moe__tree_job_name(job), .start_s = now_s()};
    MOE_TRY(moe__tree_run(&ops, &ctx, c, job, buf, elem_nbytes, s->tree_scratch));
    c->completed++;
    return MOE_OK;
}

static moe_status mpi_tree_real(moe_comm *c, moe_real *buf, const moe__tree_job *job) {
    return run_tree(c, buf, job, MOE_TREE_REAL);
}

static moe_status mpi_allreduce_tree_f64(moe_comm *c, double *buf, size_t count) {
    const moe__tree_job job = moe__tree_job_allreduce(c, count, sizeof *buf);
    return run_tree(c, buf, &job, MOE_TREE_F64);
}

static moe_status mpi_scan_ints(moe_comm *c, const int *in, int *prefix, int *total, int count) {
    MPI_Request req[2];
    int rc = MPI_Iexscan(in, prefix, count, MPI_INT, MPI_SUM, comm_of(c), &req[0]);
    if (rc != MPI_SUCCESS) return mpi_failed(c, "MPI_Iexscan", rc);
    rc = MPI_Iallreduce(in, total, count, MPI_INT, MPI_SUM, comm_of(c), &req[1]);
    if (rc != MPI_SUCCESS) return mpi_failed(c, "MPI_Iallreduce", rc); /* the job ends: req[0] is left */
    MOE_TRY(wait_all(c, 2, req, "scan of counts"));
    if (c->rank == 0) /* MPI leaves rank 0's exclusive scan undefined */
        for (int i = 0; i < count; i++) prefix[i] = 0;
    return MOE_OK;
}

static moe_status mpi_barrier(moe_comm *c) {
    MPI_Request req;
    int rc = MPI_Ibarrier(comm_of(c), &req);
    return rc == MPI_SUCCESS ? wait_for(c, &req, "barrier") : mpi_failed(c, "MPI_Ibarrier", rc);
}

/* ---- point-to-point (comm.h): MPI_Isend / MPI_Irecv, polled under the watchdog at the wait ---- */

typedef struct {
    moe_comm_request base;
    MPI_Request mpi;
} mpi_request;

static moe_status mpi_post(moe_comm *c, const moe_comm_request *what, moe_comm_request **req) {
    if (what->nbytes > INT_MAX)
        return moe_fail(MOE_ERR_INVALID_ARG, "world rank %d: a message of %zu bytes on communicator '%s' is beyond "
                        "MPI's int counts", c->world_rank, what->nbytes, c->label);
    mpi_request *r = malloc(sizeof *r);
    if (!r) return MOE_ERR_OUT_OF_MEMORY;
    r->base = *what;
    const int count = (int)what->nbytes, tag = TAG_P2P + what->tag;
    int rc = what->sending ? MPI_Isend(what->buf, count, MPI_BYTE, what->peer, tag, comm_of(c), &r->mpi)
                           : MPI_Irecv(what->buf, count, MPI_BYTE, what->peer, tag, comm_of(c), &r->mpi);
    if (rc != MPI_SUCCESS) {
        free(r);
        return mpi_failed(c, what->sending ? "MPI_Isend" : "MPI_Irecv", rc);
    }
    *req = &r->base;
    return MOE_OK;
}

/* A receive longer than posted fails in MPI (MPI_ERR_TRUNCATE); a shorter one is caught here. */
static moe_status check_received(const moe_comm *c, const moe_comm_request *req, const char *op, MPI_Status *status) {
    int got = 0;
    int rc = MPI_Get_count(status, MPI_BYTE, &got);
    if (rc != MPI_SUCCESS) return mpi_failed(c, "MPI_Get_count", rc);
    if ((size_t)got == req->nbytes) return MOE_OK;
    return moe_fail(MOE_ERR_COUNT_MISMATCH, "world rank %d: %s on communicator '%s' (rank %d of %d) got %d bytes: the "
                    "sender posted another size", c->world_rank, op, c->label, c->rank, c->size, got);
}

/* The MPI request is left to MPI after a failure (the job ends), as the tree's are. */
static moe_status mpi_wait(moe_comm *c, moe_comm_request *req) {
    mpi_request *r = (mpi_request *)req;
    char op[192], what[128];
    moe__comm_request_describe(req, what, sizeof what);
    snprintf(op, sizeof op, "%s (world rank %d)", what,
             moe__mpi_probe_world_rank(((mpi_state *)c->impl)->probe, req->peer));
    MPI_Status status;
    moe_status st = poll_all(c, 1, &r->mpi, op, now_s(), &status);
    if (st == MOE_OK && !req->sending) st = check_received(c, req, op, &status);
    if (st == MOE_OK) c->completed++;
    free(r);
    return st;
}

static void mpi_destroy(moe_comm *c) {
    mpi_state *s = c->impl;
    moe__mpi_probe_destroy(s->probe);
    MPI_Comm_free(&s->comm);
    free(s->tree_scratch);
    free(s);
    free(c);
}

static const moe_transport_ops mpi_ops = {
    .name = "mpi",
    .alltoall_ints = mpi_alltoall_ints,
    .alltoallv_rows = mpi_alltoallv_rows,
    .alltoallv_host_rows = mpi_alltoallv_rows, /* payload memory is host memory */
    .allgatherv_bytes = mpi_allgatherv_bytes,
    .allreduce_sum_real = mpi_allreduce_real,
    .allreduce_sum_f64 = mpi_allreduce_f64,
    .tree_real = mpi_tree_real,
    .allreduce_tree_f64 = mpi_allreduce_tree_f64,
    .scan_sum_ints = mpi_scan_ints,
    .barrier = mpi_barrier,
    .copy_payload = moe__comm_copy_host,
    .post = mpi_post,
    .wait = mpi_wait,
    .batch = moe__comm_batch_none, /* MPI_Isend and MPI_Irecv start at once */
    .destroy = mpi_destroy,
};

moe_status moe_comm_create_mpi(MPI_Comm comm, const char *label, double timeout_s, moe_comm **out) {
    int world_rank, rank, size;
    if (MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN) != MPI_SUCCESS || MPI_Comm_rank(comm, &rank) != MPI_SUCCESS ||
        MPI_Comm_size(comm, &size) != MPI_SUCCESS || MPI_Comm_rank(MPI_COMM_WORLD, &world_rank) != MPI_SUCCESS)
        return moe_fail(MOE_ERR_COMM, "cannot set up communicator '%s' over MPI", label);
    moe_comm *c = moe__comm_new(&mpi_ops, label, rank, size, world_rank, timeout_s);
    mpi_state *s = calloc(1, sizeof *s);
    if (!c || !s) return free(c), free(s), MOE_ERR_OUT_OF_MEMORY;
    moe_status st = moe_wait_policy_here(&s->wait);
    if (st == MOE_OK) st = moe__mpi_probe_create(comm, &s->probe);
    if (st != MOE_OK) return free(c), free(s), st;
    s->comm = comm;
    c->impl = s;
    *out = c;
    return MOE_OK;
}
