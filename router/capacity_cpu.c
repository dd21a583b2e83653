/* capacity_cpu.c — the capacity rule on a whole batch held by one rank (capacity.h). */
#include "router/capacity.h"

#include <math.h>
#include <stdlib.h>

int moe_router_capacity(float capacity_factor, int num_tokens, int top_k, int num_experts) {
    if (!(capacity_factor > 0)) return 0;
    const double slots = (double)capacity_factor * num_tokens * top_k / num_experts;
    /* float's rounding of cf (1.1f is 1.1000000238) must not add a slot: a slack of float's epsilon, relative (1e-6
     * until 2026-12-07, which took a whole slot from 2^20 and more) */
    const double c = ceil(slots - slots * 0x1p-23);
    /* at least 1: a positive factor keeps some tokens (0 reads as dropless); at most T: a token picks an expert once
     * (and a factor of 1e6 overflowed the int, dropping every token: a probe) */
    return c < 1 ? 1 : c > num_tokens ? (num_tokens > 0 ? num_tokens : 1) : (int)c;
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

static moe_status keep_highest_scores(const int *expert, const moe_real *expert_score, int num_assignments,
                                      int top_k, int capacity, unsigned char *kept) {
    candidate *c = malloc((num_assignments > 0 ? (size_t)num_assignments : 1) * sizeof *c);
    if (!c) return MOE_ERR_OUT_OF_MEMORY;
    for (int a = 0; a < num_assignments; a++) c[a] = (candidate){expert[a], a / top_k, a, expert_score[a]};
    qsort(c, num_assignments, sizeof *c, by_expert_then_score);
    for (int i = 0, rank = 0; i < num_assignments; i++) {
        rank = (i > 0 && c[i].expert == c[i - 1].expert) ? rank + 1 : 0;
        kept[c[i].assignment] = rank < capacity;
    }
    free(c);
    return MOE_OK;
}

moe_status moe_router_apply_capacity_cpu(const int *expert, const moe_real *expert_score, int num_tokens,
                                         int num_experts, int top_k, float capacity_factor,
                                         moe_drop_priority priority, unsigned char *kept, int *num_selected,
                                         int *capacity) {
    const int A = num_tokens * top_k, C = moe_router_capacity(capacity_factor, num_tokens, top_k, num_experts);
    *capacity = C;
    for (int e = 0; e < num_experts; e++) num_selected[e] = 0;
    /* token order: the running count of an expert is the assignment's rank in its queue */
    for (int a = 0; a < A; a++) {
        int rank = num_selected[expert[a]]++;
        kept[a] = C == 0 || rank < C;
    }
    if (C > 0 && priority == MOE_DROP_BY_SCORE) return keep_highest_scores(expert, expert_score, A, top_k, C, kept);
    return MOE_OK;
}
