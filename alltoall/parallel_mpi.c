/* parallel_mpi.c — world, EP and expert-data-parallel communicators by MPI_Comm_split. */
#include "alltoall/parallel_mpi.h"

#include <stdlib.h>

#include "alltoall/comm_mpi.h"
#include "core/fail.h"

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
    return moe__parallel_create_mpi_with(world, ep_size, timeout_s, wrap_mpi, NULL, out);
}

moe_status moe__parallel_create_mpi_with(MPI_Comm world, int ep_size, double timeout_s, moe__comm_wrap_fn wrap_fn,
                                         void *wrap_ctx, moe_parallel **out) {
    int size, rank;
    if (MPI_Comm_size(world, &size) != MPI_SUCCESS || MPI_Comm_rank(world, &rank) != MPI_SUCCESS)
        return moe_fail(MOE_ERR_COMM, "cannot query the MPI world");
    if (ep_size < 1 || size % ep_size != 0)
        return moe_fail(MOE_ERR_INVALID_CONFIG, "ep = %d must be at least 1 and divide the world size %d", ep_size,
                        size);
    const moe_ranks r = {.world_size = size,
                         .world_rank = rank,
                         .ep_size = ep_size,
                         .ep_rank = rank % ep_size,
                         .dp_size = size / ep_size,
                         .dp_rank = rank / ep_size};
    MPI_Comm dup = MPI_COMM_NULL, ep = MPI_COMM_NULL, dp = MPI_COMM_NULL;
    MPI_Comm_dup(world, &dup);
    MPI_Comm_split(world, r.dp_rank, rank, &ep); /* same block of ep consecutive ranks */
    MPI_Comm_split(world, r.ep_rank, rank, &dp); /* same expert shard */
    /* each wrap owns its communicator from here on, whatever happens to the others */
    moe_comm *c_world = NULL, *c_ep = NULL, *c_dp = NULL;
    moe_status st_world = wrap(wrap_fn, wrap_ctx, dup, "world", timeout_s, &c_world);
    moe_status st_ep = wrap(wrap_fn, wrap_ctx, ep, "ep", timeout_s, &c_ep);
    moe_status st_dp = wrap(wrap_fn, wrap_ctx, dp, "expert-dp", timeout_s, &c_dp);
    moe_status st = st_world != MOE_OK ? st_world : st_ep != MOE_OK ? st_ep : st_dp;
    if (st != MOE_OK) {
        moe_comm_destroy(c_world), moe_comm_destroy(c_ep), moe_comm_destroy(c_dp);
        return st;
    }
    return moe__parallel_assemble(r, c_world, c_ep, c_dp, out);
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
