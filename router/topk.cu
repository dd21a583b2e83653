/* topk.cu — top-k expert selection on the GPU: one warp per token, k rounds of a warp arg-max.
 * Order: higher score first, equal scores to the lower expert id — the exact order of moe_router_topk_cpu,
 * so the choices match bitwise. Checked against the CPU by tests/test_gpu_topk.cu (suite gpu). */
#include <limits.h>

#include "core/gpu_cuda.h"

extern "C" {
#include "router/topk.h"
}

namespace {

constexpr int kWarp = 32;
constexpr int kMaxTopK = 32;
constexpr int kWarpsPerBlock = 4;

struct candidate {
    float score;
    int expert; /* INT_MAX: no candidate */
};

__device__ bool better(candidate a, candidate b) {
    if (a.expert == INT_MAX || b.expert == INT_MAX) return a.expert < b.expert;
    return a.score > b.score || (a.score == b.score && a.expert < b.expert);
}

__global__ void topk_warp_per_token(const float *scores, int num_tokens, int num_experts, int top_k,
                                    int *expert) {
    int token = blockIdx.x * kWarpsPerBlock + threadIdx.x / kWarp;
    int lane = threadIdx.x % kWarp;
    if (token >= num_tokens) return;
    const float *s = scores + (size_t)token * num_experts;
    int chosen[kMaxTopK];
    for (int j = 0; j < top_k; j++) {
        candidate best = {0.0f, INT_MAX};
        for (int e = lane; e < num_experts; e += kWarp) {
            bool taken = false;
            for (int i = 0; i < j; i++) taken |= chosen[i] == e;
            candidate c = {s[e], e};
            if (!taken && better(c, best)) best = c;
        }
        for (int offset = kWarp / 2; offset > 0; offset /= 2) {
            candidate other = {__shfl_xor_sync(0xffffffffu, best.score, offset),
                               __shfl_xor_sync(0xffffffffu, best.expert, offset)};
            if (better(other, best)) best = other;
        }
        chosen[j] = best.expert; /* every lane holds the same winner after the butterfly */
    }
    if (lane == 0)
        for (int j = 0; j < top_k; j++) expert[(size_t)token * top_k + j] = chosen[j];
}

} // namespace

extern "C" moe_status moe_router_topk_cuda(moe_gpu *gpu, const float *select_scores, int num_tokens, int num_experts,
                                           int top_k, int *expert) {
    if (num_tokens < 0 || num_experts < 1 || top_k < 1 || top_k > num_experts || top_k > kMaxTopK ||
        num_experts > 1024)
        return MOE_ERR_INVALID_ARG;
    if (num_tokens == 0) return MOE_OK;
    int blocks = (num_tokens + kWarpsPerBlock - 1) / kWarpsPerBlock;
    topk_warp_per_token<<<blocks, kWarpsPerBlock * kWarp, 0, gpu->stream>>>(select_scores, num_tokens, num_experts,
                                                                           top_k, expert);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}
