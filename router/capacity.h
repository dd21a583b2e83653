/* capacity.h — capacity limiting: at most C kept assignments per expert, over the global batch.
 *
 *   C = ceil(cf * T_global * k / E), or 0 (dropless) when cf <= 0.
 *   Within one expert the kept assignments are the first C in priority order:
 *     MOE_DROP_BY_TOKEN_ORDER: global token index ascending (world-rank order, then token order);
 *     MOE_DROP_BY_SCORE: router score (scores[t, e], before renormalisation) descending, ties by token.
 * A token never picks an expert twice, so each expert sees each token at most once; a token whose
 * assignment is dropped keeps its other assignments. The kept sets are those of one rank holding the whole
 * batch, whatever the layout. */
#ifndef MOE_ROUTER_CAPACITY_H
#define MOE_ROUTER_CAPACITY_H

#include "alltoall/dispatch.h"
#include "alltoall/parallel.h"
#include "router/routing.h"

/* C for T tokens: 0 for cf <= 0 (dropless), else ceil(cf * T * k / E) between 1 and T. Computed in double with a
 * relative slack of float's epsilon (2^-23), so that a float cf of 1.1 with T*k/E = 10 gives 11 and not 12. */
int moe_router_capacity(float capacity_factor, int num_tokens, int top_k, int num_experts);

/* The rule on the routing of a whole batch held by one rank — the reference the distributed rule is tested
 * against. Reads expert[T*k] and (by score) expert_score[T*k]; writes kept[T*k], num_selected[E] (top-k
 * assignments per expert, before capacity) and *capacity. */
moe_status moe_router_apply_capacity_cpu(const int *expert, const moe_real *expert_score, int num_tokens,
                                         int num_experts, int top_k, float capacity_factor,
                                         moe_drop_priority priority, unsigned char *kept, int *num_selected,
                                         int *capacity);

/* The same rule over `world`, every rank passing its own T = counts->num_tokens tokens (host arrays), with
 * control traffic per rank O(E + T*k), never the whole global routing:
 *   every priority: one scan of [T, non-finite flag, per-expert counts] over the ranks
 *     (moe_comm_scan_sum_ints) gives the global batch size, this rank's first global token, how many ranks'
 *     router logits were non-finite (counts->nonfinite_local in, nonfinite_ranks out), the global counts
 *     n_e and the counts of the ranks before this one;
 *   dropless: nothing more;
 *   by token order: an assignment is kept when (assignments to its expert on earlier ranks) + (its place
 *     among this rank's) < C;
 *   by score: each expert's candidates (score, global token) go to the expert's decider, world rank
 *     e % W, which finds the C-th best and sends back that threshold and how many of each rank's
 *     candidates it keeps (two small alltoalls and two alltoallvs of about T*k rows in all).
 * Writes kept[T*k] and every field of counts. Collective. */
moe_status moe_router_global_capacity(moe_comm *world, float capacity_factor, moe_drop_priority priority,
                                      int num_experts, int top_k, const int *expert, const moe_real *expert_score,
                                      unsigned char *kept, moe_routing_counts *counts);

/* The count cross-check of the dispatch. Each rank sends, beside the rows it announces per expert, a
 * witness of MOE_COUNT_WITNESS_INTS ints per global expert from which the receiver derives what the
 * capacity rule lets that rank send: its selected count and the count of the ranks before it (token
 * order: min(max(C - before, 0), selected)), and the decider's kept count (by score). */
enum { MOE_COUNT_WITNESS_INTS = 3 };
void moe_router_count_witness(const moe_routing_counts *counts, int num_experts, int *witness);

/* Receiver side: after moe_dispatch_plan_exchange with the witnesses, every entry a peer announces
 * differently from what the rule lets it send is named (ranks, layer, expert, both counts) in the failure
 * message; MOE_ERR_COUNT_MISMATCH. C and the priority are this rank's own. */
moe_status moe_router_check_announced(const moe_dispatch_plan *plan, const moe_routing_counts *counts,
                                      moe_drop_priority priority, moe_ranks ranks, int layer_index);

#endif
