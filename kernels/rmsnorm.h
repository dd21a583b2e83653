/* rmsnorm.h — RMSNorm (Mixtral's input_layernorm / post_attention_layernorm / norm). CPU.
 *   y[t, i] = x[t, i] * rstd[t] * w[i],   rstd[t] = 1 / sqrt(mean_i x[t, i]^2 + eps)  */
#ifndef MOE_KERNELS_RMSNORM_H
#define MOE_KERNELS_RMSNORM_H

#include "core/types.h"

/* x, y: [T, d]; w: [d]; rstd: [T] saved for backward. y may not alias x. */
void moe_rmsnorm_forward_cpu(const moe_real *x, const moe_real *w, int num_tokens, int d, moe_real eps, moe_real *y,
                             moe_real *rstd);

/* dx[t, :] += dL/dx (accumulates: x is usually a residual stream), dw[:] += dL/dw. */
void moe_rmsnorm_backward_cpu(const moe_real *x, const moe_real *w, const moe_real *rstd, const moe_real *dy,
                              int num_tokens, int d, moe_real *dx, moe_real *dw);

#endif
