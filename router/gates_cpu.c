/* gates_cpu.c — gate weights from the router scores of the chosen experts, and their backward. */
#include "router/gates.h"

#include "core/threads.h"

void moe_router_gates_cpu(const moe_real *scores, const int *expert, int num_tokens, int num_experts, int top_k,
                          int renormalize, moe_real scale, moe_real *expert_score, moe_real *gate) {
    MOE__PARALLEL_FOR((size_t)num_tokens * num_experts >= MOE__PAR_MIN_ELEMS,
    for (int t = 0; t < num_tokens; t++) {
        const moe_real *s = scores + (size_t)t * num_experts;
        const int *e = expert + (size_t)t * top_k;
        moe_real *g = gate + (size_t)t * top_k, sum = 0;
        for (int j = 0; j < top_k; j++) sum += g[j] = expert_score[(size_t)t * top_k + j] = s[e[j]];
        if (renormalize)
            for (int j = 0; j < top_k; j++) g[j] /= sum;
        for (int j = 0; j < top_k; j++) g[j] *= scale;
    });
}

void moe_router_gates_backward_cpu(const moe_real *scores, const int *expert, const moe_real *dgate, int num_tokens,
                                   int num_experts, int top_k, int renormalize, moe_real scale, moe_real *dscores) {
    MOE__PARALLEL_FOR((size_t)num_tokens * num_experts >= MOE__PAR_MIN_ELEMS,
    for (int t = 0; t < num_tokens; t++) {
        const moe_real *s = scores + (size_t)t * num_experts, *dgate_t = dgate + (size_t)t * top_k;
        const int *e = expert + (size_t)t * top_k;
        moe_real *ds = dscores + (size_t)t * num_experts;
        if (!renormalize) {
            for (int j = 0; j < top_k; j++) ds[e[j]] += dgate_t[j] * scale;
            continue;
        }
        moe_real sum = 0, dot = 0; /* the forward's sum, in its order, and so its g_j = s_j / sum */
        for (int j = 0; j < top_k; j++) sum += s[e[j]];
        for (int j = 0; j < top_k; j++) dot += dgate_t[j] * scale * (s[e[j]] / sum);
        for (int j = 0; j < top_k; j++) ds[e[j]] += (dgate_t[j] * scale - dot) / sum;
    });
}
