/* group.h — group-limited routing (DeepSeek-V3's and V2's): the E experts in G equal groups; a token keeps the
 * selection scores of its best topk_groups groups and -inf elsewhere, so that top-k (router/topk.h) chooses only among
 * those. A group's score (moe_config.group_score) is the sum of its two best selection scores (scores plus the
 * selection bias under sigmoid routing: DeepSeek-V3's) or its best one (DeepSeek-V2's group_limited_greedy); the best
 * groups are those of the largest scores, ties to the lower group id. Per token: a pure function of its own scores, so
 * bitwise the same on every layout. CPU and CUDA. */
#ifndef MOE_ROUTER_GROUP_H
#define MOE_ROUTER_GROUP_H

#include "core/gpu.h"
#include "core/types.h"

enum { MOE_ROUTER_MAX_GROUPS = 64 };
/* A group's score: the sum of its two best selection scores (DeepSeek-V3's), or its best (DeepSeek-V2's). */
enum { MOE_GROUP_SCORE_TOP2 = 0, MOE_GROUP_SCORE_MAX = 1 };

/* masked [T, E] from select [T, E] (masked may be select). 2 <= E / groups, 1 <= topk_groups <= groups <= 64. */
void moe_router_group_mask_cpu(const moe_real *select, int num_tokens, int num_experts, int groups, int topk_groups,
                               int group_score, moe_real *masked);

/* The same on the GPU (float, device pointers, one thread per token), queued on gpu's stream; bitwise the CPU's
 * choices (sums of two floats, compared). Only in builds with CUDA. */
moe_status moe_router_group_mask_cuda(moe_gpu *gpu, const float *select, int num_tokens, int num_experts, int groups,
                                      int topk_groups, int group_score, float *masked);

#endif
