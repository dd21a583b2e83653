/* parallel_mpi.c — the layout's communicators by MPI_Comm_split, from pipeline/grid.h's rank grid. */
#include "alltoall/parallel_mpi.h"

#include <math.h>

#include <stdlib.h>

#include "alltoall/comm_mpi.h"
#include "core/fail.h"
#include "pipeline/grid.h"

static moe_status wrap(moe__comm_wrap_fn fn, void *ctx, MPI_Comm comm, const char *label, double timeout_s,
                       moe_comm **out) {
    if (comm == MPI_COMM_NULL) return moe_fail(MOE_ERR_COMM, "MPI could not create communicator '%s'", label);
    moe_status st = fn(ctx, comm, label, timeout_s, out);
    if (st != MOE_OK) MPI_Comm_free(&comm);
    return st;
}

static moe_status wrap_mpi(void *ctx, MPI_Comm comm, const char *label, double timeout_s, moe_comm **out) {
    (void)ctx;
    return moe_comm_create_mpi(comm, label, timeout_s, out);
}

moe_status moe_parallel_create_mpi(MPI_Comm world, int ep_size, double timeout_s, moe_parallel **out) {
    return moe__parallel_create_mpi_with(world, 1, ep_size, 1, timeout_s, wrap_mpi, NULL, out);
}

moe_status moe_parallel_create_mpi_pp(MPI_Comm world, int pp_size, int ep_size, double timeout_s,
                                      moe_parallel **out) {
    return moe__parallel_create_mpi_with(world, pp_size, ep_size, 1, timeout_s, wrap_mpi, NULL, out);
}

moe_status moe_parallel_create_mpi_tp(MPI_Comm world, int pp_size, int ep_size, int tp_size, double timeout_s,
                                      moe_parallel **out) {
    return moe__parallel_create_mpi_with(world, pp_size, ep_size, tp_size, timeout_s, wrap_mpi, NULL, out);
}

/* The MPI communicator of g's group of this kind: split from world by the group's first member, ordered by world
 * rank (the grid's order inside a group). */
static MPI_Comm split_group(MPI_Comm world, const moe_rank_grid *g, moe_rank_group kind) {
    MPI_Comm comm = MPI_COMM_NULL;
    if (MPI_Comm_split(world, moe_rank_grid_group_first(g, kind), g->rank, &comm) != MPI_SUCCESS) return MPI_COMM_NULL;
    return comm;
}

moe_status moe__parallel_create_mpi_with(MPI_Comm world, int pp_size, int ep_size, int tp_size, double timeout_s,
                                         moe__comm_wrap_fn wrap_fn, void *wrap_ctx, moe_parallel **out) {
    if (!out) return MOE_ERR_INVALID_ARG;
    if (isnan(timeout_s)) /* not <= 0, so not "none": it turned the watchdog off, and a stuck exchange hung (a probe) */
        return moe_fail(MOE_ERR_INVALID_ARG, "the exchange watchdog's timeout is NaN (<= 0 for none)");
    int size, rank;
    if (MPI_Comm_size(world, &size) != MPI_SUCCESS || MPI_Comm_rank(world, &rank) != MPI_SUCCESS)
        return moe_fail(MOE_ERR_COMM, "cannot query the MPI world");
    moe_rank_grid g;
    MOE_TRY(moe_rank_grid_make(size, pp_size, ep_size, tp_size, rank, &g));
    const moe_ranks r = {.world_size = size, .world_rank = rank, .pp_size = pp_size, .pp_rank = g.pp_rank,
                         .stage_size = size / pp_size, .stage_rank = g.stage_rank, .ep_size = ep_size,
                         .ep_rank = g.ep_rank, .edp_size = g.edp, .edp_rank = g.edp_rank, .tp_size = tp_size,
                         .tp_rank = g.tp_rank, .dp_size = g.dp, .dp_rank = g.dp_rank};
    MPI_Comm dup = MPI_COMM_NULL;
    MPI_Comm_dup(world, &dup);
    /* every rank makes every split (collective), in one order */
    MPI_Comm stage = pp_size > 1 ? split_group(world, &g, MOE_RANK_GROUP_STAGE) : MPI_COMM_NULL;
    MPI_Comm pipeline = split_group(world, &g, MOE_RANK_GROUP_PIPELINE);
    MPI_Comm ep = split_group(world, &g, MOE_RANK_GROUP_EP);
    MPI_Comm edp = split_group(world, &g, MOE_RANK_GROUP_EXPERT_DP);
    MPI_Comm tensor = split_group(world, &g, MOE_RANK_GROUP_TENSOR);
    MPI_Comm data = tp_size > 1 ? split_group(world, &g, MOE_RANK_GROUP_DATA) : MPI_COMM_NULL;
    /* each wrap owns its communicator from here on, whatever happens to the others */
    moe__parallel_comms c = {0};
    moe_status st[7] = {
        wrap(wrap_fn, wrap_ctx, dup, "world", timeout_s, &c.world),
        pp_size > 1 ? wrap(wrap_fn, wrap_ctx, stage, "stage", timeout_s, &c.stage) : MOE_OK,
        wrap(wrap_fn, wrap_ctx, pipeline, "pipeline", timeout_s, &c.pipeline),
        wrap(wrap_fn, wrap_ctx, ep, "ep", timeout_s, &c.ep),
        wrap(wrap_fn, wrap_ctx, edp, "expert-dp", timeout_s, &c.expert_dp),
        wrap(wrap_fn, wrap_ctx, tensor, "tensor", timeout_s, &c.tensor),
        tp_size > 1 ? wrap(wrap_fn, wrap_ctx, data, "data", timeout_s, &c.data) : MOE_OK,
    };
    for (int i = 0; i < 7; i++)
        if (st[i] != MOE_OK) {
            moe_comm_destroy(c.world), moe_comm_destroy(c.stage), moe_comm_destroy(c.pipeline);
            moe_comm_destroy(c.ep), moe_comm_destroy(c.expert_dp), moe_comm_destroy(c.tensor), moe_comm_destroy(c.data);
            return st[i];
        }
    return moe__parallel_assemble(r, c, out);
}

moe_status moe_parallel_node_rank(MPI_Comm world, int *node_rank) {
    int rank;
    MPI_Comm node = MPI_COMM_NULL;
    if (MPI_Comm_rank(world, &rank) != MPI_SUCCESS ||
        MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node) != MPI_SUCCESS)
        return moe_fail(MOE_ERR_COMM, "cannot split the MPI world by node");
    int rc = MPI_Comm_rank(node, node_rank);
    MPI_Comm_free(&node);
    return rc == MPI_SUCCESS ? MOE_OK : moe_fail(MOE_ERR_COMM, "cannot query the rank within the node");
}
