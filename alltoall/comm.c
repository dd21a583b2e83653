/* comm.c — the communicator's functions (comm.h): each forwards to its transport's table, timing the
 * exchange when asked (comm_timing.h); what every transport shares. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "alltoall/comm_transport.h"
#include "alltoall/tree_allreduce.h"
#include "core/fail.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Runs `call` (a moe_status expression) and, when c is timed, adds its wall time under `kind`. */
#define TIMED(c, kind, call)                                                                                 \
    do {                                                                                                     \
        if (!(c)->times) return (call);                                                                      \
        const double start_ = now_s();                                                                       \
        const moe_status st_ = (call);                                                                       \
        (c)->times->seconds[kind] += now_s() - start_;                                                       \
        (c)->times->calls[kind]++;                                                                           \
        return st_;                                                                                          \
    } while (0)

int moe_comm_rank(const moe_comm *c) { return c->rank; }
int moe_comm_size(const moe_comm *c) { return c->size; }
const char *moe_comm_transport_name(const moe_comm *c) { return c->ops->name; }
double moe_comm_timeout(const moe_comm *c) { return c->timeout_s; }
void moe_comm_set_timeout(moe_comm *c, double seconds) { c->timeout_s = seconds; }

moe_status moe_comm_alltoall_ints(moe_comm *c, const int *send, int *recv, int count_per_peer) {
    TIMED(c, MOE_EXCHANGE_COUNTS, c->ops->alltoall_ints(c, send, recv, count_per_peer));
}

moe_status moe_comm_alltoallv_rows(moe_comm *c, const void *send, const int *send_rows, void *recv,
                                   const int *recv_rows, size_t row_nbytes) {
    TIMED(c, MOE_EXCHANGE_PAYLOAD, c->ops->alltoallv_rows(c, send, send_rows, recv, recv_rows, row_nbytes));
}

moe_status moe_comm_alltoallv_host_rows(moe_comm *c, const void *send, const int *send_rows, void *recv,
                                        const int *recv_rows, size_t row_nbytes) {
    TIMED(c, MOE_EXCHANGE_ROUTING, c->ops->alltoallv_host_rows(c, send, send_rows, recv, recv_rows, row_nbytes));
}

moe_status moe_comm_allgatherv_bytes(moe_comm *c, const void *send, size_t send_nbytes, void *recv,
                                     const size_t *recv_nbytes) {
    TIMED(c, MOE_EXCHANGE_ROUTING, c->ops->allgatherv_bytes(c, send, send_nbytes, recv, recv_nbytes));
}

moe_status moe_comm_allgather_bytes(moe_comm *c, const void *send, size_t nbytes, void *recv) {
    const int W = moe_comm_size(c);
    size_t *each = malloc((size_t)W * sizeof *each);
    if (!each) return MOE_ERR_OUT_OF_MEMORY;
    for (int p = 0; p < W; p++) each[p] = nbytes;
    const moe_status st = moe_comm_allgatherv_bytes(c, send, nbytes, recv, each);
    free(each);
    return st;
}

moe_status moe_comm_allreduce_sum_real(moe_comm *c, moe_real *buf, size_t count) {
    TIMED(c, MOE_EXCHANGE_ALLREDUCE, c->ops->allreduce_sum_real(c, buf, count));
}

moe_status moe_comm_allreduce_sum_f64(moe_comm *c, double *buf, size_t count) {
    TIMED(c, MOE_EXCHANGE_ALLREDUCE, c->ops->allreduce_sum_f64(c, buf, count));
}

/* The tree over ranks needs whole subtrees: refused locally, so every rank refuses alike and none waits. */
static moe_status check_tree_world(const moe_comm *c, const char *op) {
    if (c->size & (c->size - 1))
        return moe_fail(MOE_ERR_INVALID_CONFIG,
                        "world rank %d: the %s on communicator '%s' needs a power-of-two number of ranks, and it has "
                        "%d: run on 1, 2, 4, 8, ... ranks",
                        c->world_rank, op, c->label, c->size);
    return MOE_OK;
}

moe_status moe__comm_tree_real(moe_comm *c, moe_real *buf, const moe__tree_job *job) {
    MOE_TRY(check_tree_world(c, moe__tree_job_name(job)));
    MOE_TRY(moe__tree_job_check(c, job));
    TIMED(c, MOE_EXCHANGE_ALLREDUCE, c->ops->tree_real(c, buf, job));
}

moe_status moe_comm_allreduce_tree_real(moe_comm *c, moe_real *buf, size_t count) {
    const moe__tree_job job = moe__tree_job_allreduce(c, count, sizeof *buf);
    return moe__comm_tree_real(c, buf, &job);
}

/* One half of the fixed tree on the window [from, from + n) of p's region. */
static moe_status tree_half(moe_comm *c, moe_real *buf, const moe_tree_partition *p, size_t from, size_t n,
                            moe__tree_phases phase) {
    const moe__tree_job job = {.phases = phase, .algo = MOE_TREE_HALVING_DOUBLING,
                               .part = p ? *p : (moe_tree_partition){0}, .from = from, .n = n};
    if (!p)
        return moe_fail(MOE_ERR_INVALID_ARG, "world rank %d: %s on communicator '%s' without a partition",
                        c->world_rank, moe__tree_job_name(&job), c->label);
    return moe__comm_tree_real(c, buf, &job);
}

moe_status moe_comm_reduce_scatter_tree_real(moe_comm *c, moe_real *buf, const moe_tree_partition *p, size_t from,
                                             size_t n) {
    return tree_half(c, buf, p, from, n, MOE__TREE_REDUCE_SCATTER);
}

moe_status moe_comm_allgather_tree_real(moe_comm *c, moe_real *buf, const moe_tree_partition *p, size_t from,
                                        size_t n) {
    return tree_half(c, buf, p, from, n, MOE__TREE_ALLGATHER);
}

moe_status moe_comm_allreduce_tree_f64(moe_comm *c, double *buf, size_t count) {
    MOE_TRY(check_tree_world(c, "fixed-tree all-reduce"));
    TIMED(c, MOE_EXCHANGE_ALLREDUCE, c->ops->allreduce_tree_f64(c, buf, count));
}

void moe_comm_set_tree_algorithm(moe_comm *c, moe_tree_algorithm algo) { c->tree_algorithm = algo; }

moe_status moe_comm_scan_sum_ints(moe_comm *c, const int *in, int *prefix, int *total, int count) {
    TIMED(c, MOE_EXCHANGE_ROUTING, c->ops->scan_sum_ints(c, in, prefix, total, count));
}

moe_status moe_comm_barrier(moe_comm *c) { TIMED(c, MOE_EXCHANGE_BARRIER, c->ops->barrier(c)); }

moe_status moe_comm_copy_payload(moe_comm *c, void *dst, const void *src, size_t nbytes) {
    return c->ops->copy_payload(c, dst, src, nbytes);
}

/* ---- point-to-point (comm.h): checks here, the exchange in the transport ---- */

void moe__comm_request_describe(const moe_comm_request *r, char *out, size_t n) {
    snprintf(out, n, "%s of %zu bytes %s rank %d with tag %d", r->sending ? "send" : "receive", r->nbytes,
             r->sending ? "to" : "from", r->peer, r->tag);
}

static moe_status post(moe_comm *c, const moe_comm_request *what, moe_comm_request **req) {
    if (req) *req = NULL;
    const char *problem = !req                                       ? "no place for its request (req is NULL)"
                          : what->peer < 0 || what->peer >= c->size ? "the peer is not a rank of the communicator"
                          : what->tag < 0 || what->tag > MOE_COMM_MAX_TAG ? "the tag is outside 0 .. MOE_COMM_MAX_TAG"
                          : !what->buf && what->nbytes                    ? "its buffer is NULL"
                                                                          : NULL;
    if (problem) {
        char op[128];
        moe__comm_request_describe(what, op, sizeof op);
        return moe_fail(MOE_ERR_INVALID_ARG, "world rank %d: %s on communicator '%s' (%d ranks): %s", c->world_rank,
                        op, c->label, c->size, problem);
    }
    return c->ops->post(c, what, req);
}

moe_status moe_comm_isend_bytes(moe_comm *c, const void *buf, size_t nbytes, int peer, int tag,
                                moe_comm_request **req) {
    /* the transports only read a send's buffer: the cast gives the request one buffer field for both directions */
    const moe_comm_request what = {.comm = c, .sending = 1, .peer = peer, .tag = tag, .nbytes = nbytes,
                                   .buf = (void *)buf};
    return post(c, &what, req);
}

moe_status moe_comm_irecv_bytes(moe_comm *c, void *buf, size_t nbytes, int peer, int tag, moe_comm_request **req) {
    const moe_comm_request what = {.comm = c, .peer = peer, .tag = tag, .nbytes = nbytes, .buf = buf};
    return post(c, &what, req);
}

moe_status moe_comm_wait(moe_comm *c, moe_comm_request *req) {
    if (!req || req->comm != c || c->in_batch)
        return moe_fail(MOE_ERR_INVALID_ARG, "world rank %d: a wait on communicator '%s' %s", c->world_rank, c->label,
                        !req ? "for no request (NULL)"
                        : req->comm != c ? "for a request posted on another communicator"
                                         : "inside a batch of posts (end the batch first)");
    TIMED(c, MOE_EXCHANGE_P2P, c->ops->wait(c, req));
}

moe_status moe_comm_wait_all(moe_comm *c, moe_comm_request **reqs, int count) {
    for (int i = 0; i < count; i++) {
        if (!reqs[i]) continue;
        moe_comm_request *r = reqs[i];
        reqs[i] = NULL; /* freed by the wait, whatever its outcome */
        MOE_TRY(moe_comm_wait(c, r));
    }
    return MOE_OK;
}

static moe_status batch(moe_comm *c, int begin) {
    if (c->in_batch == begin)
        return moe_fail(MOE_ERR_INVALID_ARG, "world rank %d: communicator '%s': %s", c->world_rank, c->label,
                        begin ? "a batch of posts begun inside another" : "a batch of posts ended without a begin");
    const moe_status st = c->ops->batch(c, begin);
    if (st == MOE_OK || !begin) c->in_batch = begin; /* an end that failed still closed the batch */
    return st;
}

moe_status moe_comm_batch_begin(moe_comm *c) { return batch(c, 1); }
moe_status moe_comm_batch_end(moe_comm *c) { return batch(c, 0); }

moe_status moe__comm_batch_none(moe_comm *c, int begin) {
    (void)c, (void)begin;
    return MOE_OK;
}

moe_status moe_comm_allgather_payload(moe_comm *c, const void *send, size_t nbytes, void *recv) {
    char *out = recv;
    MOE_TRY(moe_comm_copy_payload(c, out + (size_t)c->rank * nbytes, send, nbytes));
    if (c->size == 1) return MOE_OK;
    const int n = 2 * (c->size - 1);
    moe_comm_request **reqs = calloc((size_t)n, sizeof *reqs);
    if (!reqs) return MOE_ERR_OUT_OF_MEMORY;
    moe_status st = moe_comm_batch_begin(c);
    int posted = 0;
    for (int k = 1; k < c->size && st == MOE_OK; k++) { /* ring order: from rank - k, to rank + k */
        const int to = (c->rank + k) % c->size, from = (c->rank - k + c->size) % c->size;
        moe_comm_request **recv_req = &reqs[posted++], **send_req = &reqs[posted++]; /* NULL unless posted */
        st = moe_comm_irecv_bytes(c, out + (size_t)from * nbytes, nbytes, from, MOE_COMM_ALLGATHER_TAG, recv_req);
        if (st == MOE_OK) st = moe_comm_isend_bytes(c, send, nbytes, to, MOE_COMM_ALLGATHER_TAG, send_req);
    }
    const moe_status ended = moe_comm_batch_end(c);
    if (st == MOE_OK) st = ended;
    if (st == MOE_OK) st = moe_comm_wait_all(c, reqs, posted);
    free(reqs); /* after a failure the requests still posted are abandoned (comm.h): the job ends */
    return st;
}

void moe_comm_destroy(moe_comm *c) {
    if (c) c->ops->destroy(c);
}

moe_status moe_comm_agree(moe_comm *c, moe_status mine) {
    double failures = mine != MOE_OK;
    MOE_TRY(moe_comm_allreduce_sum_f64(c, &failures, 1));
    if (mine != MOE_OK) return mine;
    return failures > 0 ? moe_fail(MOE_ERR_PEER, "another rank failed (see its message)") : MOE_OK;
}

void moe_comm_time_exchanges(moe_comm *c, moe_exchange_times *times) { c->times = times; }

const char *moe_exchange_kind_name(moe_exchange_kind kind) {
    static const char *const names[MOE_EXCHANGE_KINDS] = {"payload", "counts", "routing", "allreduce", "barrier",
                                                                    "p2p"};
    return kind >= 0 && kind < MOE_EXCHANGE_KINDS ? names[kind] : "unknown";
}

moe_comm *moe__comm_new(const moe_transport_ops *ops, const char *label, int rank, int size, int world_rank,
                        double timeout_s) {
    moe_comm *c = calloc(1, sizeof *c);
    if (c) *c = (moe_comm){.ops = ops, .rank = rank, .size = size, .label = label, .world_rank = world_rank,
                           .timeout_s = timeout_s};
    return c;
}

moe_status moe__comm_tree_one(moe_comm *c, moe_real *buf, const moe__tree_job *job) {
    (void)buf, (void)job;
    c->completed++;
    return MOE_OK;
}

moe_status moe__comm_copy_host(moe_comm *c, void *dst, const void *src, size_t nbytes) {
    (void)c;
    if (nbytes) memmove(dst, src, nbytes); /* empty blocks may come with NULL pointers */
    return MOE_OK;
}
