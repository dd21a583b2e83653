/* dispatch.c — counts exchange with its consistency check, and the dispatch / combine row exchanges. */
#include "alltoall/dispatch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fail.h"

int moe__dispatch_count_fault = -1;

moe_status moe_dispatch_plan_alloc(moe_dispatch_plan *plan, int ep_size, int num_local_experts) {
    memset(plan, 0, sizeof *plan);
    size_t blocks = (size_t)ep_size * num_local_experts;
    plan->ep_size = ep_size;
    plan->num_local_experts = num_local_experts;
    plan->send_rows = calloc(ep_size, sizeof(int));
    plan->recv_rows = calloc(ep_size, sizeof(int));
    plan->recv_counts = calloc(blocks, sizeof(int));
    plan->expert_offset = calloc(num_local_experts + 1, sizeof(int));
    plan->peer_major_at = calloc(blocks, sizeof(int));
    plan->expert_major_at = calloc(blocks, sizeof(int));
    plan->segment_start = calloc(blocks + 1, sizeof(int));
    if (!plan->send_rows || !plan->recv_rows || !plan->recv_counts || !plan->expert_offset || !plan->peer_major_at ||
        !plan->expert_major_at || !plan->segment_start) {
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
    memset(plan, 0, sizeof *plan);
}

/* Every entry a peer announces differently from the expectation is named in the failure message. */
static moe_status check_counts(const moe_comm *ep, const moe_dispatch_plan *plan, const int *expected,
                               int layer_index) {
    char text[3000];
    size_t at = 0;
    int EL = plan->num_local_experts, bad = 0;
    for (int p = 0; p < plan->ep_size; p++)
        for (int le = 0; le < EL; le++) {
            int got = plan->recv_counts[p * EL + le], want = expected[p * EL + le];
            if (got == want) continue;
            if (bad++ < 8 && at < sizeof text)
                at += (size_t)snprintf(text + at, sizeof text - at, "%sEP rank %d announces %d rows for expert %d, the "
                                       "global routing says %d", bad > 1 ? "; " : "", p, got, ep->rank * EL + le, want);
        }
    if (!bad) return MOE_OK;
    return moe_fail(MOE_ERR_COUNT_MISMATCH, "layer %d: count mismatch on world rank %d (EP rank %d): %s%s", layer_index,
                    ep->world_rank, ep->rank, text, bad > 8 ? "; ..." : "");
}

moe_status moe_dispatch_plan_exchange(moe_comm *ep, const int *num_tokens_per_expert, const int *expected_recv_counts,
                                      int layer_index, moe_dispatch_plan *plan) {
    const int R = plan->ep_size, EL = plan->num_local_experts;
    int *announce = (int *)num_tokens_per_expert, *faulty = NULL;
    if (moe__dispatch_count_fault >= 0) { /* tests only */
        faulty = malloc((size_t)R * EL * sizeof(int));
        if (!faulty) return MOE_ERR_OUT_OF_MEMORY;
        memcpy(faulty, num_tokens_per_expert, (size_t)R * EL * sizeof(int));
        faulty[moe__dispatch_count_fault]++;
        announce = faulty;
    }
    moe_status st = ep->ops->alltoall_ints(ep, announce, plan->recv_counts, EL);
    free(faulty);
    if (st != MOE_OK) return st;
    if (expected_recv_counts && (st = check_counts(ep, plan, expected_recv_counts, layer_index)) != MOE_OK) return st;

    plan->num_send = plan->num_recv = 0;
    for (int p = 0; p < R; p++) {
        plan->send_rows[p] = plan->recv_rows[p] = 0;
        for (int le = 0; le < EL; le++) {
            plan->send_rows[p] += num_tokens_per_expert[p * EL + le];
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
            plan->expert_major_at[p * EL + le] = plan->segment_start[le * R + p] = at;
            at += plan->recv_counts[p * EL + le];
        }
    }
    plan->expert_offset[EL] = plan->segment_start[EL * R] = at;
    return MOE_OK;
}

/* Copies every (peer, expert) block between peer-major and expert-major order. */
static moe_status move_blocks(moe_comm *ep, const moe_dispatch_plan *plan, const void *from, void *to,
                              size_t row_nbytes, int to_expert_major) {
    for (int b = 0; b < plan->ep_size * plan->num_local_experts; b++) {
        size_t pm = plan->peer_major_at[b], em = plan->expert_major_at[b];
        size_t src = to_expert_major ? pm : em, dst = to_expert_major ? em : pm;
        moe_status st = ep->ops->copy_payload(ep, (char *)to + dst * row_nbytes, (const char *)from + src * row_nbytes,
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
        return ep->ops->alltoallv_rows(ep, send, plan->send_rows, expert_rows, plan->recv_rows, row_nbytes);
    moe_status st = ep->ops->alltoallv_rows(ep, send, plan->send_rows, staging, plan->recv_rows, row_nbytes);
    if (st == MOE_OK) st = move_blocks(ep, plan, staging, expert_rows, row_nbytes, 1);
    return st;
}

moe_status moe_combine_rows(moe_comm *ep, const moe_dispatch_plan *plan, const void *expert_rows, size_t row_nbytes,
                            void *staging, void *back) {
    if (reorder_is_identity(plan))
        return ep->ops->alltoallv_rows(ep, expert_rows, plan->recv_rows, back, plan->send_rows, row_nbytes);
    moe_status st = move_blocks(ep, plan, expert_rows, staging, row_nbytes, 0);
    if (st == MOE_OK) st = ep->ops->alltoallv_rows(ep, staging, plan->recv_rows, back, plan->send_rows, row_nbytes);
    return st;
}
