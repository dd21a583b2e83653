/* parallel.h — the parallel layout of a job: world, expert-parallel (EP) and expert-data-parallel groups.
 *
 *   W ranks; ep divides W (and E). EP groups are blocks of consecutive ranks [g*ep, (g+1)*ep), so a group's
 *   tokens are a contiguous range of the global batch. Within a group, ep_rank = world_rank % ep owns the
 *   experts [ep_rank * E/ep, (ep_rank + 1) * E/ep). Ranks with the same ep_rank in different groups hold
 *   replicas of the same experts: the expert-data-parallel group (size W/ep, dp_rank = world_rank / ep).
 *   Dense gradients are summed over the world, expert gradients over the expert-data-parallel group. */
#ifndef MOE_ALLTOALL_PARALLEL_H
#define MOE_ALLTOALL_PARALLEL_H

#include "alltoall/comm.h"

struct moe_backend_ops;
typedef struct moe_parallel moe_parallel;

struct moe_parallel {
    int world_size, world_rank;
    int ep_size, ep_rank;
    int dp_size, dp_rank;
    moe_comm *world, *ep, *expert_dp;
    /* Where layers on this layout run: NULL gpu and backend = the CPU; a GPU layout (parallel_gpu.h) sets
     * both, and gpu_release to free the context after the communicators. */
    struct moe_gpu *gpu;
    const struct moe_backend_ops *backend;
    void (*gpu_release)(struct moe_gpu *gpu);
};

/* A world of one process (no MPI): ep = dp = 1. */
moe_status moe_parallel_create_self(moe_parallel **out);
/* Frees the communicators, then the GPU context if there is one. */
void moe_parallel_destroy(moe_parallel *par);

#endif
