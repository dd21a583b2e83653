/* layout.h — the dispatch layout, computed apart from any exchange (DeepEP's split). CPU. */
#ifndef MOE_ROUTER_LAYOUT_H
#define MOE_ROUTER_LAYOUT_H

#include "router/routing.h"

/* Reads r->expert and r->kept; writes num_tokens_per_expert, expert_offset (exclusive scan),
 * num_tokens_per_rank (rank q owns experts [q*E/R, (q+1)*E/R)), num_kept, num_dropped, and the stable
 * permutation: kept rows ordered by expert, then token (slot[a] = row, perm_token[row] = token;
 * slot[a] = -1 for a dropped assignment). Expert-major order is also rank-major, so each destination
 * rank's rows are one contiguous block. */
void router_dispatch_layout_cpu(moe_routing *r);

#endif
