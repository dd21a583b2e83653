/* cross_entropy.cu — softmax cross-entropy on the GPU (formulas: cross_entropy.h; the CPU twin:
 * cross_entropy_cpu.c). One block per token: the row max (float), sum_i exp(l_i - max) in double, both
 * reduced in a fixed order (block_reduce.cuh). forward writes loss_t = max + log(sum) - l_target (double) per
 * token to scratch, and one block adds them (thread j takes tokens j, j + 256, ..., then the block's fixed
 * tree), so the loss has the same bits every run. backward stores the exps in place, scales them by
 * (float)(scale / sum) and subtracts scale at the target, as the CPU does.
 * Checked by tests/test_gpu_dense_ops_b.cu (build: ninja -C build; run: meson test -C build --suite gpu). */
#include <math.h>

#include "core/gpu_cuda.h"

#include "kernels/block_reduce.cuh"

extern "C" {
#include "kernels/cross_entropy.h"
}

namespace {

constexpr int kRowThreads = 256;    /* one block per token */
constexpr int kReduceThreads = 256; /* the one block that adds the token losses */

__device__ bool valid_target(int target, int vocab) { return target >= 0 && target < vocab; }

__global__ void token_losses(const float *logits, const int *targets, int vocab, double *losses) {
    __shared__ float fshared[kRowThreads / kWarpSize];
    __shared__ double dshared[kRowThreads / kWarpSize];
    const size_t t = blockIdx.x;
    const float *l = logits + t * vocab;
    float max = -INFINITY;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) max = fmaxf(max, l[i]);
    max = block_max(max, fshared);
    double sum = 0;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) sum += (double)expf(l[i] - max);
    sum = block_sum(sum, dshared);
    if (threadIdx.x == 0) {
        const int target = targets[t];
        losses[t] = valid_target(target, vocab) ? (double)max + log(sum) - (double)l[target] : (double)NAN;
    }
}

/* *total = sum of count doubles: strided per thread in index order, then the block's fixed order */
__global__ void sum_losses(const double *losses, int count, double *total) {
    __shared__ double shared[kReduceThreads / kWarpSize];
    double sum = 0;
    for (int t = threadIdx.x; t < count; t += blockDim.x) sum += losses[t];
    sum = block_sum(sum, shared);
    if (threadIdx.x == 0) *total = sum;
}

/* l_i = scale * (exp(l_i - max) / sum - [i == target]); each thread scales the exps it stored itself */
__global__ void cross_entropy_backward_kernel(float *logits, const int *targets, int vocab, float scale) {
    __shared__ float fshared[kRowThreads / kWarpSize];
    __shared__ double dshared[kRowThreads / kWarpSize];
    const size_t t = blockIdx.x;
    float *l = logits + t * vocab;
    float max = -INFINITY;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) max = fmaxf(max, l[i]);
    max = block_max(max, fshared); /* its barriers: every thread has read the row before any exp is stored */
    double sum = 0;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        const float e = expf(l[i] - max);
        l[i] = e;
        sum += e;
    }
    sum = block_sum(sum, dshared);
    const float k = (float)(scale / sum);
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) l[i] = __fmul_rn(l[i], k);
    __syncthreads(); /* the target's scaled value is written before thread 0 subtracts from it */
    const int target = targets[t];
    if (threadIdx.x == 0 && valid_target(target, vocab)) l[target] = __fsub_rn(l[target], scale);
}

} // namespace

extern "C" moe_status moe_cross_entropy_forward_queue_cuda(moe_gpu *gpu, const float *logits, const int *targets,
                                                           int num_tokens, int vocab, double *loss_sum) {
    if (num_tokens < 0 || vocab < 1 || !logits || !targets || !loss_sum) return MOE_ERR_INVALID_ARG;
    if (num_tokens == 0) return *loss_sum = 0, MOE_OK;
    void *scratch = NULL; /* [num_tokens] token losses, then their sum (a later call's kernels, queued after this
                           * call's copy, overwrite them only once it is done) */
    moe_status st = moe_gpu_scratch(gpu, ((size_t)num_tokens + 1) * sizeof(double), &scratch);
    if (st != MOE_OK) return st;
    double *losses = (double *)scratch, *total = losses + num_tokens;
    token_losses<<<num_tokens, kRowThreads, 0, gpu->stream>>>(logits, targets, vocab, losses);
    MOE_CUDA_LAUNCHED();
    sum_losses<<<1, kReduceThreads, 0, gpu->stream>>>(losses, num_tokens, total);
    MOE_CUDA_LAUNCHED();
    MOE_CUDA_TRY(cudaMemcpyAsync(loss_sum, total, sizeof *loss_sum, cudaMemcpyDeviceToHost, gpu->stream));
    return MOE_OK;
}

extern "C" moe_status moe_cross_entropy_forward_cuda(moe_gpu *gpu, const float *logits, const int *targets,
                                                     int num_tokens, int vocab, double *loss_sum) {
    double total = 0; /* pageable: the copy would end before the call returns; the wait is what is counted */
    MOE_TRY(moe_cross_entropy_forward_queue_cuda(gpu, logits, targets, num_tokens, vocab, &total));
    if (num_tokens > 0) MOE_TRY(moe_gpu_wait(gpu, "cross-entropy loss"));
    *loss_sum = total;
    return MOE_OK;
}

extern "C" moe_status moe_cross_entropy_backward_cuda(moe_gpu *gpu, float *logits, const int *targets, int num_tokens,
                                                      int vocab, float scale) {
    if (num_tokens < 0 || vocab < 1 || !logits || !targets) return MOE_ERR_INVALID_ARG;
    if (num_tokens == 0) return MOE_OK;
    cross_entropy_backward_kernel<<<num_tokens, kRowThreads, 0, gpu->stream>>>(logits, targets, vocab, scale);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}
