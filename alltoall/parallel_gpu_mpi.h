/* parallel_gpu_mpi.h — a GPU parallel layout over MPI (parallel_gpu.h, parallel_mpi.h). */
#ifndef MOE_ALLTOALL_PARALLEL_GPU_MPI_H
#define MOE_ALLTOALL_PARALLEL_GPU_MPI_H

#include <mpi.h>

#include "alltoall/parallel_gpu.h"

typedef enum {
    MOE_GPU_TRANSPORT_NCCL = 0, /* one GPU per rank (builds with NCCL only; else MOE_ERR_INVALID_CONFIG) */
    MOE_GPU_TRANSPORT_MPI = 1,  /* device buffers staged through pinned host memory; ranks may share a GPU */
} moe_gpu_transport;

/* Collective over `world`. device < 0 picks (local rank) % (devices on the node), the local rank coming
 * from MPI_COMM_TYPE_SHARED. Errors as moe_parallel_create_mpi, plus MOE_ERR_NO_DEVICE. */
moe_status moe_parallel_create_mpi_gpu(MPI_Comm world, int ep_size, double timeout_s, int device,
                                       moe_gpu_transport transport, moe_parallel **out);

#endif
