/* topk.h — top-k expert selection per token; ties go to the lower expert id. CPU and CUDA. */
#ifndef MOE_ROUTER_TOPK_H
#define MOE_ROUTER_TOPK_H

#include "core/gpu.h"
#include "core/types.h"

/* expert[t*k + j] = id of the j-th largest select_scores[t, :], best first; among equal scores the
 * lower id ranks first, so the result is a pure function of the scores. */
void moe_router_topk_cpu(const moe_real *select_scores, int num_tokens, int num_experts, int top_k, int *expert);

/* The same on the GPU, on device pointers, float scores (k <= 32, E <= 1024), queued on gpu's stream (no host
 * sync).
 * Bitwise the same choices as moe_router_topk_cpu. Only in builds with CUDA (libmoe_cuda). */
moe_status moe_router_topk_cuda(moe_gpu *gpu, const float *select_scores, int num_tokens, int num_experts, int top_k,
                                int *expert);

#endif
