/* gpu.cu — the moe_gpu context: device, stream, cuBLAS handle, growing scratch. */
#include <stdlib.h>

#include "moe/gpu_internal.h"

extern "C" const char *moe_cublas_status_string(cublasStatus_t status) {
    switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "invalid value";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "architecture mismatch";
    case CUBLAS_STATUS_MAPPING_ERROR: return "mapping error";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "execution failed";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "internal error";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "not supported";
    default: return "unknown cuBLAS status";
    }
}

extern "C" int moe_gpu_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* no driver or no device: not an error to keep around */
        return 0;
    }
    return n;
}

extern "C" moe_status moe_gpu_create(int device, moe_gpu **out) {
    if (!out) return MOE_ERR_INVALID_ARG;
    *out = NULL;
    if (device < 0 || device >= moe_gpu_device_count()) return MOE_ERR_NO_DEVICE;
    MOE_CUDA_TRY(cudaSetDevice(device));
    moe_gpu *g = (moe_gpu *)calloc(1, sizeof *g);
    if (!g) return MOE_ERR_OUT_OF_MEMORY;
    g->device = device;
    moe_status st = MOE_OK;
    if (cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking) != cudaSuccess ||
        cublasCreate(&g->blas) != CUBLAS_STATUS_SUCCESS || cublasSetStream(g->blas, g->stream) != CUBLAS_STATUS_SUCCESS ||
        cudaMalloc(&g->flag, sizeof(int)) != cudaSuccess)
        st = MOE_ERR_CUDA;
    /* fp32 GEMMs stay fp32: no TF32 (the router is fp32 by design; bf16 GEMMs are asked for explicitly) */
    if (st == MOE_OK && cublasSetMathMode(g->blas, CUBLAS_PEDANTIC_MATH) != CUBLAS_STATUS_SUCCESS) st = MOE_ERR_CUDA;
    if (st != MOE_OK) {
        fprintf(stderr, "moe: could not create the CUDA context on device %d: %s\n", device,
                cudaGetErrorString(cudaGetLastError()));
        moe_gpu_destroy(g);
        return st;
    }
    *out = g;
    return MOE_OK;
}

extern "C" void moe_gpu_destroy(moe_gpu *g) {
    if (!g) return;
    cudaSetDevice(g->device);
    if (g->stream) cudaStreamSynchronize(g->stream);
    cudaFree(g->scratch);
    cudaFree(g->flag);
    if (g->blas) cublasDestroy(g->blas);
    if (g->stream) cudaStreamDestroy(g->stream);
    free(g);
}

extern "C" int moe_gpu_device(const moe_gpu *g) { return g->device; }

extern "C" moe_status moe_gpu_synchronize(moe_gpu *g) {
    MOE_CUDA_TRY(cudaStreamSynchronize(g->stream));
    return MOE_OK;
}

extern "C" moe_status moe_gpu_scratch(moe_gpu *g, size_t nbytes, void **out) {
    if (nbytes > g->scratch_bytes) {
        /* the old scratch may still be read by queued work */
        MOE_CUDA_TRY(cudaStreamSynchronize(g->stream));
        MOE_CUDA_TRY(cudaFree(g->scratch));
        g->scratch = NULL, g->scratch_bytes = 0;
        size_t grow = nbytes + nbytes / 4;
        MOE_CUDA_TRY(cudaMalloc(&g->scratch, grow));
        g->scratch_bytes = grow;
    }
    *out = g->scratch;
    return MOE_OK;
}

extern "C" moe_status moe_gpu_alloc(moe_gpu *g, size_t nbytes, void **out) {
    (void)g;
    *out = NULL;
    MOE_CUDA_TRY(cudaMalloc(out, nbytes ? nbytes : 1));
    return MOE_OK;
}

extern "C" void moe_gpu_free(moe_gpu *g, void *ptr) {
    (void)g;
    if (ptr) cudaFree(ptr);
}

extern "C" moe_status moe_gpu_upload(moe_gpu *g, void *dst, const void *src, size_t nbytes) {
    if (!nbytes) return MOE_OK;
    MOE_CUDA_TRY(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, g->stream));
    MOE_CUDA_TRY(cudaStreamSynchronize(g->stream));
    return MOE_OK;
}

extern "C" moe_status moe_gpu_download(moe_gpu *g, void *dst, const void *src, size_t nbytes) {
    if (!nbytes) return MOE_OK;
    MOE_CUDA_TRY(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, g->stream));
    MOE_CUDA_TRY(cudaStreamSynchronize(g->stream));
    return MOE_OK;
}

extern "C" moe_status moe_gpu_copy(moe_gpu *g, void *dst, const void *src, size_t nbytes) {
    if (!nbytes || dst == src) return MOE_OK;
    MOE_CUDA_TRY(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, g->stream));
    return MOE_OK;
}

extern "C" moe_status moe_gpu_zero(moe_gpu *g, void *dst, size_t nbytes) {
    if (!nbytes) return MOE_OK;
    MOE_CUDA_TRY(cudaMemsetAsync(dst, 0, nbytes, g->stream));
    return MOE_OK;
}
