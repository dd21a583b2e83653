/* parallel.h — the parallel layout of a job (who talks to whom): world, pipeline, stage, expert-parallel (EP),
 * expert-data-parallel, tensor-parallel and data-parallel groups, split from pipeline/grid.h's rank grid. Where the
 * work runs (CPU or a GPU) is the runtime's business (moe/runtime.h); a layout only carries communicators, whose
 * transports may move device memory (comm_gpu.h).
 *
 *   W ranks in pp pipeline stages of Ws = W / pp consecutive ranks each (stage_rank = world_rank % Ws); a stage's
 *   ranks split the batch and hold its layers. Inside a stage (grid.h, "MoE parallel folding"):
 *   - the MoE layers: EP groups are blocks of ep consecutive ranks, so a group's tokens are a contiguous range of the
 *     global batch; ep_rank = stage_rank % ep owns the experts [ep_rank * E/ep, (ep_rank + 1) * E/ep). Ranks of a
 *     stage with the same ep_rank hold replicas of the same experts: the expert-data-parallel group (size Ws/ep,
 *     edp_rank = stage_rank / ep).
 *   - the dense layers: tensor-parallel groups are blocks of tp consecutive ranks (tp_rank = stage_rank % tp), which
 *     hold pieces of the same tensors and, with sequence parallelism, each a consecutive slice of the group's tokens;
 *     ranks with the same tp_rank hold the same pieces: the data-parallel group (size Ws/tp, dp_rank =
 *     stage_rank / tp).
 *   Gradients are summed over: the stage for replicated tensors (norms, routers, embedding), the data-parallel group
 *   for tensor-parallel pieces, the expert-data-parallel group for experts. The ranks at one stage position form a
 *   pipeline, which passes activations forward and gradients back. With pp = 1 the stage is the world, with tp = 1
 *   the data-parallel group is the stage (the same communicators). */
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
    int edp_size, edp_rank;     /* the expert-data-parallel group: stage_size / ep */
    int tp_size, tp_rank;       /* the tensor-parallel group                       */
    int dp_size, dp_rank;       /* the data-parallel group: stage_size / tp        */
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
/* The tensor-parallel group (size tp: this rank alone at tp 1) and the data-parallel group (the stage at tp 1). */
moe_comm *moe_parallel_tensor(const moe_parallel *par);
moe_comm *moe_parallel_data(const moe_parallel *par);

/* Every communicator's watchdog (comm.h's timeout) set to SECONDS; returns the world's before (a layout's
 * communicators are made with one), for putting it back the same way. A checkpoint's file work waits under
 * --checkpoint-timeout this way (checkpoint/checkpoint.c). */
double moe_parallel_set_timeout(const moe_parallel *par, double seconds);

/* A world of one process (no MPI): every size 1. */
moe_status moe_parallel_create_self(moe_parallel **out);
/* Frees the communicators. */
void moe_parallel_destroy(moe_parallel *par);

/* Inside alltoall/: a layout from its communicators, which it then owns — also when it fails, in which case they
 * are destroyed. stage NULL: the world (pp = 1); data NULL: the stage (tp = 1). */
typedef struct {
    moe_comm *world, *stage, *pipeline, *ep, *expert_dp, *tensor, *data;
} moe__parallel_comms;
moe_status moe__parallel_assemble(moe_ranks ranks, moe__parallel_comms comms, moe_parallel **out);
/* The ranks of a one-process layout. */
moe_ranks moe__parallel_ranks_one(void);

#endif
