/* scores.h — router logits and score functions (softmax | sigmoid), forward and backward. CPU and CUDA. */
#ifndef MOE_ROUTER_SCORES_H
#define MOE_ROUTER_SCORES_H

#include "kernels/gemm_rows.h"
#include "kernels/linear.h"
#include "core/gpu.h"
#include "core/types.h"

/* logits[T, E] = x[T, d] router_w[E, d]^T, each row independent of the others (kernels/gemm_rows.h);
 * when gemm->row_block > 0. Returns MOE_ERR_NONFINITE if any logit is NaN/Inf. */
moe_status moe_router_logits_cpu(moe_gemm_rows_plan *gemm, const moe_real *x, const moe_real *router_w,
                                 int num_tokens, int d_model, int num_experts, moe_real *logits);

/* scores[t, :] = softmax(logits[t, :])  or  sigmoid(logits[t, e]) elementwise. */
void moe_router_scores_cpu(moe_score_func func, const moe_real *logits, int num_tokens, int num_experts,
                           moe_real *scores);

/* dlogits = dscores pulled back through the score function (overwrites dlogits):
 *   softmax: dl = p * (ds - <ds, p>);   sigmoid: dl = ds * s * (1 - s). */
void moe_router_scores_backward_cpu(moe_score_func func, const moe_real *scores, const moe_real *dscores,
                                    int num_tokens, int num_experts, moe_real *dlogits);

/* CUDA (float, device pointers, on gpu's stream). Logits in fp32 through cuBLAS (no TF32), as the dense linear's
 * products (kernels/linear.h) with W = router_w [E, d]: `rows` is its plan (with layout_invariant, fixed blocks of
 * token rows, so that a token's logits do not depend on how many tokens the rank has; NULL: one call over all
 * tokens). The non-finite check: with nonfinite_host NULL the call synchronises and returns MOE_ERR_NONFINITE like
 * the CPU version; else it stays asynchronous and *nonfinite_host (pinned host memory) is nonzero after the
 * stream's next synchronisation if any logit is NaN or Inf. */
moe_status moe_router_logits_cuda(moe_gpu *gpu, const moe_linear_plan *rows, const float *x, const float *router_w,
                                  int num_tokens, int d_model, int num_experts, float *logits, int *nonfinite_host);
/* scores as moe_router_scores_cpu; when bias != NULL (sigmoid routing), also select_scores = scores + bias[e]. */
moe_status moe_router_scores_cuda(moe_gpu *gpu, moe_score_func func, const float *logits, const float *bias,
                                  int num_tokens, int num_experts, float *scores, float *select_scores);
moe_status moe_router_scores_backward_cuda(moe_gpu *gpu, moe_score_func func, const float *scores, const float *dscores,
                                           int num_tokens, int num_experts, float *dlogits);
/* The router GEMMs' backward: dWr[E, d] += dlogits^T x;  dx[T, d] += dlogits router_w (either may be NULL; dx's
 * product in `rows`' blocks). */
moe_status moe_router_logits_backward_cuda(moe_gpu *gpu, const moe_linear_plan *rows, const float *x,
                                           const float *router_w, const float *dlogits, int num_tokens, int d_model,
                                           int num_experts, float *drouter_w, float *dx);

#endif
