/* comm_gpu.h — transports for the GPU layer. Their payload entries (alltoallv_rows, allreduce_sum_real)
 * take DEVICE pointers and run in order with the work queued on the context's stream; their control
 * entries (alltoall_ints, allgatherv_bytes, allreduce_sum_f64, barrier: counts, routing choices, losses)
 * keep taking host pointers, as on every transport (comm.h).
 *
 *   self-gpu   a world of one: payloads are device-to-device copies.
 *   mpi-staged MPI on device buffers, staged through pinned host memory, so that several ranks can share
 *              one GPU (tests; NCCL refuses two ranks on one device).
 *   nccl       grouped ncclSend/ncclRecv and ncclAllReduce on a communication stream of its own, ordered
 *              against the compute stream with events; bootstrapped from MPI (ncclGetUniqueId on rank 0,
 *              MPI_Bcast, ncclCommInitRank). Control entries go over MPI. A payload exchange still running
 *              after timeout_s, or an asynchronous NCCL error, aborts the NCCL communicator and returns
 *              MOE_ERR_TIMEOUT / MOE_ERR_COMM after printing what it was doing.
 * The MPI-based ones are declared in comm_gpu_mpi.h. */
#ifndef MOE_ALLTOALL_COMM_GPU_H
#define MOE_ALLTOALL_COMM_GPU_H

#include "alltoall/comm.h"
#include "core/gpu.h"

moe_status moe_comm_create_self_gpu(moe_gpu *gpu, const char *label, moe_comm **out);

#endif
