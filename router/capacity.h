/* capacity.h — capacity limiting: at most C kept assignments per expert. CPU. */
#ifndef MOE_ROUTER_CAPACITY_H
#define MOE_ROUTER_CAPACITY_H

#include "router/routing.h"

/* C = ceil(cf * T * k / E), or 0 (dropless) when cf <= 0. Computed in double with a relative slack of
 * 1e-6, so that a float cf of 1.1 with T*k/E = 10 gives 11 and not 12. */
int moe_router_capacity(float capacity_factor, int num_tokens, int top_k, int num_experts);

/* Reads r->expert and r->expert_score; writes r->kept, r->num_selected_per_expert and r->capacity.
 * Within one expert, the kept assignments are the first C in priority order:
 *   MOE_DROP_BY_TOKEN_ORDER: token index ascending;
 *   MOE_DROP_BY_SCORE: router score (scores[t, e], before renormalisation) descending, ties by token.
 * Under expert parallelism the layer runs this on the routing of the whole global batch (every rank's
 * tokens in rank order), so the drops are those of a single-rank run whatever the layout. 
 * A token never picks an expert twice, so each expert sees each token at most once. A token whose
 * assignment is dropped keeps its other assignments. */
moe_status moe_router_apply_capacity_cpu(moe_routing *r, float capacity_factor, moe_drop_priority priority);

/* No CUDA version, on purpose: under any layout the rule runs on the gathered global routing (T*k ints,
 * moe/global_routing.h), which every rank needs on the host anyway to check the counts exchange, so the
 * GPU layer runs this same function and its drops equal the CPU path's by construction. */

#endif
