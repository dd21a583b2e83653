/* comm_gpu.h — transports for the GPU layer. Their payload entries (alltoallv_rows, allreduce_sum_real,
 * copy_payload) take DEVICE pointers and run in order with the work queued on the context's stream; their
 * control entries (alltoall_ints, allgatherv_bytes, allreduce_sum_f64, scan_sum_ints, barrier: counts,
 * routing, losses) keep taking host pointers, as on every transport (comm.h).
 *
 *   self-gpu   a world of one: payloads are device-to-device copies, queued (no host sync).
 *   mpi-staged MPI on device buffers, staged through pinned host memory, so that several ranks can share
 *              one GPU (tests; NCCL refuses two ranks on one device). Host syncs: each payload exchange
 *              waits for the stream before MPI moves the staged copy.
 *   nccl       grouped ncclSend/ncclRecv and ncclAllReduce (the fixed-tree all-reduce: its ncclSend/ncclRecv
 *              steps and an add kernel, tree_add_cuda.h) on a communication stream of its own, ordered
 *              against the compute stream with events; bootstrapped from MPI (ncclGetUniqueId on rank 0,
 *              MPI_Bcast, ncclCommInitRank). Control entries go over MPI. Host syncs: the watchdog waits for
 *              each payload exchange to complete; one still running after timeout_s, or an asynchronous
 *              NCCL error, aborts the NCCL communicator and returns MOE_ERR_TIMEOUT / MOE_ERR_COMM with a
 *              message saying what it was doing.
 * Point-to-point sends and receives (comm.h) take device pointers on all three: self-gpu matches them as the self
 * transport does and copies on the stream; mpi-staged sends a host copy made at the post and uploads a receive at
 * its wait; nccl queues ncclSend / ncclRecv on its communication stream (one ncclGroup per batch) and its waits poll
 * an event of each request under the watchdog.
 * The MPI-based ones are declared in comm_gpu_mpi.h. */
#ifndef MOE_ALLTOALL_COMM_GPU_H
#define MOE_ALLTOALL_COMM_GPU_H

#include "alltoall/comm.h"
#include "core/gpu.h"

moe_status moe_comm_create_self_gpu(moe_gpu *gpu, const char *label, moe_comm **out);

#endif
