/* permute.h — moving token rows to and from the expert-major order of the dispatch layout. CPU and CUDA.
 * d = row width; slot[t*k + j] is token t's j-th assignment's row (or -1 when dropped). */
#ifndef MOE_KERNELS_PERMUTE_H
#define MOE_KERNELS_PERMUTE_H

#include "core/types.h"
#include "core/gpu.h"

/* xp[r, :] = x[perm_token[r], :] for r < num_rows (a gather). */
void moe_permute_rows_cpu(const moe_real *x, const int *perm_token, int num_rows, int d, moe_real *xp);

/* out[t, :] = sum over j = 0..k-1, in that order, of gate[t*k+j] * y[slot[t*k+j], :] (kept ones only);
 * gate == NULL means unit gates, which makes this the backward of moe_permute_rows_cpu. No atomics: each
 * output row is written by one loop in a fixed order, so the result is bitwise reproducible. */
void moe_combine_rows_cpu(const moe_real *y, const int *slot, const moe_real *gate, int num_tokens, int top_k,
                          int d, moe_real *out);

/* Backward of moe_combine_rows_cpu with gates: dy[slot, :] = gate * dout[t, :] for kept assignments and
 * dgate[t*k+j] = <dout[t, :], y[slot, :]> (0 when dropped: a dropped assignment contributes nothing). */
void moe_combine_rows_backward_cpu(const moe_real *dout, const moe_real *y, const int *slot, const moe_real *gate,
                                   int num_tokens, int top_k, int d, moe_real *dy, moe_real *dgate);

/* CUDA (queued, no host sync): rows on the expert side are bf16 (the experts' GEMM inputs and outputs), token
 * rows fp32.
 * 16-byte vector loads and stores when d is a multiple of 8; fp32 accumulation in a fixed j order. */
moe_status moe_permute_rows_cuda(moe_gpu *gpu, const float *x, const int *perm_token, int num_rows, int d,
                                 moe_bf16 *xp);
moe_status moe_combine_rows_cuda(moe_gpu *gpu, const moe_bf16 *y, const int *slot, const float *gate, int num_tokens,
                                 int top_k, int d, float *out);
/* dy[slot] = bf16(gate * dout[t]); dgate = <dout[t], y[slot]> in fp32 (0 when dropped). */
moe_status moe_combine_rows_backward_cuda(moe_gpu *gpu, const float *dout, const moe_bf16 *y, const int *slot,
                                          const float *gate, int num_tokens, int top_k, int d, moe_bf16 *dy,
                                          float *dgate);

#endif
