/* layout_cpu.c — counts, offsets and the stable (expert, token) permutation of the kept assignments. */
#include "router/layout.h"

void router_dispatch_layout_cpu(moe_routing *r) {
    int T = r->num_tokens, k = r->top_k, E = r->num_experts, R = r->num_ranks;
    int *count = r->num_tokens_per_expert, *offset = r->expert_offset;
    for (int e = 0; e < E; e++) count[e] = 0;
    for (int a = 0; a < T * k; a++) count[r->expert[a]] += r->kept[a];
    offset[0] = 0;
    for (int e = 0; e < E; e++) offset[e + 1] = offset[e] + count[e];
    for (int q = 0; q < R; q++) r->num_tokens_per_rank[q] = offset[(q + 1) * (E / R)] - offset[q * (E / R)];
    r->num_kept = offset[E];
    r->num_dropped = T * k - r->num_kept;

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
