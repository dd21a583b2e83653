/* topk_cpu.c — top-k selection by k passes of an arg-max; a strict '>' keeps the lower id on ties. */
#include "router/topk.h"

#include "core/threads.h"

void moe_router_topk_cpu(const moe_real *select_scores, int num_tokens, int num_experts, int top_k, int *expert) {
    MOE__PARALLEL_FOR((size_t)num_tokens * num_experts >= MOE__PAR_MIN_ELEMS,
    for (int t = 0; t < num_tokens; t++) {
        const moe_real *s = select_scores + (size_t)t * num_experts;
        int *chosen = expert + (size_t)t * top_k;
        for (int j = 0; j < top_k; j++) {
            int best = -1;
            for (int e = 0; e < num_experts; e++) {
                int taken = 0;
                for (int i = 0; i < j; i++) taken |= chosen[i] == e;
                if (!taken && (best < 0 || s[e] > s[best])) best = e;
            }
            chosen[j] = best;
        }
    });
}
