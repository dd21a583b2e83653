/* test_routing.c — the tests' whole-batch routing (test_routing.h). */
#include "tests/test_routing.h"

#include <stdlib.h>
#include <string.h>

#include "router/capacity.h"
#include "router/layout.h"

moe_status test_routing_alloc(test_routing *r, int max_tokens, int num_experts, int top_k, int num_ranks) {
    memset(r, 0, sizeof *r);
    const size_t te = (size_t)max_tokens * num_experts, tk = (size_t)max_tokens * top_k;
    r->num_experts = num_experts, r->top_k = top_k, r->num_ranks = num_ranks;
    r->scores = calloc(te + 1, sizeof(moe_real));
    r->expert = calloc(tk + 1, sizeof(int));
    r->expert_score = calloc(tk + 1, sizeof(moe_real));
    r->kept = calloc(tk + 1, 1);
    r->slot = calloc(tk + 1, sizeof(int));
    r->perm_token = calloc(tk + 1, sizeof(int));
    r->num_selected_per_expert = calloc(num_experts, sizeof(int));
    r->num_tokens_per_expert = calloc(num_experts, sizeof(int));
    r->expert_offset = calloc(num_experts + 1, sizeof(int));
    r->num_tokens_per_rank = calloc(num_ranks, sizeof(int));
    if (!r->scores || !r->expert || !r->expert_score || !r->kept || !r->slot || !r->perm_token ||
        !r->num_selected_per_expert || !r->num_tokens_per_expert || !r->expert_offset || !r->num_tokens_per_rank) {
        test_routing_free(r);
        return MOE_ERR_OUT_OF_MEMORY;
    }
    return MOE_OK;
}

void test_routing_free(test_routing *r) {
    void *all[] = {r->scores, r->expert, r->expert_score, r->kept, r->slot, r->perm_token, r->num_selected_per_expert,
                   r->num_tokens_per_expert, r->expert_offset, r->num_tokens_per_rank};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) free(all[i]);
    memset(r, 0, sizeof *r);
}

moe_status test_routing_capacity(test_routing *r, float capacity_factor, moe_drop_priority priority) {
    return moe_router_apply_capacity_cpu(r->expert, r->expert_score, r->num_tokens, r->num_experts, r->top_k,
                                         capacity_factor, priority, r->kept, r->num_selected_per_expert, &r->capacity);
}

void test_routing_layout(test_routing *r) {
    const int E = r->num_experts, R = r->num_ranks;
    moe_router_dispatch_layout_cpu(r->expert, r->kept, r->num_tokens, E, r->top_k, r->slot, r->perm_token,
                                   r->num_tokens_per_expert, r->expert_offset);
    for (int q = 0; q < R; q++)
        r->num_tokens_per_rank[q] = r->expert_offset[(q + 1) * (E / R)] - r->expert_offset[q * (E / R)];
    r->num_kept = r->expert_offset[E];
    r->num_dropped = r->num_tokens * r->top_k - r->num_kept;
}
