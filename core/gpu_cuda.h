/* gpu_cuda.h — what CUDA-side code (kernels in .cu files, host files of libmoe_cuda) sees of a moe_gpu,
 * and the checks every CUDA, cuBLAS and NCCL call goes through: a failure records the call, file:line and
 * the library's own message (core/fail.h) and returns a moe_status; nothing here prints or exits. Plain C,
 * so host files (.c) and kernels (.cu) share it. Include it outside any extern "C" block: the CUDA headers
 * it pulls in are C++ in .cu files. */
#ifndef MOE_CORE_GPU_CUDA_H
#define MOE_CORE_GPU_CUDA_H

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "core/fail.h"
#include "core/gpu.h"

struct moe_gpu {
    int device;
    cudaStream_t stream;   /* every op of the layer runs on this stream, in order */
    cublasHandle_t blas;   /* bound to `stream` */
    cublasLtHandle_t blaslt; /* cuBLASLt's (kernels/gemm_lt.h): its calls take the stream one by one */
    void *scratch;         /* grows on demand: CUB's temporary storage, pointer arrays of grouped GEMMs */
    size_t scratch_bytes;
    int *flag;             /* one device int for ops that report a condition (non-finite logits) */
    moe_gpu_counters counters; /* host waits by reason, allocations (core/gpu.h) */
    /* the context's pinned cuBLASLt GEMMs (kernels/gemm_lt.h, moe_gemm_lt_context_set), created there at the first
     * request and freed with the context by their owner's function: core knows nothing else of them */
    struct moe_gemm_lt_set *gemm_lt;
    void (*gemm_lt_free)(struct moe_gpu *gpu, struct moe_gemm_lt_set *set);
};

/* A device buffer of at least nbytes, owned by the context and valid until the next call (not for two
 * users at once). */
moe_status moe_gpu_scratch(moe_gpu *gpu, size_t nbytes, void **out);

const char *moe_cublas_status_string(cublasStatus_t status);

/* Records "FILE:LINE: CALL failed: TEXT" and returns status (the macros' common end). cuBLASLt's calls return
 * cuBLAS's status type: MOE_CUBLAS_TRY checks them too. */
moe_status moe__gpu_call_failed(moe_status status, const char *file, int line, const char *call, const char *text);

#define MOE_CUDA_TRY(call)                                                                                   \
    do {                                                                                                     \
        cudaError_t moe_err_ = (call);                                                                       \
        if (moe_err_ != cudaSuccess)                                                                         \
            return moe__gpu_call_failed(moe_err_ == cudaErrorMemoryAllocation ? MOE_ERR_OUT_OF_MEMORY         \
                                                                              : MOE_ERR_CUDA,                 \
                                        __FILE__, __LINE__, #call, cudaGetErrorString(moe_err_));            \
    } while (0)

/* After a kernel launch: launch-configuration errors surface at once, faults at the next synchronise. */
#define MOE_CUDA_LAUNCHED() MOE_CUDA_TRY(cudaGetLastError())

#define MOE_CUBLAS_TRY(call)                                                                                 \
    do {                                                                                                     \
        cublasStatus_t moe_bst_ = (call);                                                                    \
        if (moe_bst_ != CUBLAS_STATUS_SUCCESS)                                                               \
            return moe__gpu_call_failed(moe_bst_ == CUBLAS_STATUS_ALLOC_FAILED ? MOE_ERR_OUT_OF_MEMORY        \
                                                                               : MOE_ERR_CUDA,                \
                                        __FILE__, __LINE__, #call, moe_cublas_status_string(moe_bst_));      \
    } while (0)

#ifdef __cplusplus
}
#endif

#endif
