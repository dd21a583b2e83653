/* layout_cpu.c — counts, offsets and the stable (expert, token) permutation of the kept assignments. */
#include "router/layout.h"

void moe_router_dispatch_layout_cpu(const int *expert, const unsigned char *kept, int num_tokens, int num_experts,
                                    int top_k, int *slot, int *perm_token, int *num_tokens_per_expert,
                                    int *expert_offset) {
    const int A = num_tokens * top_k, E = num_experts;
    int *count = num_tokens_per_expert, *offset = expert_offset;
    for (int e = 0; e < E; e++) count[e] = 0;
    for (int a = 0; a < A; a++) count[expert[a]] += kept[a];
    offset[0] = 0;
    for (int e = 0; e < E; e++) offset[e + 1] = offset[e] + count[e];

    /* Filling in token order makes the rows of each expert ascend by token: a stable counting sort. The
     * counts serve as running fill levels and come back to their values at the end. */
    for (int e = 0; e < E; e++) count[e] = 0;
    for (int a = 0; a < A; a++) {
        if (!kept[a]) {
            slot[a] = -1;
            continue;
        }
        int e = expert[a], row = offset[e] + count[e]++;
        slot[a] = row;
        perm_token[row] = a / top_k;
    }
}
