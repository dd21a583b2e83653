/* comm_gpu_mpi.h — the GPU transports built on MPI (what they do: comm_gpu.h). Each takes ownership of
 * the MPI communicator it is given (freed by moe_comm_destroy). moe_comm_create_nccl exists only in
 * builds with NCCL (meson: nccl feature). */
#ifndef MOE_ALLTOALL_COMM_GPU_MPI_H
#define MOE_ALLTOALL_COMM_GPU_MPI_H

#include <mpi.h>

#include "alltoall/comm_gpu.h"

moe_status moe_comm_create_mpi_staged(moe_gpu *gpu, MPI_Comm comm, const char *label, double timeout_s,
                                      moe_comm **out);
moe_status moe_comm_create_nccl(moe_gpu *gpu, MPI_Comm comm, const char *label, double timeout_s, moe_comm **out);
/* "NCCL 2.21.5": the version of the NCCL library this process runs (ncclGetVersion), for the machine record
 * (train/machine.h). */
moe_status moe_comm_nccl_version(char *out, size_t n);

#endif
