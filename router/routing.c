/* routing.c — allocation of the routing buffers (sizes in routing.h). */
#include "router/routing.h"

#include <stdlib.h>
#include <string.h>

moe_status moe_routing_alloc(moe_routing *r, int max_tokens, int num_experts, int top_k, int num_ranks) {
    memset(r, 0, sizeof *r);
    size_t te = (size_t)max_tokens * num_experts, tk = (size_t)max_tokens * top_k;
    r->num_experts = num_experts;
    r->top_k = top_k;
    r->num_ranks = num_ranks;
    r->logits = malloc(te * sizeof(moe_real));
    r->scores = malloc(te * sizeof(moe_real));
    r->select_scores = malloc(te * sizeof(moe_real));
    r->expert = malloc(tk * sizeof(int));
    r->gate = malloc(tk * sizeof(moe_real));
    r->expert_score = malloc(tk * sizeof(moe_real));
    r->kept = malloc(tk);
    r->slot = malloc(tk * sizeof(int));
    r->perm_token = malloc(tk * sizeof(int));
    r->num_selected_per_expert = calloc(num_experts, sizeof(int));
    r->num_tokens_per_expert = calloc(num_experts, sizeof(int));
    r->expert_offset = calloc(num_experts + 1, sizeof(int));
    r->num_tokens_per_rank = calloc(num_ranks, sizeof(int));
    if (!r->logits || !r->scores || !r->select_scores || !r->expert || !r->gate || !r->expert_score || !r->kept || !r->slot ||
        !r->perm_token || !r->num_selected_per_expert || !r->num_tokens_per_expert || !r->expert_offset ||
        !r->num_tokens_per_rank) {
        moe_routing_free(r);
        return MOE_ERR_OUT_OF_MEMORY;
    }
    return MOE_OK;
}

void moe_routing_free(moe_routing *r) {
    free(r->logits);
    free(r->scores);
    free(r->select_scores);
    free(r->expert);
    free(r->gate);
    free(r->expert_score);
    free(r->kept);
    free(r->slot);
    free(r->perm_token);
    free(r->num_selected_per_expert);
    free(r->num_tokens_per_expert);
    free(r->expert_offset);
    free(r->num_tokens_per_rank);
    memset(r, 0, sizeof *r);
}

void moe_routing_count_totals(moe_routing *r) {
    const int E = r->num_experts, R = r->num_ranks;
    const int *offset = r->expert_offset;
    for (int q = 0; q < R; q++) r->num_tokens_per_rank[q] = offset[(q + 1) * (E / R)] - offset[q * (E / R)];
    r->num_kept = offset[E];
    r->num_dropped = r->num_tokens * r->top_k - r->num_kept;
}
