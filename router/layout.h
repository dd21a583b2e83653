/* layout.h — the dispatch layout, computed apart from any exchange (DeepEP's split). CPU. */
#ifndef MOE_ROUTER_LAYOUT_H
#define MOE_ROUTER_LAYOUT_H

#include "router/routing.h"
#include "core/gpu.h"

/* Reads r->expert and r->kept; writes num_tokens_per_expert, expert_offset (exclusive scan),
 * num_tokens_per_rank (rank q owns experts [q*E/R, (q+1)*E/R)), num_kept, num_dropped, and the stable
 * permutation: kept rows ordered by expert, then token (slot[a] = row, perm_token[row] = token;
 * slot[a] = -1 for a dropped assignment). Expert-major order is also rank-major, so each destination
 * rank's rows are one contiguous block. */
void moe_router_dispatch_layout_cpu(moe_routing *r);

/* CUDA, device arrays: the same layout from expert[T*k] and kept[T*k] by a stable CUB radix sort of
 * (kept ? expert : E) keys with assignment-index values, a histogram and an exclusive scan.
 * Writes slot[T*k], perm_token[num_kept], and num_tokens_per_expert[E] and expert_offset[E + 1] on the
 * device; synchronous, and also copies those two to the host arrays (not NULL) the dispatch plan needs. */
moe_status moe_router_dispatch_layout_cuda(moe_gpu *gpu, const int *expert, const unsigned char *kept, int num_tokens,
                                       int num_experts, int top_k, int *slot, int *perm_token,
                                       int *num_tokens_per_expert, int *expert_offset,
                                       int *num_tokens_per_expert_host, int *expert_offset_host);

#endif
