/* layout_cpu.c — counts, offsets and the stable (expert, token) permutation of the kept assignments. */
#include "router/layout.h"

void moe_router_dispatch_layout_cpu(moe_routing *r) {
    int T = r->num_tokens, k = r->top_k, E = r->num_experts;
    int *count = r->num_tokens_per_expert, *offset = r->expert_offset;
    for (int e = 0; e < E; e++) count[e] = 0;
    for (int a = 0; a < T * k; a++) count[r->expert[a]] += r->kept[a];
    offset[0] = 0;
    for (int e = 0; e < E; e++) offset[e + 1] = offset[e] + count[e];
    moe_routing_count_totals(r);

    /* Filling in token order makes the rows of each expert ascend by token: a stable counting sort. */
    for (int e = 0; e < E; e++) count[e] = 0;
    for (int a = 0; a < T * k; a++) {
        int e = r->expert[a];
        if (!r->kept[a]) {
            r->slot[a] = -1;
            continue;
        }
        int row = offset[e] + count[e]++;
        r->slot[a] = row;
        r->perm_token[row] = a / k;
    }
}
