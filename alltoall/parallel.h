/* parallel.h — the parallel layout of a job (who talks to whom): world, pipeline, stage, expert-parallel (EP) and
 * expert-data-parallel groups, split from pipeline/grid.h's rank grid (tensor parallelism: not yet). Where the work
 * runs (CPU or a GPU) is the runtime's business (moe/runtime.h); a layout only carries communicators, whose
 * transports may move device memory (comm_gpu.h).
 *
 *   W ranks in pp pipeline stages of Ws = W / pp consecutive ranks each (stage_rank = world_rank % Ws); a stage's
 *   ranks split the batch and hold its layers. ep divides Ws (and E). Inside a stage, EP groups are blocks of
 *   consecutive ranks [g*ep, (g+1)*ep), so a group's tokens are a contiguous range of the global batch; ep_rank =
 *   stage_rank % ep owns the experts [ep_rank * E/ep, (ep_rank + 1) * E/ep). Ranks of a stage with the same ep_rank
 *   hold replicas of the same experts: the expert-data-parallel group (size Ws/ep, dp_rank = stage_rank / ep).
 *   Dense gradients are summed over the stage, expert gradients over the expert-data-parallel group; the ranks at
 *   one stage position (same dp and ep) form a pipeline, which passes activations forward and gradients back.
 *   With pp = 1 the stage is the world (the same communicator). */
#ifndef MOE_ALLTOALL_PARALLEL_H
#define MOE_ALLTOALL_PARALLEL_H

#include "alltoall/comm.h"

typedef struct moe_parallel moe_parallel;

/* This rank's place in the layout. */
typedef struct {
    int world_size, world_rank; /* the job: every process                       */
    int pp_size, pp_rank;       /* pipeline stages, and this rank's              */
    int stage_size, stage_rank; /* the ranks of this rank's stage: W / pp        */
    int ep_size, ep_rank;
    int dp_size, dp_rank;       /* the expert-data-parallel group: stage_size / ep */
} moe_ranks;

moe_ranks moe_parallel_ranks(const moe_parallel *par);
/* Every rank of the job: what all must agree on (a failure, a checkpoint, the step's statistics). */
moe_comm *moe_parallel_world(const moe_parallel *par);
/* The ranks of this pipeline stage (the world when pp = 1): the batch is split over them; the stage's dense
 * gradient sums, the capacity scan and the loss sums run over them. */
moe_comm *moe_parallel_stage(const moe_parallel *par);
/* This rank's pipeline (size pp, member p = stage p): activations forward, gradients back. */
moe_comm *moe_parallel_pipeline(const moe_parallel *par);
moe_comm *moe_parallel_ep(const moe_parallel *par);
moe_comm *moe_parallel_expert_dp(const moe_parallel *par);

/* A world of one process (no MPI): pp = ep = dp = 1. */
moe_status moe_parallel_create_self(moe_parallel **out);
/* Frees the communicators. */
void moe_parallel_destroy(moe_parallel *par);

/* Inside alltoall/: a layout from its communicators, which it then owns — also when it fails, in which case they
 * are destroyed. stage NULL: the world (pp = 1). */
typedef struct {
    moe_comm *world, *stage, *pipeline, *ep, *expert_dp;
} moe__parallel_comms;
moe_status moe__parallel_assemble(moe_ranks ranks, moe__parallel_comms comms, moe_parallel **out);
/* The ranks of a one-process layout. */
moe_ranks moe__parallel_ranks_one(void);

#endif
