/* gpu_internal.h — what CUDA-side code of libmoe_cuda sees of a moe_gpu, and the checks every CUDA,
 * cuBLAS and NCCL call goes through (each failure prints the call, file:line and the library's own
 * message, then returns a moe_status; nothing here exits). Plain C, so host files (.c) and kernels (.cu)
 * share it. Include it outside any extern "C" block: the CUDA headers it pulls in are C++ in .cu files. */
#ifndef MOE_GPU_INTERNAL_H
#define MOE_GPU_INTERNAL_H

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "moe/gpu.h"

struct moe_gpu {
    int device;
    cudaStream_t stream;   /* every op of the layer runs on this stream, in order */
    cublasHandle_t blas;   /* bound to `stream` */
    void *scratch;         /* grows on demand: CUB's temporary storage, pointer arrays of grouped GEMMs */
    size_t scratch_bytes;
    int *flag;             /* one device int for ops that report a condition (non-finite logits) */
};

/* A device buffer of at least nbytes, owned by the context and valid until the next call (not for two
 * users at once). */
moe_status moe_gpu_scratch(moe_gpu *gpu, size_t nbytes, void **out);

const char *moe_cublas_status_string(cublasStatus_t status);

#define MOE_CUDA_TRY(call)                                                                                   \
    do {                                                                                                     \
        cudaError_t moe_err_ = (call);                                                                       \
        if (moe_err_ != cudaSuccess) {                                                                       \
            fprintf(stderr, "moe: %s:%d: %s failed: %s\n", __FILE__, __LINE__, #call,                        \
                    cudaGetErrorString(moe_err_));                                                           \
            return moe_err_ == cudaErrorMemoryAllocation ? MOE_ERR_OUT_OF_MEMORY : MOE_ERR_CUDA;            \
        }                                                                                                    \
    } while (0)

/* After a kernel launch: launch-configuration errors surface at once, faults at the next synchronise. */
#define MOE_CUDA_LAUNCHED() MOE_CUDA_TRY(cudaGetLastError())

#define MOE_CUBLAS_TRY(call)                                                                                 \
    do {                                                                                                     \
        cublasStatus_t moe_bst_ = (call);                                                                    \
        if (moe_bst_ != CUBLAS_STATUS_SUCCESS) {                                                             \
            fprintf(stderr, "moe: %s:%d: %s failed: %s\n", __FILE__, __LINE__, #call,                        \
                    moe_cublas_status_string(moe_bst_));                                                     \
            return moe_bst_ == CUBLAS_STATUS_ALLOC_FAILED ? MOE_ERR_OUT_OF_MEMORY : MOE_ERR_CUDA;           \
        }                                                                                                    \
    } while (0)

/* Propagates a moe_status from a helper. */
#define MOE_TRY(call)                                                                                        \
    do {                                                                                                     \
        moe_status moe_st_ = (call);                                                                         \
        if (moe_st_ != MOE_OK) return moe_st_;                                                               \
    } while (0)

#ifdef __cplusplus
}
#endif

#endif
