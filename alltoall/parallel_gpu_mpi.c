/* parallel_gpu_mpi.c — the GPU layout over MPI: the groups of parallel_mpi.c (same splits, same code) with
 * a GPU transport (comm_gpu.h) on each communicator. */
#include "alltoall/parallel_gpu_mpi.h"

#include "alltoall/comm_gpu_mpi.h"
#include "alltoall/parallel_mpi.h"
#include "core/fail.h"
#include "pipeline/grid.h"

typedef struct {
    moe_gpu *gpu;
    moe_gpu_transport transport;
} gpu_wrap_ctx;

static moe_status wrap_gpu(void *ctx, MPI_Comm comm, const char *label, double timeout_s, moe_comm **out) {
    const gpu_wrap_ctx *g = ctx;
#ifdef MOE_HAVE_NCCL
    if (g->transport == MOE_GPU_TRANSPORT_NCCL) return moe_comm_create_nccl(g->gpu, comm, label, timeout_s, out);
#endif
    return moe_comm_create_mpi_staged(g->gpu, comm, label, timeout_s, out);
}

moe_status moe_parallel_create_mpi_gpu(MPI_Comm world, int pp_size, int ep_size, int tp_size, double timeout_s,
                                       moe_gpu *gpu, moe_gpu_transport transport, moe_parallel **out) {
    int size, rank;
    if (!out || (transport != MOE_GPU_TRANSPORT_NCCL && transport != MOE_GPU_TRANSPORT_MPI))
        return MOE_ERR_INVALID_ARG;
    if (MPI_Comm_size(world, &size) != MPI_SUCCESS || MPI_Comm_rank(world, &rank) != MPI_SUCCESS)
        return moe_fail(MOE_ERR_COMM, "cannot query the MPI world");
    /* the errors every rank finds alike come first */
    moe_rank_grid grid;
    MOE_TRY(moe_rank_grid_make(size, pp_size, ep_size, tp_size, rank, &grid));
#ifndef MOE_HAVE_NCCL
    if (transport == MOE_GPU_TRANSPORT_NCCL)
        return moe_fail(MOE_ERR_INVALID_CONFIG, "the NCCL transport is not in this build (NCCL was not found when it "
                                                "was configured): use the MPI transport, or rebuild with NCCL "
                                                "(meson -Dnccl=enabled)");
#endif
    /* no rank goes on to the collective splits while another has no GPU */
    const int mine = gpu == NULL;
    int any = 1;
    if (MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, world) != MPI_SUCCESS)
        return moe_fail(MOE_ERR_COMM, "world rank %d: cannot agree on the GPUs", rank);
    if (mine) return moe_fail(MOE_ERR_NO_DEVICE, "world rank %d has no GPU context for its layout", rank);
    if (any) return moe_fail(MOE_ERR_PEER, "another rank has no GPU (see its message)");
    gpu_wrap_ctx ctx = {.gpu = gpu, .transport = transport};
    return moe__parallel_create_mpi_with(world, pp_size, ep_size, tp_size, timeout_s, wrap_gpu, &ctx, out);
}
