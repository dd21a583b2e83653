/* scores.cu — router logits through cuBLAS (fp32, no TF32) with their backward GEMMs, and the softmax /
 * sigmoid score functions with their backward, one warp per token. Formulas of scores_cpu.c; checked
 * against it by tests/test_gpu_router.cu (build: ninja -C build; run: meson test -C build --suite gpu).
 *
 * The three GEMMs are the dense linear's (kernels/linear.h, W = Wr [E, d], in d, out E): logits = x Wr^T its
 * forward, dWr += dlogits^T x its weight gradient, dx += dlogits Wr its input gradient; the row-wise two in the
 * caller's plan of row blocks.
 * Warp reductions are xor butterflies: every lane ends with the same bits, the same on every run. */
#include <math.h>

#include "kernels/warp_reduce.cuh"
#include "core/gpu_cuda.h"

extern "C" {
#include "router/scores.h"
}

namespace {

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 4;
constexpr int kRowThreads = kWarpsPerBlock * kWarp;
constexpr int kFlatThreads = 256;
constexpr int kMaxFlatBlocks = 4096;

__global__ void flag_nonfinite(const float *v, size_t count, int *flag) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x)
        if (!isfinite(v[i])) *flag = 1; /* every writer stores the same 1: no reduction, no race on the value */
}

/* scores (and select = scores + bias when bias != NULL) of one token per warp. Not __restrict__. */
__global__ void scores_forward(moe_score_func func, const float *logits, const float *bias, int num_tokens,
                               int num_experts, float *scores, float *select) {
    int token = blockIdx.x * kWarpsPerBlock + threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
    if (token >= num_tokens) return; /* the whole warp: token is warp-uniform */
    const float *l = logits + (size_t)token * num_experts;
    float *s = scores + (size_t)token * num_experts, *sel = bias ? select + (size_t)token * num_experts : NULL;
    if (func == MOE_SCORE_SIGMOID) {
        for (int e = lane; e < num_experts; e += kWarp) {
            float v = 1.0f / (1.0f + expf(-l[e]));
            s[e] = v;
            if (bias) sel[e] = v + bias[e];
        }
        return;
    }
    float max = -INFINITY, sum = 0.0f;
    for (int e = lane; e < num_experts; e += kWarp) max = fmaxf(max, l[e]);
    max = warp_max(max);
    for (int e = lane; e < num_experts; e += kWarp) sum += expf(l[e] - max);
    sum = warp_sum(sum);
    for (int e = lane; e < num_experts; e += kWarp) {
        float v = expf(l[e] - max) / sum;
        s[e] = v;
        if (bias) sel[e] = v + bias[e];
    }
}

/* dlogits from dscores, one token per warp; the row's dot is complete before any write, so dlogits may be
 * dscores itself (as on the CPU). Not __restrict__. */
__global__ void scores_backward(moe_score_func func, const float *scores, const float *dscores, int num_tokens,
                                int num_experts, float *dlogits) {
    int token = blockIdx.x * kWarpsPerBlock + threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
    if (token >= num_tokens) return;
    size_t row = (size_t)token * num_experts;
    const float *s = scores + row, *ds = dscores + row;
    float *dl = dlogits + row;
    if (func == MOE_SCORE_SIGMOID) {
        for (int e = lane; e < num_experts; e += kWarp) dl[e] = ds[e] * s[e] * (1.0f - s[e]);
        return;
    }
    float dot = 0.0f;
    for (int e = lane; e < num_experts; e += kWarp) dot += ds[e] * s[e];
    dot = warp_sum(dot);
    for (int e = lane; e < num_experts; e += kWarp) dl[e] = s[e] * (ds[e] - dot);
}

int row_blocks(int num_tokens) { return (num_tokens + kWarpsPerBlock - 1) / kWarpsPerBlock; }

} // namespace

extern "C" moe_status moe_router_logits_cuda(moe_gpu *gpu, const moe_linear_plan *rows, const float *x,
                                             const float *router_w, int num_tokens, int d_model, int num_experts,
                                             float *logits, int *nonfinite_host) {
    if (num_tokens < 0 || d_model < 0 || num_experts < 1) return MOE_ERR_INVALID_ARG;
    if (nonfinite_host) *nonfinite_host = 0;
    if (num_tokens == 0) return MOE_OK;
    size_t count = (size_t)num_tokens * num_experts;
    if (d_model == 0) { /* an empty sum, as OpenBLAS gives with k = 0 */
        MOE_CUDA_TRY(cudaMemsetAsync(logits, 0, count * sizeof(float), gpu->stream));
        return MOE_OK;
    }
    const moe_linear_plan one_call = {};
    MOE_TRY(moe_linear_forward_cuda(gpu, rows ? rows : &one_call, x, router_w, num_tokens, d_model, num_experts,
                                    logits));
    MOE_CUDA_TRY(cudaMemsetAsync(gpu->flag, 0, sizeof(int), gpu->stream));
    size_t blocks = (count + kFlatThreads - 1) / kFlatThreads;
    flag_nonfinite<<<(unsigned)(blocks < kMaxFlatBlocks ? blocks : kMaxFlatBlocks), kFlatThreads, 0, gpu->stream>>>(
        logits, count, gpu->flag);
    MOE_CUDA_LAUNCHED();
    if (nonfinite_host) { /* the caller reads it after its next synchronisation */
        MOE_CUDA_TRY(cudaMemcpyAsync(nonfinite_host, gpu->flag, sizeof(int), cudaMemcpyDeviceToHost, gpu->stream));
        return MOE_OK;
    }
    int nonfinite = 0;
    MOE_CUDA_TRY(cudaMemcpyAsync(&nonfinite, gpu->flag, sizeof nonfinite, cudaMemcpyDeviceToHost, gpu->stream));
    MOE_TRY(moe_gpu_wait(gpu, "router: non-finite logits check"));
    return nonfinite ? moe_fail(MOE_ERR_NONFINITE, "non-finite router logits (NaN or Inf)") : MOE_OK;
}

extern "C" moe_status moe_router_scores_cuda(moe_gpu *gpu, moe_score_func func, const float *logits, const float *bias,
                                             int num_tokens, int num_experts, float *scores, float *select_scores) {
    if (num_tokens < 0 || num_experts < 1 || (bias && !select_scores)) return MOE_ERR_INVALID_ARG;
    if (num_tokens == 0) return MOE_OK;
    scores_forward<<<row_blocks(num_tokens), kRowThreads, 0, gpu->stream>>>(func, logits, bias, num_tokens,
                                                                          num_experts, scores, select_scores);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

extern "C" moe_status moe_router_scores_backward_cuda(moe_gpu *gpu, moe_score_func func, const float *scores,
                                                      const float *dscores, int num_tokens, int num_experts,
                                                      float *dlogits) {
    if (num_tokens < 0 || num_experts < 1) return MOE_ERR_INVALID_ARG;
    if (num_tokens == 0) return MOE_OK;
    scores_backward<<<row_blocks(num_tokens), kRowThreads, 0, gpu->stream>>>(func, scores, dscores, num_tokens,
                                                                           num_experts, dlogits);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

extern "C" moe_status moe_router_logits_backward_cuda(moe_gpu *gpu, const moe_linear_plan *rows, const float *x,
                                                      const float *router_w, const float *dlogits, int num_tokens,
                                                      int d_model, int num_experts, float *drouter_w, float *dx) {
    if (num_tokens < 0 || d_model < 0 || num_experts < 1) return MOE_ERR_INVALID_ARG;
    if (num_tokens == 0 || d_model == 0) return MOE_OK; /* += of an empty product */
    const moe_linear_plan one_call = {};
    if (drouter_w) /* one call over the tokens: the sum over them is the caller's (a shard's rows, or all) */
        MOE_TRY(moe_linear_backward_weight_cuda(gpu, &one_call, dlogits, x, num_tokens, d_model, num_experts, 1,
                                                drouter_w));
    if (dx)
        MOE_TRY(moe_linear_backward_input_cuda(gpu, rows ? rows : &one_call, dlogits, router_w, num_tokens, d_model,
                                               num_experts, 1, dx));
    return MOE_OK;
}
