/* plan/routing.h — the routing a model really has, for moe-plan --routing-from: the tokens each expert got per MoE
 * layer and step of a moe-train run (its metrics.jsonl, "expert_tokens"), and the imbalance that routing gives an
 * EP layout.
 *
 * Each MoE layer waits at its exchanges for the EP rank whose experts got the most rows, so a layer's expert work
 * and received rows are those of the busiest rank, not the mean (docs/SCALING.md "Routing skew"). The skew of an ep
 * is that busiest rank's rows over the mean, averaged over every (step, layer) sample of the file:
 *     skew(ep) = mean over samples of  max_g rows(g) / (rows / ep),  g = the ep groups of E/ep consecutive experts
 * (README "Ranks and experts": EP rank g holds experts [g E/ep, (g+1) E/ep)). 1 is balanced; ep 1 is always 1.
 * Under world-invariant training the routing is the same bits for every layout, so one run's log (any world size)
 * gives the skew of every ep. */
#ifndef MOE_PLAN_ROUTING_H
#define MOE_PLAN_ROUTING_H

#include <stdint.h>

#include "core/types.h"

typedef struct {
    int64_t num_experts, num_samples; /* samples: one per MoE layer of each step record */
    double *tokens;                   /* [num_samples][num_experts] */
} moe_plan_routing;

/* Every step record of a moe-train metrics.jsonl. MOE_ERR_BAD_FILE (or the file's own error) with a message naming
 * the file and line: not JSON, expert_tokens of the wrong shape, experts that differ between layers, or no MoE
 * layer at all (a one-expert model). */
moe_status moe_plan_routing_load(const char *path, moe_plan_routing *out);
void moe_plan_routing_free(moe_plan_routing *r);

/* skew(ep) above; ep divides num_experts. */
double moe_plan_routing_skew(const moe_plan_routing *r, int64_t ep);

#endif
