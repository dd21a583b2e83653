/* attention_flash.cuh — the tensor-core flash attention's entries (kernels/attention_flash.cu) for the fused
 * attention's dispatch (kernels/attention_fused.cu), which checks the arguments and calls these only where
 * moe_attention_flash_applies (kernels/attention.h). Shapes and contracts: attention.h's fused pair under bf16.
 * CUDA C++ only; include it outside any extern "C" block. */
#ifndef MOE_KERNELS_ATTENTION_FLASH_CUH
#define MOE_KERNELS_ATTENTION_FLASH_CUH

#include "core/gpu_cuda.h"

extern "C" {

typedef struct {
    const float *q, *k, *v; /* [num_seqs * S, H, hd], [num_seqs * S, KV, hd] twice */
    int num_seqs, S, H, KV, hd;
} moe_flash_problem;

/* MOE_OK when each of the count buffers is 16-byte aligned (the kernels' vector loads), else MOE_ERR_INVALID_ARG
 * naming it: the dispatch refuses rather than run the plain kernels, whose bits differ (kernels/attention.h). */
moe_status moe__attention_flash_aligned(const void *const *pointers, int count, int head_dim);

/* Casts q, k, v to bf16 into the context's scratch (moe_gpu_scratch), then runs the kernel. */
moe_status moe__attention_flash_forward(moe_gpu *gpu, const moe_flash_problem *p, float *lse, float *out);

/* D [num_seqs, H, S]: dout_i . out_i of every row (the caller's kernel, as the plain backward's); scratch: device
 * memory of moe__attention_flash_backward_scratch bytes, 16-byte aligned (the caller's, beside its D: the context's
 * one scratch buffer cannot serve two users), for the bf16 copies of q, k, v and dout. */
size_t moe__attention_flash_backward_scratch(const moe_flash_problem *p);
moe_status moe__attention_flash_backward(moe_gpu *gpu, const moe_flash_problem *p, const float *lse, const float *D,
                                         const float *dout, float *dq, float *dk, float *dv, void *scratch);
}

#endif
