/* layout.h — the dispatch layout, computed apart from any exchange (DeepEP's split). CPU and CUDA.
 *
 * From expert[T*k] and kept[T*k]: num_tokens_per_expert[E] (kept rows per expert), expert_offset[E + 1]
 * (their exclusive scan), and the stable permutation of the kept assignments, ordered by expert, then
 * token: slot[a] = its row (-1 when dropped), perm_token[row] = its token. Expert-major order is also
 * rank-major (rank q owns experts [q*E/R, (q+1)*E/R)), so each destination rank's rows are one block. */
#ifndef MOE_ROUTER_LAYOUT_H
#define MOE_ROUTER_LAYOUT_H

#include "core/gpu.h"
#include "core/types.h"

void moe_router_dispatch_layout_cpu(const int *expert, const unsigned char *kept, int num_tokens, int num_experts,
                                    int top_k, int *slot, int *perm_token, int *num_tokens_per_expert,
                                    int *expert_offset);

/* The same on device arrays, by a stable CUB radix sort of (kept ? expert : E) keys with assignment-index
 * values, a histogram and an exclusive scan. num_tokens_per_expert_host and expert_offset_host (either may
 * be NULL) receive copies of the device counts and offsets asynchronously: they are complete at the next
 * synchronisation of gpu's stream (pinned host memory keeps the copies asynchronous). No host sync. */
moe_status moe_router_dispatch_layout_cuda(moe_gpu *gpu, const int *expert, const unsigned char *kept, int num_tokens,
                                           int num_experts, int top_k, int *slot, int *perm_token,
                                           int *num_tokens_per_expert, int *expert_offset,
                                           int *num_tokens_per_expert_host, int *expert_offset_host);

#endif
