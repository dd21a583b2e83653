/* comm_forward.h — the control entries of a transport that wraps another (the GPU transports wrap self or
 * MPI for counts, routing and losses): each is forwarded to the inner transport, whose pointer must be the
 * FIRST member of the wrapper's impl state. The wrapper's `completed` is the count callers see; it is
 * lent to the inner comm for the call (so the inner transport's messages print it) and taken back. */
#ifndef MOE_ALLTOALL_COMM_FORWARD_H
#define MOE_ALLTOALL_COMM_FORWARD_H

#include "alltoall/comm_transport.h"

/* The inner comm, with the wrapper's counters lent to it; pair with moe__comm_forward_leave. */
moe_comm *moe__comm_forward_enter(moe_comm *c);
moe_status moe__comm_forward_leave(moe_comm *c, moe_status st);

moe_status moe__comm_forward_alltoall_ints(moe_comm *c, const int *send, int *recv, int count_per_peer);
moe_status moe__comm_forward_alltoallv_host_rows(moe_comm *c, const void *send, const int *send_rows, void *recv,
                                                const int *recv_rows, size_t row_nbytes);
moe_status moe__comm_forward_allgatherv_bytes(moe_comm *c, const void *send, size_t send_nbytes, void *recv,
                                             const size_t *recv_nbytes);
moe_status moe__comm_forward_allreduce_f64(moe_comm *c, double *buf, size_t count);
moe_status moe__comm_forward_allreduce_tree_f64(moe_comm *c, double *buf, size_t count);
moe_status moe__comm_forward_scan_ints(moe_comm *c, const int *in, int *prefix, int *total, int count);
moe_status moe__comm_forward_barrier(moe_comm *c);

#endif
