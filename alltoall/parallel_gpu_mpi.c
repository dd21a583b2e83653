/* parallel_gpu_mpi.c — the GPU layout over MPI: the groups of parallel_mpi.c (same splits, same code),
 * a context on one device per rank, and a GPU transport (comm_gpu.h) on each communicator. */
#include "alltoall/parallel_gpu_mpi.h"


#include "alltoall/comm_gpu_mpi.h"
#include "core/fail.h"
#include "alltoall/parallel_mpi.h"
#include "moe/backend.h"

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

/* device < 0: (rank among the processes of this node) % (devices of this node). */
static moe_status pick_device(MPI_Comm world, int world_rank, int device, int *out) {
    if (device >= 0) {
        *out = device;
        return MOE_OK;
    }
    MPI_Comm node = MPI_COMM_NULL;
    int local_rank = 0;
    if (MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, world_rank, MPI_INFO_NULL, &node) != MPI_SUCCESS)
        return MOE_ERR_COMM;
    int rc = MPI_Comm_rank(node, &local_rank);
    MPI_Comm_free(&node);
    if (rc != MPI_SUCCESS) return MOE_ERR_COMM;
    int count = moe_gpu_device_count();
    *out = count > 0 ? local_rank % count : 0;
    return MOE_OK;
}

moe_status moe_parallel_create_mpi_gpu(MPI_Comm world, int ep_size, double timeout_s, int device,
                                       moe_gpu_transport transport, moe_parallel **out) {
    int size, rank;
    if (!out || (transport != MOE_GPU_TRANSPORT_NCCL && transport != MOE_GPU_TRANSPORT_MPI))
        return MOE_ERR_INVALID_ARG;
    if (MPI_Comm_size(world, &size) != MPI_SUCCESS || MPI_Comm_rank(world, &rank) != MPI_SUCCESS) return MOE_ERR_COMM;
    /* the errors every rank finds alike come first, before any rank needs a GPU */
    if (ep_size < 1 || size % ep_size != 0) return MOE_ERR_INVALID_CONFIG;
#ifndef MOE_HAVE_NCCL
    if (transport == MOE_GPU_TRANSPORT_NCCL)
        return moe_fail(MOE_ERR_INVALID_CONFIG, "the NCCL transport is not in this build (NCCL was not found when it "
                                                "was configured): use the MPI transport, or rebuild with NCCL "
                                                "(meson -Dnccl=enabled)");
#endif
    moe_gpu *gpu = NULL;
    moe_status st = pick_device(world, rank, device, &device);
    if (st == MOE_OK) {
        st = moe_fail_context(moe_gpu_create(device, &gpu), "world rank %d", rank);
    }
    /* no rank goes on to the collective splits while another gives up here */
    int failed = st != MOE_OK, any_failed = 1;
    if (MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, world) != MPI_SUCCESS && st == MOE_OK)
        st = MOE_ERR_COMM;
    if (st == MOE_OK && any_failed) st = MOE_ERR_PEER;
    if (st != MOE_OK) {
        moe_gpu_destroy(gpu);
        return st;
    }
    gpu_wrap_ctx ctx = {.gpu = gpu, .transport = transport};
    moe_parallel *p = NULL;
    st = moe__parallel_create_mpi_with(world, ep_size, timeout_s, wrap_gpu, &ctx, &p);
    if (st != MOE_OK) {
        moe_gpu_destroy(gpu); /* the comms that were made are gone already */
        return st;
    }
    p->gpu = gpu;
    p->backend = &moe_backend_cuda;
    p->gpu_release = moe_gpu_destroy;
    *out = p;
    return MOE_OK;
}
