/* routing.h — the routing of one micro-batch: every buffer the router fills, with its size formula.
 * T = num_tokens, E = num_experts, k = top_k, R = num_ranks. An assignment a = t*k + j is token t's j-th
 * choice (j = 0 is the best). */
#ifndef MOE_ROUTER_ROUTING_H
#define MOE_ROUTER_ROUTING_H

#include "core/types.h"

typedef struct {
    int num_tokens, num_experts, top_k, num_ranks;
    moe_real *logits;             /* [T*E] x Wr^T                                              */
    moe_real *scores;             /* [T*E] softmax probabilities or sigmoid affinities          */
    moe_real *select_scores;      /* [T*E] what top-k ranks: scores, plus the bias for sigmoid   */
    int *expert;                  /* [T*k] chosen expert ids, best first                        */
    moe_real *gate;               /* [T*k] combine weights (renormalised over the k if asked)   */
    moe_real *expert_score;       /* [T*k] scores[t, expert[t*k+j]]: the drop priority by score  */
    unsigned char *kept;          /* [T*k] 1 if the assignment fits the expert's capacity       */
    int *slot;                    /* [T*k] row of the assignment in the permuted buffer, or -1   */
    int *num_selected_per_expert; /* [E]   top-k assignments per expert, before capacity        */
    int *num_tokens_per_expert;   /* [E]   kept assignments per expert                          */
    int *expert_offset;           /* [E+1] exclusive scan of num_tokens_per_expert              */
    int *num_tokens_per_rank;     /* [R]   kept rows each rank receives (experts contiguous)    */
    int *perm_token;              /* [T*k] source token of permuted row r, r < num_kept          */
    int capacity;                 /* C = ceil(cf*T*k/E), or 0 when dropless                     */
    int num_kept, num_dropped;
} moe_routing;

/* Allocates the buffers for up to max_tokens tokens (num_tokens is set per forward). */
moe_status moe_routing_alloc(moe_routing *r, int max_tokens, int num_experts, int top_k, int num_ranks);
void moe_routing_free(moe_routing *r);

/* From expert_offset[E + 1]: num_tokens_per_rank (rank q owns experts [q*E/R, (q+1)*E/R)), num_kept and
 * num_dropped — the host-side totals every backend's dispatch layout ends with. */
void moe_routing_count_totals(moe_routing *r);

#endif
