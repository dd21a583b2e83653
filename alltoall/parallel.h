/* parallel.h — the parallel layout of a job (who talks to whom): world, expert-parallel (EP) and
 * expert-data-parallel groups. Where the work runs (CPU or a GPU) is the runtime's business (moe/runtime.h);
 * a layout only carries communicators, whose transports may move device memory (comm_gpu.h).
 *
 *   W ranks; ep divides W (and E). EP groups are blocks of consecutive ranks [g*ep, (g+1)*ep), so a group's
 *   tokens are a contiguous range of the global batch. Within a group, ep_rank = world_rank % ep owns the
 *   experts [ep_rank * E/ep, (ep_rank + 1) * E/ep). Ranks with the same ep_rank in different groups hold
 *   replicas of the same experts: the expert-data-parallel group (size W/ep, dp_rank = world_rank / ep).
 *   Dense gradients are summed over the world, expert gradients over the expert-data-parallel group. */
#ifndef MOE_ALLTOALL_PARALLEL_H
#define MOE_ALLTOALL_PARALLEL_H

#include "alltoall/comm.h"

typedef struct moe_parallel moe_parallel;

/* This rank's place in the layout. */
typedef struct {
    int world_size, world_rank;
    int ep_size, ep_rank;
    int dp_size, dp_rank;
} moe_ranks;

moe_ranks moe_parallel_ranks(const moe_parallel *par);
moe_comm *moe_parallel_world(const moe_parallel *par);
moe_comm *moe_parallel_ep(const moe_parallel *par);
moe_comm *moe_parallel_expert_dp(const moe_parallel *par);

/* A world of one process (no MPI): ep = dp = 1. */
moe_status moe_parallel_create_self(moe_parallel **out);
/* Frees the communicators. */
void moe_parallel_destroy(moe_parallel *par);

/* Inside alltoall/: a layout from its three communicators (world, ep, expert-dp), which it then owns —
 * also when it fails, in which case they are destroyed. */
moe_status moe__parallel_assemble(moe_ranks ranks, moe_comm *world, moe_comm *ep, moe_comm *expert_dp,
                                  moe_parallel **out);

#endif
