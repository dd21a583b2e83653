/* parallel.c — a layout's accessors, the one-process layout, and teardown. */
#include "alltoall/parallel.h"

#include <stdlib.h>

struct moe_parallel {
    moe_ranks ranks;
    moe_comm *world, *ep, *expert_dp;
};

moe_ranks moe_parallel_ranks(const moe_parallel *p) { return p->ranks; }
moe_comm *moe_parallel_world(const moe_parallel *p) { return p->world; }
moe_comm *moe_parallel_ep(const moe_parallel *p) { return p->ep; }
moe_comm *moe_parallel_expert_dp(const moe_parallel *p) { return p->expert_dp; }

moe_status moe__parallel_assemble(moe_ranks ranks, moe_comm *world, moe_comm *ep, moe_comm *expert_dp,
                                  moe_parallel **out) {
    moe_parallel *p = world && ep && expert_dp ? calloc(1, sizeof *p) : NULL;
    if (!p) {
        moe_comm_destroy(world), moe_comm_destroy(ep), moe_comm_destroy(expert_dp);
        return MOE_ERR_OUT_OF_MEMORY;
    }
    *p = (moe_parallel){.ranks = ranks, .world = world, .ep = ep, .expert_dp = expert_dp};
    *out = p;
    return MOE_OK;
}

moe_status moe_parallel_create_self(moe_parallel **out) {
    moe_comm *world = NULL, *ep = NULL, *dp = NULL;
    moe_comm_create_self("world", &world), moe_comm_create_self("ep", &ep), moe_comm_create_self("expert-dp", &dp);
    const moe_ranks one = {.world_size = 1, .ep_size = 1, .dp_size = 1};
    return moe__parallel_assemble(one, world, ep, dp, out);
}

void moe_parallel_destroy(moe_parallel *p) {
    if (!p) return;
    moe_comm_destroy(p->world);
    moe_comm_destroy(p->ep);
    moe_comm_destroy(p->expert_dp);
    free(p);
}
