/* parallel_gpu_mpi.h — a GPU parallel layout over MPI (parallel_gpu.h, parallel_mpi.h). */
#ifndef MOE_ALLTOALL_PARALLEL_GPU_MPI_H
#define MOE_ALLTOALL_PARALLEL_GPU_MPI_H

#include <mpi.h>

#include "alltoall/parallel_gpu.h"

typedef enum {
    MOE_GPU_TRANSPORT_NCCL = 0, /* one GPU per rank (builds with NCCL only; else MOE_ERR_INVALID_CONFIG) */
    MOE_GPU_TRANSPORT_MPI = 1,  /* device buffers staged through pinned host memory; ranks may share a GPU */
} moe_gpu_transport;

/* Collective over `world`; the groups of moe_parallel_create_mpi_tp with GPU transports on gpu's stream. gpu
 * may be NULL on a rank whose GPU could not be set up: then no rank goes on to the collective splits, and
 * every rank fails (MOE_ERR_NO_DEVICE there, MOE_ERR_PEER elsewhere). Errors as moe_parallel_create_mpi. */
moe_status moe_parallel_create_mpi_gpu(MPI_Comm world, int pp_size, int ep_size, int tp_size, double timeout_s,
                                       moe_gpu *gpu, moe_gpu_transport transport, moe_parallel **out);

#endif
