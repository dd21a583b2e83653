/* global_routing.h — capacity on the global micro-batch under any parallel layout.
 *
 * Every rank gathers the top-k choices (and, for priority by score, their scores) of every rank's tokens,
 * in world-rank order, and runs the single-rank capacity rule (router/capacity.h) on that global routing.
 * The kept set is therefore exactly that of a one-rank run on the same global batch, for any W and ep;
 * the cost is an allgather of T*k ints (plus T*k reals by score), ~1/d of the payload exchange.
 * The same global routing tells each rank how many rows every EP peer must send it, which the dispatch
 * checks against what the peers announce. */
#ifndef MOE_GLOBAL_ROUTING_H
#define MOE_GLOBAL_ROUTING_H

#include "alltoall/parallel.h"
#include "router/routing.h"

typedef struct {
    moe_routing routing;   /* the global batch: expert, expert_score, kept, num_selected_per_expert */
    int *first_token;      /* [W + 1] global index of each world rank's first token                 */
    int max_tokens;        /* what routing is allocated for                                        */
} moe_global_routing;

void moe_global_routing_free(moe_global_routing *g);

/* Gathers `local` over par->world, applies capacity globally, and writes back into `local`: kept (this
 * rank's slice), capacity, and num_selected_per_expert (global counts, as the aux loss wants). */
moe_status moe_global_capacity(const moe_parallel *par, float capacity_factor, moe_drop_priority priority,
                               moe_routing *local, moe_global_routing *g);

/* expected[p * E_local + le]: kept rows that EP peer p sends this rank for its local expert le. */
void moe_global_expected_recv_counts(const moe_parallel *par, const moe_global_routing *g, int *expected);

#endif
