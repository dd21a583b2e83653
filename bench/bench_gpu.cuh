/* bench_gpu.cuh — what the GPU programs of bench/ share on top of bench_util.h: checks of CUDA and cuBLAS
 * calls that end the program with bench_fail, the no-GPU exit (77, with a message), the device's name,
 * and cudaEvent timing of work queued on the context's stream. CUDA C++; include after bench_util.h. */
#ifndef BENCH_GPU_CUH
#define BENCH_GPU_CUH

#include <stdlib.h>

#include "core/gpu_cuda.h"

#define BENCH_CUDA(call)                                                                                     \
    do {                                                                                                     \
        cudaError_t bench_err_ = (call);                                                                     \
        if (bench_err_ != cudaSuccess) bench_fail("%s failed: %s", #call, cudaGetErrorString(bench_err_));   \
    } while (0)
#define BENCH_CUBLAS(call)                                                                                   \
    do {                                                                                                     \
        cublasStatus_t bench_bst_ = (call);                                                                  \
        if (bench_bst_ != CUBLAS_STATUS_SUCCESS)                                                             \
            bench_fail("%s failed: %s", #call, moe_cublas_status_string(bench_bst_));                        \
    } while (0)

/* A context on device 0 with its properties printed ("GPU: name (SMs, memory)"), or exit 77 with a
 * message when there is no GPU. */
static inline moe_gpu *bench_gpu_open(const char *prog, cudaDeviceProp *prop) {
    int devices = 0;
    bench_check(moe_gpu_device_count(&devices), "moe_gpu_device_count");
    if (devices == 0) {
        printf("%s: no CUDA device on this machine; nothing to measure\n", prog);
        exit(77);
    }
    moe_gpu *gpu = NULL;
    bench_check(moe_gpu_create(0, &gpu), "moe_gpu_create");
    BENCH_CUDA(cudaGetDeviceProperties(prop, 0));
    printf("GPU: %s (%d SMs, %.1f GB)\n", prop->name, prop->multiProcessorCount, prop->totalGlobalMem / 1e9);
    return gpu;
}

/* Median ms of f() over `iters` runs after `warmup` untimed ones, each timed by events recorded on the
 * context's stream around it; *min_ms gets the fastest. */
template <typename F>
static double bench_time_ms(moe_gpu *gpu, int warmup, int iters, F f, double *min_ms) {
    cudaEvent_t start, stop;
    BENCH_CUDA(cudaEventCreate(&start));
    BENCH_CUDA(cudaEventCreate(&stop));
    for (int i = 0; i < warmup; i++) f();
    double *ms = (double *)malloc(iters * sizeof(double));
    if (!ms) bench_fail("out of memory");
    for (int i = 0; i < iters; i++) {
        BENCH_CUDA(cudaEventRecord(start, gpu->stream));
        f();
        BENCH_CUDA(cudaEventRecord(stop, gpu->stream));
        BENCH_CUDA(cudaEventSynchronize(stop));
        float t = 0;
        BENCH_CUDA(cudaEventElapsedTime(&t, start, stop));
        ms[i] = t;
    }
    *min_ms = bench_min(ms, iters);
    double med = bench_median(ms, iters);
    free(ms);
    BENCH_CUDA(cudaEventDestroy(start));
    BENCH_CUDA(cudaEventDestroy(stop));
    return med;
}

#endif
