/* routing.c — the host counts of a routing (routing.h). */
#include "router/routing.h"

#include <stdlib.h>
#include <string.h>

moe_status moe_routing_counts_alloc(moe_routing_counts *c, int num_experts) {
    memset(c, 0, sizeof *c);
    int *all = calloc((size_t)5 * num_experts, sizeof(int)); /* the five [E] arrays, in one block */
    if (!all) return MOE_ERR_OUT_OF_MEMORY;
    c->num_selected_local = all;
    c->num_selected_before = all + num_experts;
    c->num_selected_per_expert = all + 2 * num_experts;
    c->num_tokens_per_expert = all + 3 * num_experts;
    c->kept_by_decider = all + 4 * num_experts;
    return MOE_OK;
}

void moe_routing_counts_free(moe_routing_counts *c) {
    free(c->num_selected_local);
    memset(c, 0, sizeof *c);
}
