/* elementwise.h — the dense table's elementwise ops, the sum of squares and the fp32 SwiGLU of a dense FFN, on the
 * GPU (kernels/elementwise.cu). The CPU twins of the first three are the entries add, scale and sum_squares of
 * moe/dense_ops_cpu.c; these do the same operations in the same order, each rounded once, so they give the CPU's
 * bits (where the CPU build does not contract a product and a sum into an FMA). The SwiGLU's twin is the loop of
 * experts/expert_ffn_cpu.c, the same operations in the same order with CUDA's expf for the CPU's moe__exp (both
 * within 2 ulp): close, not bitwise. Device pointers, n values, queued on gpu's stream; only moe_sum_squares_cuda
 * waits (its result is a host value). */
#ifndef MOE_KERNELS_ELEMENTWISE_H
#define MOE_KERNELS_ELEMENTWISE_H

#include <stddef.h>

#include "core/gpu.h"

/* y = a + b (y may be a or b). */
moe_status moe_add_cuda(moe_gpu *gpu, const float *a, const float *b, size_t n, float *y);
/* a[i] = (float)((double)a[i] * factor): one rounding of the double product. */
moe_status moe_scale_cuda(moe_gpu *gpu, float *a, size_t n, double factor);
/* sums[i] = the sum of a[k]^2 in double over k in [bounds[i], bounds[i + 1]) for i < count (bounds and sums on the
 * host), as the CPU forms it (core/threads.h's MOE__SUM_LANES lanes and their tree): one launch, one download, one
 * host sync. Uses the context's scratch. */
moe_status moe_sum_squares_cuda(moe_gpu *gpu, const float *a, const size_t *bounds, size_t count, double *sums);

/* x[t, j] += b[j] for rows rows of n (the CPU's bits). */
moe_status moe_bias_add_cuda(moe_gpu *gpu, float *x, const float *b, int rows, int n);
/* A sigmoid gate per row, s = 1 / (1 + e^-g[t]): out[t, :] += s y[t, :]; backward dy[t, :] = s dout[t, :],
 * dg[t] = s (1 - s) sum_i dout[t, i] y[t, i], the sum in double in index order (one thread per row): the CPU
 * entries' operations and order, with CUDA's expf (close, not bitwise). */
moe_status moe_gate_rows_forward_cuda(moe_gpu *gpu, const float *g, const float *y, int rows, int d, float *out);
moe_status moe_gate_rows_backward_cuda(moe_gpu *gpu, const float *g, const float *y, const float *dout, int rows,
                                       int d, float *dy, float *dg);

/* fp32 SwiGLU, silu(h) = h s with s = 1 / (1 + e^-h):
 *   forward:  act = h1 s h3
 *   backward: dh1 holds dA on entry and dA h3 s (1 + h1 (1 - s)) on return; dh3 = dA h1 s */
moe_status moe_swiglu_f32_forward_cuda(moe_gpu *gpu, const float *h1, const float *h3, size_t n, float *act);
moe_status moe_swiglu_f32_backward_cuda(moe_gpu *gpu, const float *h1, const float *h3, size_t n, float *dh1,
                                        float *dh3);

#endif
