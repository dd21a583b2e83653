/* parallel_gpu.c — the one-process GPU layout: a context on one device and self-gpu transports. */
#include "alltoall/parallel_gpu.h"

#include <stdlib.h>

#include "alltoall/comm_gpu.h"
#include "moe/backend.h"

moe_status moe_parallel_create_self_gpu(int device, moe_parallel **out) {
    if (!out) return MOE_ERR_INVALID_ARG;
    moe_gpu *gpu = NULL;
    moe_status st = moe_gpu_create(device, &gpu);
    if (st != MOE_OK) return st;
    moe_parallel *p = calloc(1, sizeof *p);
    if (!p) {
        moe_gpu_destroy(gpu);
        return MOE_ERR_OUT_OF_MEMORY;
    }
    /* from here on the layout owns the context: moe_parallel_destroy releases it after the comms */
    *p = (moe_parallel){.world_size = 1, .ep_size = 1, .dp_size = 1, .gpu = gpu, .backend = &moe_backend_cuda,
                        .gpu_release = moe_gpu_destroy};
    st = moe_comm_create_self_gpu(gpu, "world", &p->world);
    if (st == MOE_OK) st = moe_comm_create_self_gpu(gpu, "ep", &p->ep);
    if (st == MOE_OK) st = moe_comm_create_self_gpu(gpu, "expert-dp", &p->expert_dp);
    if (st != MOE_OK) {
        moe_parallel_destroy(p);
        return st;
    }
    *out = p;
    return MOE_OK;
}
