/* comm_self.c — the transport of a world of one: every exchange is a local copy, reductions are no-ops (the
 * tree of one rank is its leaf, so the fixed tree's all-reduces and halves are the same no-ops); point-to-point
 * messages to itself are matched by tag in posting order (comm_transport.h), which self-gpu shares. */
#include <stdlib.h>
#include <string.h>

#include "alltoall/comm_transport.h"
#include "core/fail.h"

/* ---- point-to-point of a world of one ---- */

typedef struct self_request {
    moe_comm_request base;
    int matched;               /* its bytes have moved: complete */
    struct self_request *next; /* in the queue of unmatched posts while unmatched */
} self_request;

struct moe__self_p2p {
    self_request *head, *tail; /* unmatched posts, in posting order */
};

/* The first unmatched post of the other direction with this tag (MPI's matching rule, one rank). */
static self_request **find_match(moe__self_p2p *q, const moe_comm_request *what) {
    for (self_request **at = &q->head; *at; at = &(*at)->next)
        if ((*at)->base.sending != what->sending && (*at)->base.tag == what->tag) return at;
    return NULL;
}

static void unlink_at(moe__self_p2p *q, self_request **at) {
    self_request *r = *at;
    *at = r->next;
    if (q->tail == r) {
        q->tail = NULL;
        for (self_request *p = q->head; p; p = p->next) q->tail = p;
    }
    r->next = NULL;
}

moe_status moe__self_p2p_post(moe_comm *c, moe__self_p2p **queue, const moe_comm_request *what,
                              moe_comm_request **req) {
    if (!*queue && !(*queue = calloc(1, sizeof **queue))) return MOE_ERR_OUT_OF_MEMORY;
    moe__self_p2p *q = *queue;
    self_request **at = find_match(q, what);
    if (at && (*at)->base.nbytes != what->nbytes) {
        char op[128];
        moe__comm_request_describe(what, op, sizeof op);
        return moe_fail(MOE_ERR_COUNT_MISMATCH, "%s on communicator '%s' (a world of one) meets a %s of %zu bytes",
                        op, c->label, what->sending ? "receive" : "send", (*at)->base.nbytes);
    }
    self_request *r = calloc(1, sizeof *r);
    if (!r) return MOE_ERR_OUT_OF_MEMORY;
    r->base = *what;
    if (at) {
        self_request *match = *at;
        const moe_comm_request *send = what->sending ? what : &match->base, *recv = what->sending ? &match->base : what;
        const moe_status st = c->ops->copy_payload(c, recv->buf, send->buf, what->nbytes);
        if (st != MOE_OK) return free(r), st;
        unlink_at(q, at);
        match->matched = r->matched = 1;
    } else {
        if (q->tail) q->tail->next = r;
        else q->head = r;
        q->tail = r;
    }
    *req = &r->base;
    return MOE_OK;
}

moe_status moe__self_p2p_wait(moe_comm *c, moe__self_p2p **queue, moe_comm_request *req) {
    self_request *r = (self_request *)req;
    if (r->matched) {
        free(r);
        c->completed++;
        return MOE_OK;
    }
    for (self_request **at = &(*queue)->head; *at; at = &(*at)->next)
        if (*at == r) {
            unlink_at(*queue, at);
            break;
        }
    char op[128];
    moe__comm_request_describe(req, op, sizeof op);
    const char *missing = req->sending ? "receive" : "send";
    const int tag = req->tag;
    free(r);
    return moe_fail(MOE_ERR_COMM,
                    "world rank %d: %s on communicator '%s' (a world of one) can never complete: no %s with tag %d "
                    "was posted before this wait (%ld exchanges completed on it before this one)",
                    c->world_rank, op, c->label, missing, tag, c->completed);
}

void moe__self_p2p_free(moe__self_p2p *queue) { free(queue); }

static moe_status self_post(moe_comm *c, const moe_comm_request *what, moe_comm_request **req) {
    return moe__self_p2p_post(c, (moe__self_p2p **)&c->impl, what, req);
}

static moe_status self_wait(moe_comm *c, moe_comm_request *req) {
    return moe__self_p2p_wait(c, (moe__self_p2p **)&c->impl, req);
}

/* ---- the collectives ---- */

static moe_status self_alltoall_ints(moe_comm *c, const int *send, int *recv, int count_per_peer) {
    if (count_per_peer > 0) memmove(recv, send, (size_t)count_per_peer * sizeof(int));
    c->completed++;
    return MOE_OK;
}

static moe_status self_alltoallv_rows(moe_comm *c, const void *send, const int *send_rows, void *recv,
                                      const int *recv_rows, size_t row_nbytes) {
    if (send_rows[0] != recv_rows[0]) return MOE_ERR_COUNT_MISMATCH;
    if (send_rows[0] > 0) memmove(recv, send, (size_t)send_rows[0] * row_nbytes);
    c->completed++;
    return MOE_OK;
}

static moe_status self_allgatherv_bytes(moe_comm *c, const void *send, size_t send_nbytes, void *recv,
                                        const size_t *recv_nbytes) {
    if (recv_nbytes[0] != send_nbytes) return MOE_ERR_COUNT_MISMATCH;
    if (send_nbytes) memmove(recv, send, send_nbytes);
    c->completed++;
    return MOE_OK;
}

static moe_status self_allreduce_real(moe_comm *c, moe_real *buf, size_t count) {
    (void)buf, (void)count;
    c->completed++;
    return MOE_OK;
}

static moe_status self_allreduce_f64(moe_comm *c, double *buf, size_t count) {
    (void)buf, (void)count;
    c->completed++;
    return MOE_OK;
}

static moe_status self_scan_ints(moe_comm *c, const int *in, int *prefix, int *total, int count) {
    for (int i = 0; i < count; i++) total[i] = in[i], prefix[i] = 0; /* in may alias either output */
    c->completed++;
    return MOE_OK;
}

static moe_status self_barrier(moe_comm *c) {
    (void)c;
    return MOE_OK;
}

static void self_destroy(moe_comm *c) {
    moe__self_p2p_free(c->impl);
    free(c);
}

static const moe_transport_ops self_ops = {
    .name = "self",
    .alltoall_ints = self_alltoall_ints,
    .alltoallv_rows = self_alltoallv_rows,
    .alltoallv_host_rows = self_alltoallv_rows, /* payload memory is host memory */
    .allgatherv_bytes = self_allgatherv_bytes,
    .allreduce_sum_real = self_allreduce_real,
    .allreduce_sum_f64 = self_allreduce_f64,
    .tree_real = moe__comm_tree_one,
    .allreduce_tree_f64 = self_allreduce_f64,
    .scan_sum_ints = self_scan_ints,
    .barrier = self_barrier,
    .copy_payload = moe__comm_copy_host,
    .post = self_post,
    .wait = self_wait,
    .batch = moe__comm_batch_none,
    .destroy = self_destroy,
};

moe_status moe_comm_create_self(const char *label, moe_comm **out) {
    return (*out = moe__comm_new(&self_ops, label, 0, 1, 0, 0)) ? MOE_OK : MOE_ERR_OUT_OF_MEMORY;
}
