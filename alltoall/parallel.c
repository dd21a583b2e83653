/* parallel.c — a layout's accessors, the one-process layout, and teardown. */
#include "alltoall/parallel.h"

#include <stdlib.h>

struct moe_parallel {
    moe_ranks ranks;
    moe__parallel_comms c; /* c.stage may be c.world (pp = 1), c.data c.stage (tp = 1) */
};

moe_ranks moe_parallel_ranks(const moe_parallel *p) { return p->ranks; }
moe_comm *moe_parallel_world(const moe_parallel *p) { return p->c.world; }
moe_comm *moe_parallel_stage(const moe_parallel *p) { return p->c.stage; }
moe_comm *moe_parallel_pipeline(const moe_parallel *p) { return p->c.pipeline; }
moe_comm *moe_parallel_ep(const moe_parallel *p) { return p->c.ep; }
moe_comm *moe_parallel_expert_dp(const moe_parallel *p) { return p->c.expert_dp; }
moe_comm *moe_parallel_tensor(const moe_parallel *p) { return p->c.tensor; }
moe_comm *moe_parallel_data(const moe_parallel *p) { return p->c.data; }

static void destroy_comms(moe__parallel_comms *c) {
    if (c->data != c->stage) moe_comm_destroy(c->data);
    if (c->stage != c->world) moe_comm_destroy(c->stage);
    moe_comm_destroy(c->world), moe_comm_destroy(c->pipeline), moe_comm_destroy(c->ep), moe_comm_destroy(c->expert_dp);
    moe_comm_destroy(c->tensor);
}

moe_status moe__parallel_assemble(moe_ranks ranks, moe__parallel_comms comms, moe_parallel **out) {
    if (!comms.stage) comms.stage = comms.world;
    if (!comms.data) comms.data = comms.stage;
    moe__parallel_comms *c = &comms;
    moe_parallel *p =
        c->world && c->stage && c->pipeline && c->ep && c->expert_dp && c->tensor ? calloc(1, sizeof *p) : NULL;
    if (!p) {
        destroy_comms(c);
        return MOE_ERR_OUT_OF_MEMORY;
    }
    *p = (moe_parallel){.ranks = ranks, .c = comms};
    *out = p;
    return MOE_OK;
}

double moe_parallel_set_timeout(const moe_parallel *p, double seconds) {
    const double before = moe_comm_timeout(p->c.world);
    moe_comm *const all[] = {p->c.world, p->c.stage, p->c.pipeline, p->c.ep, p->c.expert_dp, p->c.tensor, p->c.data};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) moe_comm_set_timeout(all[i], seconds);
    return before;
}

moe_ranks moe__parallel_ranks_one(void) {
    return (moe_ranks){.world_size = 1, .pp_size = 1, .stage_size = 1, .ep_size = 1, .edp_size = 1, .tp_size = 1,
                       .dp_size = 1};
}

moe_status moe_parallel_create_self(moe_parallel **out) {
    if (!out) return MOE_ERR_INVALID_ARG;
    moe__parallel_comms c = {0};
    moe_comm_create_self("world", &c.world), moe_comm_create_self("pipeline", &c.pipeline);
    moe_comm_create_self("ep", &c.ep), moe_comm_create_self("expert-dp", &c.expert_dp);
    moe_comm_create_self("tensor", &c.tensor);
    return moe__parallel_assemble(moe__parallel_ranks_one(), c, out);
}

void moe_parallel_destroy(moe_parallel *p) {
    if (!p) return;
    destroy_comms(&p->c);
    free(p);
}
