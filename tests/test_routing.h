/* test_routing.h — a whole batch's routing held on the host, as the capacity and layout unit tests build it:
 * the library's per-token arrays and host counts (router/routing.h) in one struct, filled by the single-rank
 * capacity rule and the CPU layout. */
#ifndef MOE_TESTS_TEST_ROUTING_H
#define MOE_TESTS_TEST_ROUTING_H

#include "core/types.h"

typedef struct {
    int num_tokens, num_experts, top_k, num_ranks;
    moe_real *scores;             /* [T*E] */
    int *expert;                  /* [T*k] */
    moe_real *expert_score;       /* [T*k] */
    unsigned char *kept;          /* [T*k] */
    int *slot, *perm_token;       /* [T*k] */
    int *num_selected_per_expert; /* [E] */
    int *num_tokens_per_expert;   /* [E] */
    int *expert_offset;           /* [E + 1] */
    int *num_tokens_per_rank;     /* [R]: rows of each rank's block of experts */
    int capacity, num_kept, num_dropped;
} test_routing;

moe_status test_routing_alloc(test_routing *r, int max_tokens, int num_experts, int top_k, int num_ranks);
void test_routing_free(test_routing *r);
/* moe_router_apply_capacity_cpu on r's choices. */
moe_status test_routing_capacity(test_routing *r, float capacity_factor, moe_drop_priority priority);
/* moe_router_dispatch_layout_cpu on r's choices and kept flags, then the per-rank counts and the totals. */
void test_routing_layout(test_routing *r);

#endif
