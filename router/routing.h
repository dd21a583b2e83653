/* routing.h — what the router decides for one micro-batch on one rank, as two objects:
 *
 *   moe_token_routing   per-token arrays, in the runtime's memory (host on the CPU, device on CUDA);
 *   moe_routing_counts  per-expert counts and the batch's totals, always on the host.
 *
 * T = tokens of this rank, E = experts, k = top_k. An assignment a = t*k + j is token t's j-th choice
 * (j = 0 is the best). */
#ifndef MOE_ROUTER_ROUTING_H
#define MOE_ROUTER_ROUTING_H

#include "core/types.h"

/* The per-token arrays: X(type, name, elements per token, what it holds). One list gives the struct and
 * the allocation (moe/layer.c), so an array is added in one place. */
#define MOE_TOKEN_ROUTING_ARRAYS(X)                                                                     \
    X(moe_real, logits, E, "x Wr^T")                                                                    \
    X(moe_real, scores, E, "softmax probabilities or sigmoid affinities")                               \
    X(moe_real, select_scores, E, "what top-k ranks: the scores, plus the bias for sigmoid routing")    \
    X(int, expert, k, "chosen expert ids, best first")                                                  \
    X(moe_real, gate, k, "combine weights (renormalised over the k if asked)")                          \
    X(moe_real, expert_score, k, "scores[t, expert[a]]: the drop priority by score")                    \
    X(unsigned char, kept, k, "1 if the assignment fits its expert's capacity")                         \
    X(int, slot, k, "row of the assignment in the permuted buffer, or -1 when dropped")                 \
    X(int, perm_token, k, "source token of permuted row r, r < total_kept")

typedef struct {
#define MOE__TOKEN_ROUTING_FIELD(type, name, per_token, what) type *name;
    MOE_TOKEN_ROUTING_ARRAYS(MOE__TOKEN_ROUTING_FIELD)
#undef MOE__TOKEN_ROUTING_FIELD
} moe_token_routing;

/* Host counts of one forward (every array [E]). */
typedef struct {
    int num_tokens;               /* T of this rank                                                   */
    int num_tokens_global;        /* T summed over the world                                          */
    int first_token;              /* global index of this rank's first token (world-rank order)       */
    int capacity;                 /* C = ceil(cf * T_global * k / E), or 0 when dropless              */
    int *num_selected_local;      /* this rank's top-k assignments per expert, before capacity        */
    int *num_selected_before;     /* the same summed over the world ranks before this one             */
    int *num_selected_per_expert; /* summed over the world: the n_e of the load-balancing loss         */
    int *num_tokens_per_expert;   /* this rank's kept assignments per expert: the rows it sends       */
    int *kept_by_decider;         /* drop by score: this rank's kept count per expert as the expert's
                                     decider found it (router/capacity.h); else unused                */
    int total_kept, total_dropped; /* this rank's                                                      */
    int nonfinite_local;          /* in: this rank's router logits held a NaN or an Inf               */
    int nonfinite_ranks;          /* out: how many ranks' did (the capacity scan carries it)          */
} moe_routing_counts;

moe_status moe_routing_counts_alloc(moe_routing_counts *c, int num_experts);
void moe_routing_counts_free(moe_routing_counts *c);

#endif
