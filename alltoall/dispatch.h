/* dispatch.h — the expert-parallel exchanges of one micro-batch, on one rank (DeepEP's split: the layout
 * comes from router/layout.h, this file only moves rows).
 *
 * Send side (this rank's tokens): the kept assignments in layout order — destination rank, then expert,
 * then token — with send_rows[p] rows for EP peer p.
 * Receive side (this rank's experts): recv_rows[p] rows from each peer p, in peer order and within a peer
 * by local expert, then token ("peer-major"). The experts want them "expert-major": local expert, then
 * peer, then token; since the peers of an EP group hold consecutive slices of the global batch, that is
 * global token order within each expert, whatever ep is. */
#ifndef MOE_ALLTOALL_DISPATCH_H
#define MOE_ALLTOALL_DISPATCH_H

#include "alltoall/comm.h"

typedef struct {
    int ep_size, num_local_experts;
    int *send_rows;        /* [ep]           rows to each peer                                        */
    int *recv_counts;      /* [ep * E_local] rows from peer p for local expert le, at [p * E_local + le] */
    int *recv_rows;        /* [ep]           rows from each peer                                      */
    int *expert_offset;    /* [E_local + 1]  expert-major offsets of the received rows                */
    int *peer_major_at;    /* [ep * E_local] first row of block (p, le) in peer-major order             */
    int *expert_major_at;  /* [ep * E_local] first row of block (p, le) in expert-major order           */
    int *segment_start;    /* [E_local * ep + 1] the same blocks listed expert by expert: rows of local
                              expert le from peer p start at [le * ep + p]; the last entry is num_recv */
    int num_send, num_recv;
} moe_dispatch_plan;

moe_status moe_dispatch_plan_alloc(moe_dispatch_plan *plan, int ep_size, int num_local_experts);
void moe_dispatch_plan_free(moe_dispatch_plan *plan);

/* Exchanges counts with the EP peers and fills the plan. num_tokens_per_expert[E]: this rank's kept rows
 * per global expert (experts are contiguous per rank, so this is also per destination peer).
 * expected_recv_counts[ep * E_local] (NULL: no check) is what this rank must receive according to the
 * global routing; every entry that a peer announces differently is printed (ranks, layer, expert,
 * counts) and the call returns MOE_ERR_COUNT_MISMATCH before any payload moves. */
moe_status moe_dispatch_plan_exchange(moe_comm *ep, const int *num_tokens_per_expert, const int *expected_recv_counts,
                                      int layer_index, moe_dispatch_plan *plan);

/* send [num_send rows] -> expert_rows [num_recv rows], expert-major; rows of row_nbytes bytes in the
 * transport's payload memory. staging: num_recv rows of scratch. */
moe_status moe_dispatch_rows(moe_comm *ep, const moe_dispatch_plan *plan, const void *send, size_t row_nbytes,
                             void *staging, void *expert_rows);

/* The reverse: expert_rows [num_recv rows] -> back [num_send rows], in the send order. */
moe_status moe_combine_rows(moe_comm *ep, const moe_dispatch_plan *plan, const void *expert_rows, size_t row_nbytes,
                            void *staging, void *back);

/* Tests only: when >= 0, this rank announces one row too many for that global expert. */
extern int moe__dispatch_count_fault;

#endif
