/* linear.h — the dense linear layer's products on the GPU (kernels/linear.cu), the CUDA twin of the row-wise GEMMs
 * of kernels/gemm_rows.h as moe/dense_ops_cpu.c uses them. Row-major, W [out, in], T token rows:
 *   forward          y[T, out]   = x[T, in] W^T
 *   backward input   dx[T, in]   = dy[T, out] W + beta dx
 *   backward weight  dW[out, in] = dy^T x + beta dW
 * beta is 0 (C is overwritten, not read) or 1; anything else is MOE_ERR_INVALID_ARG.
 *
 * fp32 cublasSgemm under the context's pedantic math mode (no TF32). bf16 precision: the caller rounds the inputs
 * to bf16 and keeps them in fp32 buffers (moe_bf16_round_cuda), as the model keeps its bf16 weight copies; products
 * of bf16 values are exact in fp32, so this SGEMM computes what a bf16 GEMM with fp32 accumulation computes, up to
 * the order of the sums (core/precision.h). cublasGemmEx on bf16-typed buffers would need a second copy of every
 * weight and activation as moe_bf16; the SGEMM on rounded values needs none.
 *
 * Row blocks (layout_invariant): the calls of kernels/linear_gemms.h, every row-wise call MOE_GEMM_ROW_BLOCK rows,
 * the last partial block padded through the plan's buffers, so that cuBLAS runs one shape for every block.
 * Device pointers, queued on gpu's stream, no host sync. */
#ifndef MOE_KERNELS_LINEAR_H
#define MOE_KERNELS_LINEAR_H

#include "core/gpu.h"

typedef struct {
    int layout_invariant;
    int max_width;           /* the widest row of an input or output (in, out) */
    float *pad_in, *pad_out; /* [MOE_GEMM_ROW_BLOCK, max_width] each, device: the padded block; NULL without blocks */
} moe_linear_plan;

moe_status moe_linear_plan_init(moe_gpu *gpu, int layout_invariant, int max_width, moe_linear_plan *plan);
void moe_linear_plan_free(moe_gpu *gpu, moe_linear_plan *plan);

moe_status moe_linear_forward_cuda(moe_gpu *gpu, const moe_linear_plan *plan, const float *x, const float *W, int rows,
                                   int in, int out, float *y);
moe_status moe_linear_backward_input_cuda(moe_gpu *gpu, const moe_linear_plan *plan, const float *dy, const float *W,
                                          int rows, int in, int out, float beta, float *dx);
moe_status moe_linear_backward_weight_cuda(moe_gpu *gpu, const moe_linear_plan *plan, const float *dy, const float *x,
                                           int rows, int in, int out, float beta, float *dW);

#endif
