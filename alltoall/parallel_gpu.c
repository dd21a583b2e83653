/* parallel_gpu.c — the one-process GPU layout: self-gpu transports on a borrowed context. */
#include "alltoall/parallel_gpu.h"

#include "alltoall/comm_gpu.h"

moe_status moe_parallel_create_self_gpu(moe_gpu *gpu, moe_parallel **out) {
    if (!gpu || !out) return MOE_ERR_INVALID_ARG;
    moe_comm *world = NULL, *ep = NULL, *dp = NULL;
    moe_comm_create_self_gpu(gpu, "world", &world);
    moe_comm_create_self_gpu(gpu, "ep", &ep);
    moe_comm_create_self_gpu(gpu, "expert-dp", &dp);
    const moe_ranks one = {.world_size = 1, .ep_size = 1, .dp_size = 1};
    return moe__parallel_assemble(one, world, ep, dp, out);
}
