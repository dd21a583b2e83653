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

void moe_router_scores_cpu(moe_score_func func, const moe_real *logits, int num_tokens, int num_experts,
                           moe_real *scores) {
#pragma omp parallel for schedule(static) if ((size_t)num_tokens * num_experts >= MOE__PAR_MIN_ELEMS)
    for (int t = 0; t < num_tokens; t++) {
        const moe_real *l = logits + (size_t)t * num_experts;
        moe_real *s = scores + (size_t)t * num_experts;
        if (func == MOE_SCORE_SIGMOID) {
            for (int e = 0; e < num_experts; e++) s[e] = 1 / (1 + moe__exp(-l[e]));
            continue;
        }
        moe_real max = l[0], sum = 0;
        for (int e = 1; e < num_experts; e++) max = l[e] > max ? l[e] : max;
        for (int e = 0; e < num_experts; e++) sum += s[e] = moe__exp(l[e] - max);
        for (int e = 0; e < num_experts; e++) s[e] /= sum;
    }
}

void moe_router_scores_backward_cpu(moe_score_func func, const moe_real *scores, const moe_real *dscores,
                                    int num_tokens, int num_experts, moe_real *dlogits) {
#pragma omp parallel for schedule(static) if ((size_t)num_tokens * num_experts >= MOE__PAR_MIN_ELEMS)
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
    }
}
