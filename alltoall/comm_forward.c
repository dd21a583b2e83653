/* comm_forward.c — control entries forwarded to an inner transport (comm_forward.h). */
#include "alltoall/comm_forward.h"

static moe_comm *inner_of(const moe_comm *c) { return *(moe_comm *const *)c->impl; }

moe_comm *moe__comm_forward_enter(moe_comm *c) {
    moe_comm *in = inner_of(c);
    in->completed = c->completed;
    in->timeout_s = c->timeout_s;
    in->tree_algorithm = c->tree_algorithm;
    in->tree_piece_nbytes = c->tree_piece_nbytes;
    return in;
}

moe_status moe__comm_forward_leave(moe_comm *c, moe_status st) {
    c->completed = inner_of(c)->completed;
    return st;
}

moe_status moe__comm_forward_alltoall_ints(moe_comm *c, const int *send, int *recv, int count_per_peer) {
    moe_comm *in = moe__comm_forward_enter(c);
    return moe__comm_forward_leave(c, moe_comm_alltoall_ints(in, send, recv, count_per_peer));
}

moe_status moe__comm_forward_alltoallv_host_rows(moe_comm *c, const void *send, const int *send_rows, void *recv,
                                                const int *recv_rows, size_t row_nbytes) {
    moe_comm *in = moe__comm_forward_enter(c);
    return moe__comm_forward_leave(c, moe_comm_alltoallv_host_rows(in, send, send_rows, recv, recv_rows, row_nbytes));
}

moe_status moe__comm_forward_allgatherv_bytes(moe_comm *c, const void *send, size_t send_nbytes, void *recv,
                                             const size_t *recv_nbytes) {
    moe_comm *in = moe__comm_forward_enter(c);
    return moe__comm_forward_leave(c, moe_comm_allgatherv_bytes(in, send, send_nbytes, recv, recv_nbytes));
}

moe_status moe__comm_forward_allreduce_f64(moe_comm *c, double *buf, size_t count) {
    moe_comm *in = moe__comm_forward_enter(c);
    return moe__comm_forward_leave(c, moe_comm_allreduce_sum_f64(in, buf, count));
}

moe_status moe__comm_forward_allreduce_tree_f64(moe_comm *c, double *buf, size_t count) {
    moe_comm *in = moe__comm_forward_enter(c);
    return moe__comm_forward_leave(c, moe_comm_allreduce_tree_f64(in, buf, count));
}

moe_status moe__comm_forward_scan_ints(moe_comm *c, const int *in, int *prefix, int *total, int count) {
    moe_comm *in_comm = moe__comm_forward_enter(c);
    return moe__comm_forward_leave(c, moe_comm_scan_sum_ints(in_comm, in, prefix, total, count));
}

moe_status moe__comm_forward_barrier(moe_comm *c) {
    moe_comm *in = moe__comm_forward_enter(c);
    return moe__comm_forward_leave(c, moe_comm_barrier(in));
}
