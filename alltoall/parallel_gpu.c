/* parallel_gpu.c — the one-process GPU layout: self-gpu transports on a borrowed context. */
#include "alltoall/parallel_gpu.h"

#include "alltoall/comm_gpu.h"

moe_status moe_parallel_create_self_gpu(moe_gpu *gpu, moe_parallel **out) {
    if (!gpu || !out) return MOE_ERR_INVALID_ARG;
    moe__parallel_comms c = {0};
    moe_comm **const slot[] = {&c.world, &c.pipeline, &c.ep, &c.expert_dp, &c.tensor};
    static const char *const label[] = {"world", "pipeline", "ep", "expert-dp", "tensor"};
    moe_status st = MOE_OK;
    for (int i = 0; i < 5 && st == MOE_OK; i++) st = moe_comm_create_self_gpu(gpu, label[i], slot[i]);
    /* assembling frees what was made when one is missing (and says out of memory: the first failure is the why) */
    const moe_status made = moe__parallel_assemble(moe__parallel_ranks_one(), c, out);
    if (st != MOE_OK && made == MOE_OK) moe_parallel_destroy(*out), *out = NULL;
    return st != MOE_OK ? st : made;
}
