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
    int shards_per_peer;   /* the batch's virtual shards each peer holds (1 when the layer does not split its
                              sums by shard; moe_config.num_shards / world size otherwise)               */
    int *segment_start;    /* [E_local * ep * spp + 1] (spp = shards_per_peer) the blocks listed expert by
                              expert and split by source shard: rows of local expert le from peer p's local
                              shard j start at [(le * ep + p) * spp + j]; the last entry is num_recv.
                              Within an expert that is global shard order (the peers of an EP group hold
                              consecutive shards) */
    int witness_ints;      /* ints of witness per (peer, local expert)                                 */
    int *witness;          /* [ep * E_local * witness_ints] what each peer sent beside its count for each
                              local expert, for the receiver's check (router/capacity.h)               */
    int *packed;           /* [2 * ep * E_local * (1 + witness_ints + spp)] the counts exchange's buffers */
    int num_send, num_recv;
} moe_dispatch_plan;

/* witness_ints: ints each rank sends beside every count (0: none); shards_per_peer: >= 1. */
moe_status moe_dispatch_plan_alloc(moe_dispatch_plan *plan, int ep_size, int num_local_experts, int witness_ints,
                                   int shards_per_peer);
void moe_dispatch_plan_free(moe_dispatch_plan *plan);

/* Exchanges counts with the EP peers (one alltoall of ints) and fills the plan. num_rows_per_expert[E]: the
 * rows this rank sends per global expert (experts are contiguous per rank, so this is also per destination
 * peer). witness[E * plan->witness_ints] (ignored when witness_ints is 0) travels with the counts and lands
 * in plan->witness on the receiving side; what it means is the caller's. rows_per_shard[E * spp] (ignored when
 * spp is 1): how many of the rows for expert e come from this rank's local shard j, at [e * spp + j]; they must
 * add up to num_rows_per_expert[e] (MOE_ERR_COUNT_MISMATCH on the receiver otherwise). */
moe_status moe_dispatch_plan_exchange(moe_comm *ep, const int *num_rows_per_expert, const int *witness,
                                      const int *rows_per_shard, moe_dispatch_plan *plan);

/* send [num_send rows] -> expert_rows [num_recv rows], expert-major; rows of row_nbytes bytes in the
 * transport's payload memory. staging: num_recv rows of scratch. */
moe_status moe_dispatch_rows(moe_comm *ep, const moe_dispatch_plan *plan, const void *send, size_t row_nbytes,
                             void *staging, void *expert_rows);

/* The reverse: expert_rows [num_recv rows] -> back [num_send rows], in the send order. */
moe_status moe_combine_rows(moe_comm *ep, const moe_dispatch_plan *plan, const void *expert_rows, size_t row_nbytes,
                            void *staging, void *back);

#endif
