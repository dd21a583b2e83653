/* group_cpu.c — group-limited routing's mask (router/group.h). */
#include "router/group.h"

#include <math.h>

#include "core/threads.h"

/* The sum of the two largest of s[0 .. n) (n >= 2), or the largest alone (by_max). */
static moe_real score_of_group(const moe_real *s, int n, int by_max) {
    moe_real a = -INFINITY, b = -INFINITY; /* a >= b */
    for (int i = 0; i < n; i++) {
        if (s[i] > a) b = a, a = s[i];
        else if (s[i] > b) b = s[i];
    }
    return by_max ? a : a + b;
}

void moe_router_group_mask_cpu(const moe_real *select, int T, int E, int groups, int topk_groups, int group_score,
                               moe_real *masked) {
    const int by_max = group_score == MOE_GROUP_SCORE_MAX;
    const int size = E / groups;
    MOE__PARALLEL_FOR((size_t)T * E >= MOE__PAR_MIN_ELEMS,
    for (int t = 0; t < T; t++) {
        const moe_real *s = select + (size_t)t * E;
        moe_real *out = masked + (size_t)t * E, score[MOE_ROUTER_MAX_GROUPS];
        unsigned char kept[MOE_ROUTER_MAX_GROUPS] = {0};
        for (int g = 0; g < groups; g++) score[g] = score_of_group(s + g * size, size, by_max);
        for (int j = 0; j < topk_groups; j++) { /* arg-max passes: a strict '>' keeps the lower group on ties */
            int best = -1;
            for (int g = 0; g < groups; g++)
                if (!kept[g] && (best < 0 || score[g] > score[best])) best = g;
            kept[best] = 1;
        }
        for (int e = 0; e < E; e++) out[e] = kept[e / size] ? s[e] : -INFINITY;
    });
}
