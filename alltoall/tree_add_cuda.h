/* tree_add_cuda.h — the device twin of tree_add.h's moe_tree_add_f32_cpu, queued on a given stream (the NCCL
 * transport's communication stream, between its ncclRecv and its next ncclSend): y = lower + higher, count
 * floats of device memory, y may be lower or higher. No host sync. Plain C for libmoe_cuda's host files;
 * include it outside any extern "C" block (core/gpu_cuda.h's rule). */
#ifndef MOE_ALLTOALL_TREE_ADD_CUDA_H
#define MOE_ALLTOALL_TREE_ADD_CUDA_H

#include <cuda_runtime.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "core/types.h"

moe_status moe__tree_add_f32_cuda(cudaStream_t stream, float *y, const float *lower, const float *higher,
                                  size_t count);

#ifdef __cplusplus
}
#endif

#endif
