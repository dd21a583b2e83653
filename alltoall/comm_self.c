/* comm_self.c — the transport of a world of one: every exchange is a local copy, reductions are no-ops (the
 * tree of one rank is its leaf, so the fixed tree's all-reduces and halves are the same no-ops). */
#include <stdlib.h>
#include <string.h>

#include "alltoall/comm_transport.h"

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

static void self_destroy(moe_comm *c) { free(c); }

static const moe_transport_ops self_ops = {
    .name = "self",
    .alltoall_ints = self_alltoall_ints,
    .alltoallv_rows = self_alltoallv_rows,
    .allgatherv_bytes = self_allgatherv_bytes,
    .allreduce_sum_real = self_allreduce_real,
    .allreduce_sum_f64 = self_allreduce_f64,
    .tree_real = moe__comm_tree_one,
    .allreduce_tree_f64 = self_allreduce_f64,
    .scan_sum_ints = self_scan_ints,
    .barrier = self_barrier,
    .copy_payload = moe__comm_copy_host,
    .destroy = self_destroy,
};

moe_status moe_comm_create_self(const char *label, moe_comm **out) {
    return (*out = moe__comm_new(&self_ops, label, 0, 1, 0, 0)) ? MOE_OK : MOE_ERR_OUT_OF_MEMORY;
}
