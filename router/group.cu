/* group.cu — group-limited routing's mask on the GPU (router/group.h): one thread per token, the CPU's loops in its
 * order (a group's two best, their sum rounded once or the best alone, arg-max passes with a strict '>'), so the kept
 * groups are the CPU's bit for bit. Checked against the CPU by tests/test_gpu_topk.cu (suite gpu). */
#include <math.h>

#include "core/gpu_cuda.h"

extern "C" {
#include "router/group.h"
}

namespace {

constexpr int kThreads = 128;

__global__ void group_mask_kernel(const float *select, int num_tokens, int num_experts, int groups, int topk_groups,
                                  bool by_max, float *masked) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= num_tokens) return;
    const int size = num_experts / groups;
    const float *s = select + (size_t)t * num_experts;
    float *out = masked + (size_t)t * num_experts;
    float score[MOE_ROUTER_MAX_GROUPS];
    bool kept[MOE_ROUTER_MAX_GROUPS];
    for (int g = 0; g < groups; g++) {
        float a = -INFINITY, b = -INFINITY;
        for (int i = g * size; i < (g + 1) * size; i++) {
            if (s[i] > a) b = a, a = s[i];
            else if (s[i] > b) b = s[i];
        }
        score[g] = by_max ? a : __fadd_rn(a, b), kept[g] = false;
    }
    for (int j = 0; j < topk_groups; j++) {
        int best = -1;
        for (int g = 0; g < groups; g++)
            if (!kept[g] && (best < 0 || score[g] > score[best])) best = g;
        kept[best] = true;
    }
    for (int e = 0; e < num_experts; e++) out[e] = kept[e / size] ? s[e] : -INFINITY;
}

} // namespace

extern "C" moe_status moe_router_group_mask_cuda(moe_gpu *gpu, const float *select, int num_tokens, int num_experts,
                                                 int groups, int topk_groups, int group_score, float *masked) {
    const int least_size = group_score == MOE_GROUP_SCORE_TOP2 ? 2 : 1; /* the max takes groups of one expert */
    if (num_tokens < 0 || groups < 2 || groups > MOE_ROUTER_MAX_GROUPS || num_experts % groups ||
        num_experts / groups < least_size || topk_groups < 1 || topk_groups > groups ||
        (group_score != MOE_GROUP_SCORE_TOP2 && group_score != MOE_GROUP_SCORE_MAX))
        return MOE_ERR_INVALID_ARG;
    if (num_tokens == 0) return MOE_OK;
    if (!select || !masked) return MOE_ERR_INVALID_ARG;
    group_mask_kernel<<<(num_tokens + kThreads - 1) / kThreads, kThreads, 0, gpu->stream>>>(
        select, num_tokens, num_experts, groups, topk_groups, group_score == MOE_GROUP_SCORE_MAX, masked);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}
