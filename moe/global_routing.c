/* global_routing.c — allgather of the top-k choices, global capacity, expected receive counts. */
#include "moe/global_routing.h"

#include <stdlib.h>
#include <string.h>

#include "router/capacity.h"

void moe_global_routing_free(moe_global_routing *g) {
    moe_routing_free(&g->routing);
    free(g->first_token);
    memset(g, 0, sizeof *g);
}

/* Every rank's token count -> first_token[W + 1]; sizes the global routing for their sum. */
static moe_status gather_token_counts(moe_comm *world, const moe_routing *local, moe_global_routing *g) {
    const int W = world->size;
    int *tokens_of_rank = malloc((size_t)W * sizeof(int));
    size_t *nbytes = calloc(W, sizeof(size_t));
    if (!g->first_token) g->first_token = calloc(W + 1, sizeof(int));
    moe_status st = tokens_of_rank && nbytes && g->first_token ? MOE_OK : MOE_ERR_OUT_OF_MEMORY;
    if (st == MOE_OK) {
        for (int p = 0; p < W; p++) nbytes[p] = sizeof(int);
        st = world->ops->allgatherv_bytes(world, &local->num_tokens, sizeof(int), tokens_of_rank, nbytes);
    }
    if (st == MOE_OK) {
        for (int p = 0; p < W; p++) g->first_token[p + 1] = g->first_token[p] + tokens_of_rank[p];
        int total = g->first_token[W];
        if (total > g->max_tokens) {
            moe_routing_free(&g->routing);
            g->max_tokens = 0;
            st = moe_routing_alloc(&g->routing, total, local->num_experts, local->top_k, local->num_ranks);
            if (st == MOE_OK) g->max_tokens = total;
        }
        g->routing.num_tokens = total;
    }
    free(tokens_of_rank), free(nbytes);
    return st;
}

/* recv = concatenation over ranks of `per_token` bytes for each of their tokens. */
static moe_status gather_per_token(moe_comm *world, const moe_global_routing *g, const void *send, size_t per_token,
                                   void *recv) {
    size_t *nbytes = malloc((size_t)world->size * sizeof *nbytes);
    if (!nbytes) return MOE_ERR_OUT_OF_MEMORY;
    for (int p = 0; p < world->size; p++) nbytes[p] = (size_t)(g->first_token[p + 1] - g->first_token[p]) * per_token;
    moe_status st = world->ops->allgatherv_bytes(world, send, nbytes[world->rank], recv, nbytes);
    free(nbytes);
    return st;
}

moe_status moe_global_capacity(const moe_parallel *par, float capacity_factor, moe_drop_priority priority,
                               moe_routing *local, moe_global_routing *g) {
    moe_comm *world = par->world;
    const int k = local->top_k;
    moe_status st = gather_token_counts(world, local, g);
    if (st == MOE_OK) st = gather_per_token(world, g, local->expert, k * sizeof(int), g->routing.expert);
    if (st == MOE_OK && priority == MOE_DROP_BY_SCORE)
        st = gather_per_token(world, g, local->expert_score, k * sizeof(moe_real), g->routing.expert_score);
    if (st == MOE_OK) st = moe_router_apply_capacity_cpu(&g->routing, capacity_factor, priority);
    if (st != MOE_OK) return st;
    memcpy(local->kept, g->routing.kept + (size_t)g->first_token[world->rank] * k, (size_t)local->num_tokens * k);
    memcpy(local->num_selected_per_expert, g->routing.num_selected_per_expert, local->num_experts * sizeof(int));
    local->capacity = g->routing.capacity;
    return MOE_OK;
}

void moe_global_expected_recv_counts(const moe_parallel *par, const moe_global_routing *g, int *expected) {
    const moe_routing *r = &g->routing;
    const int k = r->top_k, EL = r->num_experts / par->ep_size, first_expert = par->ep_rank * EL;
    memset(expected, 0, (size_t)par->ep_size * EL * sizeof(int));
    /* EP peer p of this rank is world rank (dp_rank * ep + p) */
    for (int p = 0; p < par->ep_size; p++) {
        int src = par->dp_rank * par->ep_size + p;
        for (int a = g->first_token[src] * k; a < g->first_token[src + 1] * k; a++) {
            int le = r->expert[a] - first_expert;
            if (r->kept[a] && le >= 0 && le < EL) expected[p * EL + le]++;
        }
    }
}
