/* rmsnorm.h — RMSNorm (Mixtral's input_layernorm / post_attention_layernorm / norm). CPU and CUDA.
 *   y[t, i] = x[t, i] * rstd[t] * w[i],   rstd[t] = 1 / sqrt(mean_i x[t, i]^2 + eps)  */
#ifndef MOE_KERNELS_RMSNORM_H
#define MOE_KERNELS_RMSNORM_H

#include "core/gpu.h"
#include "core/types.h"

/* x, y: [T, d]; w: [d]; rstd: [T] saved for backward. y may not alias x. */
void moe_rmsnorm_forward_cpu(const moe_real *x, const moe_real *w, int num_tokens, int d, moe_real eps, moe_real *y,
                             moe_real *rstd);

/* dx[t, :] += dL/dx (accumulates: x is usually a residual stream), dw[:] += dL/dw. */
void moe_rmsnorm_backward_cpu(const moe_real *x, const moe_real *w, const moe_real *rstd, const moe_real *dy,
                              int num_tokens, int d, moe_real *dx, moe_real *dw);

/* CUDA (float, device pointers, queued on gpu's stream, no host sync): the formulas and the contracts of the
 * CPU versions (dx and dw accumulate). dw is summed over fixed token chunks into gpu's scratch
 * (ceil(num_tokens / chunk) * d doubles), then the chunks in order: no atomics, the same bits every run. */
moe_status moe_rmsnorm_forward_cuda(moe_gpu *gpu, const float *x, const float *w, int num_tokens, int d, float eps,
                                    float *y, float *rstd);
moe_status moe_rmsnorm_backward_cuda(moe_gpu *gpu, const float *x, const float *w, const float *rstd,
                                     const float *dy, int num_tokens, int d, float *dx, float *dw);

#endif
