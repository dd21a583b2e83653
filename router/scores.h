/* scores.h — router logits and score functions (softmax | sigmoid), forward and backward. CPU. */
#ifndef MOE_ROUTER_SCORES_H
#define MOE_ROUTER_SCORES_H

#include "kernels/gemm_rows.h"
#include "moe/moe.h"

/* logits[T, E] = x[T, d] router_w[E, d]^T, each row independent of the others (kernels/gemm_rows.h);
 * when gemm->row_block > 0. Returns MOE_ERR_NONFINITE if any logit is NaN/Inf. */
moe_status router_logits_cpu(const gemm_rows_plan *gemm, const moe_real *x, const moe_real *router_w, int num_tokens,
                             int d_model, int num_experts, moe_real *logits);

/* scores[t, :] = softmax(logits[t, :])  or  sigmoid(logits[t, e]) elementwise. */
void router_scores_cpu(moe_score_func func, const moe_real *logits, int num_tokens, int num_experts,
                       moe_real *scores);

/* dlogits = dscores pulled back through the score function (overwrites dlogits):
 *   softmax: dl = p * (ds - <ds, p>);   sigmoid: dl = ds * s * (1 - s). */
void router_scores_backward_cpu(moe_score_func func, const moe_real *scores, const moe_real *dscores,
                                int num_tokens, int num_experts, moe_real *dlogits);

#endif
