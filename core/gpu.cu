/* gpu.cu — the moe_gpu context: device, stream, cuBLAS and cuBLASLt handles, growing scratch; the checked-call failure
 * message. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/gpu_cuda.h"

#include <cuda_profiler_api.h>

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

/* The CUDA runtime reports a missing driver as an insufficient one: the driver library decides which it is. */
static int driver_installed(void) {
    void *driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (driver) dlclose(driver);
    return driver != NULL;
}

extern "C" moe_status moe_gpu_device_count(int *count) {
    *count = 0;
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaSuccess) {
        *count = n;
        return MOE_OK;
    }
    cudaGetLastError(); /* the answer is returned here; no later check should see it */
    if (e == cudaErrorNoDevice || (e == cudaErrorInsufficientDriver && !driver_installed())) return MOE_OK;
    return moe_fail(MOE_ERR_CUDA, "cudaGetDeviceCount failed: %s (%s)%s", cudaGetErrorName(e), cudaGetErrorString(e),
                    e == cudaErrorInsufficientDriver ? "; the NVIDIA driver is older than this CUDA runtime: update it"
                                                     : "");
}

extern "C" moe_status moe__gpu_call_failed(moe_status status, const char *file, int line, const char *call,
                                          const char *text) {
    /* A failed runtime call leaves its error as the thread's last error, which the next launch check
     * (cudaGetLastError) would report as its own: take it here (a sticky error, a fault, stays anyway). */
    (void)cudaGetLastError();
    return moe_fail(status, "%s:%d: %s failed: %s", file, line, call, text);
}

static moe_status create_handles(moe_gpu *g) {
    MOE_CUDA_TRY(cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking));
    MOE_CUBLAS_TRY(cublasCreate(&g->blas));
    MOE_CUBLAS_TRY(cublasSetStream(g->blas, g->stream));
    MOE_CUBLAS_TRY(cublasLtCreate(&g->blaslt));
    MOE_CUDA_TRY(cudaMalloc(&g->flag, sizeof(int)));
    moe_gpu_count_allocation(g);
    MOE_CUBLAS_TRY(cublasSetMathMode(g->blas, CUBLAS_PEDANTIC_MATH));
    return MOE_OK;
}

extern "C" moe_status moe_gpu_create(int device, moe_gpu **out) {
    if (!out) return MOE_ERR_INVALID_ARG;
    *out = NULL;
    int count = 0;
    MOE_TRY(moe_gpu_device_count(&count));
    if (device < 0 || device >= count)
        return moe_fail(MOE_ERR_NO_DEVICE, "CUDA device %d is not usable (%d device(s) visible)", device, count);
    MOE_CUDA_TRY(cudaSetDevice(device));
    moe_gpu *g = (moe_gpu *)calloc(1, sizeof *g);
    if (!g) return MOE_ERR_OUT_OF_MEMORY;
    g->device = device;
    /* each step's failure names itself; fp32 GEMMs stay fp32: no TF32 (the router is fp32 by design; bf16
     * GEMMs are asked for explicitly) */
    moe_status st = create_handles(g);
    if (st != MOE_OK) {
        moe_gpu_destroy(g);
        return moe_fail_context(st, "creating the CUDA context on device %d", device);
    }
    *out = g;
    return MOE_OK;
}

extern "C" void moe_gpu_destroy(moe_gpu *g) {
    if (!g) return;
    cudaSetDevice(g->device);
    if (g->stream) cudaStreamSynchronize(g->stream);
    if (g->gemm_lt) g->gemm_lt_free(g, g->gemm_lt);
    cudaFree(g->scratch);
    cudaFree(g->flag);
    if (g->blas) cublasDestroy(g->blas);
    if (g->blaslt) cublasLtDestroy(g->blaslt);
    if (g->stream) cudaStreamDestroy(g->stream);
    free(g);
}

extern "C" int moe_gpu_device(const moe_gpu *g) { return g->device; }

extern "C" moe_status moe_gpu_memory_info(moe_gpu *g, size_t *free_bytes, size_t *total_bytes) {
    MOE_CUDA_TRY(cudaSetDevice(g->device));
    MOE_CUDA_TRY(cudaMemGetInfo(free_bytes, total_bytes));
    return MOE_OK;
}

extern "C" moe_status moe_gpu_describe(moe_gpu *g, char *out, size_t n) {
    cudaDeviceProp prop;
    int runtime = 0, driver = 0, blas = 0;
    MOE_CUDA_TRY(cudaGetDeviceProperties(&prop, g->device));
    MOE_CUDA_TRY(cudaRuntimeGetVersion(&runtime));
    MOE_CUDA_TRY(cudaDriverGetVersion(&driver));
    MOE_CUBLAS_TRY(cublasGetVersion(g->blas, &blas)); /* major * 10000 + minor * 100 + patch (cuBLAS 11+) */
    snprintf(out, n, "%s, %d SMs, sm_%d%d; CUDA runtime %d.%d, driver %d.%d; cuBLAS %d.%d.%d", prop.name,
             prop.multiProcessorCount, prop.major, prop.minor, runtime / 1000, runtime % 1000 / 10, driver / 1000,
             driver % 1000 / 10, blas / 10000, blas % 10000 / 100, blas % 100);
    return MOE_OK;
}

extern "C" void moe_gpu_count_wait(moe_gpu *g, const char *reason) {
    g->counters.waits[moe_gpu_counters_slot(&g->counters, reason)]++;
}

extern "C" moe_status moe_gpu_wait(moe_gpu *g, const char *reason) {
    moe_gpu_count_wait(g, reason);
    MOE_CUDA_TRY(cudaStreamSynchronize(g->stream));
    return MOE_OK;
}

extern "C" void moe_gpu_count_allocation(moe_gpu *g) { g->counters.allocations++; }

extern "C" void moe_gpu_counters_get(const moe_gpu *g, moe_gpu_counters *out) { *out = g->counters; }

extern "C" moe_status moe_gpu_synchronize(moe_gpu *g) { return moe_gpu_wait(g, "synchronize"); }

extern "C" moe_status moe_gpu_profiler_range(moe_gpu *g, int start) {
    MOE_TRY(moe_gpu_wait(g, "profiler range"));
    MOE_CUDA_TRY(start ? cudaProfilerStart() : cudaProfilerStop());
    return MOE_OK;
}

extern "C" moe_status moe_gpu_scratch(moe_gpu *g, size_t nbytes, void **out) {
    if (nbytes > g->scratch_bytes) {
        /* the old scratch may still be read by queued work */
        MOE_TRY(moe_gpu_wait(g, "scratch growth"));
        MOE_CUDA_TRY(cudaFree(g->scratch));
        g->scratch = NULL, g->scratch_bytes = 0;
        size_t grow = nbytes + nbytes / 4;
        moe_gpu_count_allocation(g);
        MOE_CUDA_TRY(cudaMalloc(&g->scratch, grow));
        g->scratch_bytes = grow;
    }
    *out = g->scratch;
    return MOE_OK;
}

extern "C" moe_status moe_gpu_alloc(moe_gpu *g, size_t nbytes, void **out) {
    *out = NULL;
    MOE_CUDA_TRY(cudaSetDevice(g->device));
    moe_gpu_count_allocation(g);
    MOE_CUDA_TRY(cudaMalloc(out, nbytes ? nbytes : 1));
    return MOE_OK;
}

extern "C" moe_status moe_gpu_host_alloc(moe_gpu *g, size_t nbytes, void **out) {
    *out = NULL;
    MOE_CUDA_TRY(cudaSetDevice(g->device));
    moe_gpu_count_allocation(g);
    MOE_CUDA_TRY(cudaMallocHost(out, nbytes ? nbytes : 1));
    memset(*out, 0, nbytes);
    return MOE_OK;
}

extern "C" void moe_gpu_host_free(moe_gpu *g, void *ptr) {
    (void)g;
    if (ptr) cudaFreeHost(ptr);
}

extern "C" moe_status moe_gpu_copy_2d_async(moe_gpu *g, void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                                             size_t width_nbytes, size_t rows) {
    if (rows == 0 || width_nbytes == 0) return MOE_OK;
    MOE_CUDA_TRY(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width_nbytes, rows, cudaMemcpyDefault, g->stream));
    return MOE_OK;
}

extern "C" moe_status moe_gpu_copy_async(moe_gpu *g, void *dst, const void *src, size_t nbytes) {
    if (!nbytes || dst == src) return MOE_OK;
    MOE_CUDA_TRY(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, g->stream));
    return MOE_OK;
}

extern "C" void moe_gpu_free(moe_gpu *g, void *ptr) {
    (void)g;
    if (ptr) cudaFree(ptr);
}

extern "C" moe_status moe_gpu_upload(moe_gpu *g, void *dst, const void *src, size_t nbytes) {
    if (!nbytes) return MOE_OK;
    MOE_CUDA_TRY(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, g->stream));
    return moe_gpu_wait(g, "upload");
}

extern "C" moe_status moe_gpu_download(moe_gpu *g, void *dst, const void *src, size_t nbytes) {
    if (!nbytes) return MOE_OK;
    MOE_CUDA_TRY(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, g->stream));
    return moe_gpu_wait(g, "download");
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
