/* elementwise.h — the dense table's elementwise ops and the sum of squares, on the GPU (kernels/elementwise.cu).
 * Their CPU twins are the entries add, scale and sum_squares of moe/dense_ops_cpu.c; these do the same
 * operations in the same order, each rounded once, so they give the CPU's bits (where the CPU build does not
 * contract a product and a sum into an FMA). Device pointers, n values, queued on gpu's stream; only
 * moe_sum_squares_cuda waits (its result is a host value). */
#ifndef MOE_KERNELS_ELEMENTWISE_H
#define MOE_KERNELS_ELEMENTWISE_H

#include <stddef.h>

#include "core/gpu.h"

/* y = a + b (y may be a or b). */
moe_status moe_add_cuda(moe_gpu *gpu, const float *a, const float *b, size_t n, float *y);
/* a[i] = (float)((double)a[i] * factor): one rounding of the double product. */
moe_status moe_scale_cuda(moe_gpu *gpu, float *a, size_t n, double factor);
/* *sum = sum of a[i]^2 in double, as the CPU forms it (core/threads.h): MOE__SUM_CHUNKS chunks
 * [c n / CHUNKS, (c + 1) n / CHUNKS), each summed in index order from 0, then the chunk sums in chunk order.
 * Host sync. Uses the context's scratch. */
moe_status moe_sum_squares_cuda(moe_gpu *gpu, const float *a, size_t n, double *sum);

#endif
