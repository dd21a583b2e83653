/* parallel_gpu.c — the one-process GPU layout: self-gpu transports on a borrowed context. */
#include "alltoall/parallel_gpu.h"

#include "alltoall/comm_gpu.h"

moe_status moe_parallel_create_self_gpu(moe_gpu *gpu, moe_parallel **out) {
    if (!gpu || !out) return MOE_ERR_INVALID_ARG;
    moe__parallel_comms c = {0};
    moe_comm_create_self_gpu(gpu, "world", &c.world);
    moe_comm_create_self_gpu(gpu, "pipeline", &c.pipeline);
    moe_comm_create_self_gpu(gpu, "ep", &c.ep);
    moe_comm_create_self_gpu(gpu, "expert-dp", &c.expert_dp);
    moe_comm_create_self_gpu(gpu, "tensor", &c.tensor);
    return moe__parallel_assemble(moe__parallel_ranks_one(), c, out);
}
