/* dispatch.c — the counts exchange (with the caller's witness beside each count) and the dispatch /
 * combine row exchanges. */
#include "alltoall/dispatch.h"

#include <stdlib.h>
#include <string.h>

#include "core/fail.h"

moe_status moe_dispatch_plan_alloc(moe_dispatch_plan *plan, int ep_size, int num_local_experts, int witness_ints,
                                   int shards_per_peer) {
    memset(plan, 0, sizeof *plan);
    if (shards_per_peer < 1) return MOE_ERR_INVALID_ARG;
    size_t blocks = (size_t)ep_size * num_local_experts;
    plan->ep_size = ep_size;
    plan->num_local_experts = num_local_experts;
    plan->witness_ints = witness_ints;
    plan->shards_per_peer = shards_per_peer;
    plan->witness = calloc(blocks * witness_ints + 1, sizeof(int));
    /* the counts exchange's send and receive buffers: [count, witness..., rows per shard...] per (peer, local
     * expert); the shard counts travel only when spp > 1 */
    plan->packed = calloc(2 * blocks * (1 + witness_ints + shards_per_peer), sizeof(int));
    plan->send_rows = calloc(ep_size, sizeof(int));
    plan->recv_rows = calloc(ep_size, sizeof(int));
    plan->recv_counts = calloc(blocks, sizeof(int));
    plan->expert_offset = calloc(num_local_experts + 1, sizeof(int));
    plan->peer_major_at = calloc(blocks, sizeof(int));
    plan->expert_major_at = calloc(blocks, sizeof(int));
    plan->segment_start = calloc(blocks * shards_per_peer + 1, sizeof(int));
    if (!plan->send_rows || !plan->recv_rows || !plan->recv_counts || !plan->expert_offset || !plan->peer_major_at ||
        !plan->expert_major_at || !plan->segment_start || !plan->witness || !plan->packed) {
        moe_dispatch_plan_free(plan);
        return MOE_ERR_OUT_OF_MEMORY;
    }
    return MOE_OK;
}

void moe_dispatch_plan_free(moe_dispatch_plan *plan) {
    free(plan->send_rows);
    free(plan->recv_rows);
    free(plan->recv_counts);
    free(plan->expert_offset);
    free(plan->peer_major_at);
    free(plan->expert_major_at);
    free(plan->segment_start);
    free(plan->witness);
    free(plan->packed);
    memset(plan, 0, sizeof *plan);
}

/* The received rows of each (peer, local expert) block, split by the peer's local shards, into segment_start
 * (recv: the exchange's received [count, witness..., rows per shard...] entries). */
static moe_status fill_segments(moe_dispatch_plan *plan, const int *recv, int stride) {
    const int R = plan->ep_size, EL = plan->num_local_experts, spp = plan->shards_per_peer;
    int at = 0;
    for (int le = 0; le < EL; le++)
        for (int p = 0; p < R; p++) {
            const int b = p * EL + le, *shard_rows = recv + (size_t)b * stride + 1 + plan->witness_ints;
            int sum = 0;
            for (int j = 0; j < spp; j++) {
                plan->segment_start[(le * R + p) * spp + j] = at;
                const int rows = spp == 1 ? plan->recv_counts[b] : shard_rows[j];
                at += rows, sum += rows;
            }
            if (sum != plan->recv_counts[b])
                return moe_fail(MOE_ERR_COUNT_MISMATCH, "EP peer %d announced %d rows for local expert %d but %d "
                                "over its %d shards", p, plan->recv_counts[b], le, sum, spp);
        }
    plan->segment_start[EL * R * spp] = at;
    return MOE_OK;
}

moe_status moe_dispatch_plan_exchange(moe_comm *ep, const int *num_rows_per_expert, const int *witness,
                                      const int *rows_per_shard, moe_dispatch_plan *plan) {
    const int R = plan->ep_size, EL = plan->num_local_experts, wi = plan->witness_ints, spp = plan->shards_per_peer;
    const int stride = 1 + wi + (spp > 1 ? spp : 0);
    const size_t entries = (size_t)R * EL;
    int *send = plan->packed, *recv = plan->packed + entries * stride;
    for (size_t e = 0; e < entries; e++) {
        send[e * stride] = num_rows_per_expert[e];
        if (wi) memcpy(send + e * stride + 1, witness + e * wi, (size_t)wi * sizeof(int));
        if (spp > 1) memcpy(send + e * stride + 1 + wi, rows_per_shard + e * spp, (size_t)spp * sizeof(int));
    }
    MOE_TRY(moe_comm_alltoall_ints(ep, send, recv, EL * stride));
    for (size_t e = 0; e < entries; e++) {
        plan->recv_counts[e] = recv[e * stride];
        if (wi) memcpy(plan->witness + e * wi, recv + e * stride + 1, (size_t)wi * sizeof(int));
    }

    plan->num_send = plan->num_recv = 0;
    for (int p = 0; p < R; p++) {
        plan->send_rows[p] = plan->recv_rows[p] = 0;
        for (int le = 0; le < EL; le++) {
            plan->send_rows[p] += num_rows_per_expert[p * EL + le];
            plan->peer_major_at[p * EL + le] = plan->num_recv + plan->recv_rows[p];
            plan->recv_rows[p] += plan->recv_counts[p * EL + le];
        }
        plan->num_send += plan->send_rows[p];
        plan->num_recv += plan->recv_rows[p];
    }
    int at = 0;
    for (int le = 0; le < EL; le++) {
        plan->expert_offset[le] = at;
        for (int p = 0; p < R; p++) {
            plan->expert_major_at[p * EL + le] = at;
            at += plan->recv_counts[p * EL + le];
        }
    }
    plan->expert_offset[EL] = at;
    return fill_segments(plan, recv, stride);
}

/* Copies every (peer, expert) block between peer-major and expert-major order. */
static moe_status move_blocks(moe_comm *ep, const moe_dispatch_plan *plan, const void *from, void *to,
                              size_t row_nbytes, int to_expert_major) {
    for (int b = 0; b < plan->ep_size * plan->num_local_experts; b++) {
        size_t pm = plan->peer_major_at[b], em = plan->expert_major_at[b];
        size_t src = to_expert_major ? pm : em, dst = to_expert_major ? em : pm;
        moe_status st = moe_comm_copy_payload(ep, (char *)to + dst * row_nbytes, (const char *)from + src * row_nbytes,
                                              plan->recv_counts[b] * row_nbytes);
        if (st != MOE_OK) return st;
    }
    return MOE_OK;
}

/* With one EP rank, or one local expert, peer-major order is expert-major order. */
static int reorder_is_identity(const moe_dispatch_plan *plan) {
    return plan->ep_size == 1 || plan->num_local_experts == 1;
}

moe_status moe_dispatch_rows(moe_comm *ep, const moe_dispatch_plan *plan, const void *send, size_t row_nbytes,
                             void *staging, void *expert_rows) {
    if (reorder_is_identity(plan)) /* one exchange straight into place */
        return moe_comm_alltoallv_rows(ep, send, plan->send_rows, expert_rows, plan->recv_rows, row_nbytes);
    moe_status st = moe_comm_alltoallv_rows(ep, send, plan->send_rows, staging, plan->recv_rows, row_nbytes);
    if (st == MOE_OK) st = move_blocks(ep, plan, staging, expert_rows, row_nbytes, 1);
    return st;
}

moe_status moe_combine_rows(moe_comm *ep, const moe_dispatch_plan *plan, const void *expert_rows, size_t row_nbytes,
                            void *staging, void *back) {
    if (reorder_is_identity(plan))
        return moe_comm_alltoallv_rows(ep, expert_rows, plan->recv_rows, back, plan->send_rows, row_nbytes);
    moe_status st = move_blocks(ep, plan, expert_rows, staging, row_nbytes, 0);
    if (st == MOE_OK) st = moe_comm_alltoallv_rows(ep, staging, plan->recv_rows, back, plan->send_rows, row_nbytes);
    return st;
}
