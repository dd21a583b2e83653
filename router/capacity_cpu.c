/* capacity_cpu.c — which assignments fit their expert's capacity; a pure function of (expert, scores). */
#include "router/capacity.h"

#include <math.h>
#include <stdlib.h>

int moe_router_capacity(float capacity_factor, int num_tokens, int top_k, int num_experts) {
    if (capacity_factor <= 0) return 0;
    double slots = (double)capacity_factor * num_tokens * top_k / num_experts;
    return (int)ceil(slots - 1e-6 * (slots > 1 ? slots : 1));
}

typedef struct {
    int expert, token, assignment;
    moe_real score;
} candidate;

/* Expert ascending, then score descending, then token ascending: a total order, so qsort is exact. */
static int by_expert_then_score(const void *pa, const void *pb) {
    const candidate *a = pa, *b = pb;
    if (a->expert != b->expert) return a->expert < b->expert ? -1 : 1;
    if (a->score != b->score) return a->score > b->score ? -1 : 1;
    return (a->token > b->token) - (a->token < b->token);
}

static moe_status keep_highest_scores(moe_routing *r) {
    int k = r->top_k, n = r->num_tokens * k;
    candidate *c = malloc((size_t)(n ? n : 1) * sizeof *c);
    if (!c) return MOE_ERR_OUT_OF_MEMORY;
    for (int a = 0; a < n; a++) c[a] = (candidate){r->expert[a], a / k, a, r->expert_score[a]};
    qsort(c, n, sizeof *c, by_expert_then_score);
    for (int i = 0, rank = 0; i < n; i++) {
        rank = (i > 0 && c[i].expert == c[i - 1].expert) ? rank + 1 : 0;
        r->kept[c[i].assignment] = rank < r->capacity;
    }
    free(c);
    return MOE_OK;
}

moe_status moe_router_apply_capacity_cpu(moe_routing *r, float capacity_factor, moe_drop_priority priority) {
    int T = r->num_tokens, k = r->top_k, E = r->num_experts;
    r->capacity = moe_router_capacity(capacity_factor, T, k, E);
    for (int e = 0; e < E; e++) r->num_selected_per_expert[e] = 0;
    /* Token order: the running count of an expert is the assignment's rank in its queue. */
    for (int a = 0; a < T * k; a++) {
        int rank = r->num_selected_per_expert[r->expert[a]]++;
        r->kept[a] = r->capacity == 0 || rank < r->capacity;
    }
    if (r->capacity > 0 && priority == MOE_DROP_BY_SCORE) return keep_highest_scores(r);
    return MOE_OK;
}
