/* gates_cpu.c — gate weights from the router scores of the chosen experts, and their backward. */
#include "router/gates.h"

#include "core/threads.h"

/* The renormalisation's denominator: the k scores' sum + 1e-20, as DeepSeek's gates have it, so that sigmoid scores
 * that all underflow to 0 (logits below about -88, chosen by a selection bias) give gates of 0, not 0 / 0 (a probe,
 * 2026-12-07: NaN from finite weights). Below fp32's half-ulp of any sum above 2e-13: softmax's sums (>= 1 / E) and
 * any ordinary sigmoid sum keep their bits. */
static moe_real renormalizer(moe_real sum) { return sum + (moe_real)1e-20; }

void moe_router_gates_cpu(const moe_real *scores, const int *expert, int num_tokens, int num_experts, int top_k,
                          int renormalize, moe_real scale, moe_real *expert_score, moe_real *gate) {
    MOE__PARALLEL_FOR((size_t)num_tokens * num_experts >= MOE__PAR_MIN_ELEMS,
    for (int t = 0; t < num_tokens; t++) {
        const moe_real *s = scores + (size_t)t * num_experts;
        const int *e = expert + (size_t)t * top_k;
        moe_real *g = gate + (size_t)t * top_k, sum = 0;
        for (int j = 0; j < top_k; j++) sum += g[j] = expert_score[(size_t)t * top_k + j] = s[e[j]];
        if (renormalize) {
            const moe_real denominator = renormalizer(sum);
            for (int j = 0; j < top_k; j++) g[j] /= denominator;
        }
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
        sum = renormalizer(sum);
        for (int j = 0; j < top_k; j++) dot += dgate_t[j] * scale * (s[e[j]] / sum);
        for (int j = 0; j < top_k; j++) ds[e[j]] += (dgate_t[j] * scale - dot) / sum;
    });
}
