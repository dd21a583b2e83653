/* parallel.c — the one-process layout, and teardown. */
#include "alltoall/parallel.h"

#include <stdlib.h>

moe_status moe_parallel_create_self(moe_parallel **out) {
    moe_parallel *p = calloc(1, sizeof *p);
    if (!p) return MOE_ERR_OUT_OF_MEMORY;
    *p = (moe_parallel){.world_size = 1, .ep_size = 1, .dp_size = 1};
    if (moe_comm_create_self("world", &p->world) != MOE_OK || moe_comm_create_self("ep", &p->ep) != MOE_OK ||
        moe_comm_create_self("expert-dp", &p->expert_dp) != MOE_OK) {
        moe_parallel_destroy(p);
        return MOE_ERR_OUT_OF_MEMORY;
    }
    *out = p;
    return MOE_OK;
}

void moe_parallel_destroy(moe_parallel *p) {
    if (!p) return;
    moe_comm_destroy(p->world);
    moe_comm_destroy(p->ep);
    moe_comm_destroy(p->expert_dp);
    if (p->gpu && p->gpu_release) p->gpu_release(p->gpu);
    free(p);
}
