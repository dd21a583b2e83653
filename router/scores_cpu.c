/* scores_cpu.c — router logits (row-wise GEMM) and the softmax / sigmoid score functions, with backward. */
#include "router/scores.h"

#include "core/fail.h"
#include "core/real.h"
#include "core/threads.h"

moe_status moe_router_logits_cpu(moe_gemm_rows_plan *gemm, const moe_real *x, const moe_real *router_w,
                                 int num_tokens, int d_model, int num_experts, moe_real *logits) {
    MOE_TRY(moe_gemm_rows_cpu(gemm, CblasTrans, num_tokens, num_experts, d_model, x, router_w, 0, logits));
    for (size_t i = 0; i < (size_t)num_tokens * num_experts; i++)
        if (!isfinite(logits[i]))
            return moe_fail(MOE_ERR_NONFINITE, "router logit of token %zu, expert %zu is %g (NaN or Inf)",
                            i / num_experts, i % num_experts, (double)logits[i]);
    return MOE_OK;
}

/* The sum of n values in a fixed pairwise order: up to 8 in index order, else the two halves' sums added. Its rounding
 * error grows with 8 + log2(n / 8) terms instead of n (one at a time: 2-6x torch's at 64 to 1024 experts); at 8
 * experts or fewer it is the plain in-order sum. */
static moe_real pairwise_sum(const moe_real *a, int n) {
    if (n <= 8) {
        moe_real s = 0;
        for (int i = 0; i < n; i++) s += a[i];
        return s;
    }
    const int h = n / 2;
    return pairwise_sum(a, h) + pairwise_sum(a + h, n - h);
}

void moe_router_scores_cpu(moe_score_func func, const moe_real *logits, int num_tokens, int num_experts,
                           moe_real *scores) {
    MOE__PARALLEL_FOR((size_t)num_tokens * num_experts >= MOE__PAR_MIN_ELEMS,
    for (int t = 0; t < num_tokens; t++) {
        const moe_real *l = logits + (size_t)t * num_experts;
        moe_real *s = scores + (size_t)t * num_experts;
        if (func == MOE_SCORE_SIGMOID) {
            for (int e = 0; e < num_experts; e++) s[e] = 1 / (1 + moe__exp(-l[e]));
            continue;
        }
        moe_real max = l[0];
        for (int e = 1; e < num_experts; e++) max = l[e] > max ? l[e] : max;
        for (int e = 0; e < num_experts; e++) s[e] = moe__exp(l[e] - max);
        const moe_real sum = pairwise_sum(s, num_experts);
        for (int e = 0; e < num_experts; e++) s[e] /= sum;
    });
}

void moe_router_scores_backward_cpu(moe_score_func func, const moe_real *scores, const moe_real *dscores,
                                    int num_tokens, int num_experts, moe_real *dlogits) {
    MOE__PARALLEL_FOR((size_t)num_tokens * num_experts >= MOE__PAR_MIN_ELEMS,
    for (int t = 0; t < num_tokens; t++) {
        const moe_real *s = scores + (size_t)t * num_experts, *ds = dscores + (size_t)t * num_experts;
        moe_real *dl = dlogits + (size_t)t * num_experts;
        if (func == MOE_SCORE_SIGMOID) {
            for (int e = 0; e < num_experts; e++) dl[e] = ds[e] * s[e] * (1 - s[e]);
            continue;
        }
        moe_real dot = 0;
        for (int e = 0; e < num_experts; e++) dot += ds[e] * s[e];
        for (int e = 0; e < num_experts; e++) dl[e] = s[e] * (ds[e] - dot);
    });
}
