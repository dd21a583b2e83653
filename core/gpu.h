/* gpu.h — the CUDA context one rank's GPU work runs in (its device, one compute stream, a cuBLAS handle,
 * scratch for CUB), opaque to C callers. Every CUDA op of router/, kernels/ and experts/ takes one and
 * queues its work on the context's stream; ops that must return a host value (counts, losses, a
 * non-finite flag) synchronise that stream and say so in their header.
 *
 * Only builds with CUDA (libmoe_cuda) define these functions; the declarations are plain C so that
 * device-agnostic headers can name the type. */
#ifndef MOE_CORE_GPU_H
#define MOE_CORE_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "core/types.h"

typedef struct moe_gpu moe_gpu;

/* *count = the visible CUDA devices: 0 when no NVIDIA driver is installed or the driver sees no device. Any other
 * failure is MOE_ERR_CUDA with the reason (a driver older than the CUDA runtime, a broken installation): a GPU
 * machine that cannot run CUDA must fail loudly, not read as a machine without a GPU. */
moe_status moe_gpu_device_count(int *count);

/* Makes `device` current on this thread and creates the stream and the cuBLAS and cuBLASLt handles on it.
 * MOE_ERR_NO_DEVICE when the ordinal is not a usable device. */
moe_status moe_gpu_create(int device, moe_gpu **out);
void moe_gpu_destroy(moe_gpu *gpu);
int moe_gpu_device(const moe_gpu *gpu);
/* The device's free and total memory now (cudaMemGetInfo). */
moe_status moe_gpu_memory_info(moe_gpu *gpu, size_t *free_bytes, size_t *total_bytes);
/* What the GPU's bits depend on, as one line into out: "NVIDIA H100 80GB HBM3, 132 SMs, sm_90; CUDA runtime 12.4,
 * driver 12.8; cuBLAS 12.4.5" (cuBLAS picks its kernels by the model, SM count and version). */
moe_status moe_gpu_describe(moe_gpu *gpu, char *out, size_t n);

/* Waits for everything queued on the context's stream; a kernel fault shows up here as MOE_ERR_CUDA
 * (with a message naming it). */
moe_status moe_gpu_synchronize(moe_gpu *gpu);
/* Opens (start 1) or closes (0) the range a profiler started with "collection off" records (cudaProfilerStart /
 * Stop: Nsight Compute's --profile-from-start off); waits for the stream first, so the range holds whole steps. */
moe_status moe_gpu_profiler_range(moe_gpu *gpu, int start);

/* Device memory (cudaMalloc on the context's device, never managed memory); NULL-safe free. */
moe_status moe_gpu_alloc(moe_gpu *gpu, size_t nbytes, void **out);
void moe_gpu_free(moe_gpu *gpu, void *ptr);
/* Copies on the context's stream; the ones that touch host memory are synchronous on return. */
moe_status moe_gpu_upload(moe_gpu *gpu, void *device_dst, const void *host_src, size_t nbytes);
moe_status moe_gpu_download(moe_gpu *gpu, void *host_dst, const void *device_src, size_t nbytes);
moe_status moe_gpu_copy(moe_gpu *gpu, void *device_dst, const void *device_src, size_t nbytes);
/* Any direction (unified addressing), queued on the stream: asynchronous when the host side is pinned
 * (moe_gpu_host_alloc), complete after the next moe_gpu_synchronize. */
moe_status moe_gpu_copy_async(moe_gpu *gpu, void *dst, const void *src, size_t nbytes);
/* rows rows of width_nbytes, from src every src_pitch bytes to dst every dst_pitch bytes (cudaMemcpy2DAsync), queued */
moe_status moe_gpu_copy_2d_async(moe_gpu *gpu, void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                                 size_t width_nbytes, size_t rows);
/* Pinned host memory (zeroed); NULL-safe free. */
moe_status moe_gpu_host_alloc(moe_gpu *gpu, size_t nbytes, void **out);
void moe_gpu_host_free(moe_gpu *gpu, void *ptr);
moe_status moe_gpu_zero(moe_gpu *gpu, void *device_dst, size_t nbytes);

/* What made the host wait for the device, and how often it allocated, counted per context (issue 50, item 4: a
 * training step should wait at most once per MoE layer and once at its end, and allocate nothing after its first
 * step; moe-train prints each step's counts on a GPU). Every wait of libmoe_cuda goes through moe_gpu_wait with a
 * reason (a string literal: the copies that return host values, the synchronisations, the MPI staging) and every
 * cudaMalloc or cudaMallocHost through moe_gpu_count_allocation. */
enum { MOE_GPU_WAIT_REASONS = 24 };
typedef struct {
    const char *reason[MOE_GPU_WAIT_REASONS]; /* in the order first met; the last slot takes every later reason */
    unsigned long long waits[MOE_GPU_WAIT_REASONS];
    int reasons;
    unsigned long long allocations;
} moe_gpu_counters;
moe_status moe_gpu_wait(moe_gpu *gpu, const char *reason); /* cudaStreamSynchronize, counted */
void moe_gpu_count_wait(moe_gpu *gpu, const char *reason);  /* a wait of the caller's own (an event polled) */
void moe_gpu_count_allocation(moe_gpu *gpu);
void moe_gpu_counters_get(const moe_gpu *gpu, moe_gpu_counters *out);
/* Plain C (libmoe: core/gpu_counters.c), for hosts without CUDA too: a reason's slot (the last one when they run
 * out), and the counts from `before` to `now` as one line, "14 host waits (sum of squares 5, cross-entropy loss 2,
 * ...); 0 device allocations", the reasons in decreasing count. */
int moe_gpu_counters_slot(moe_gpu_counters *c, const char *reason);
void moe_gpu_counters_delta_text(const moe_gpu_counters *now, const moe_gpu_counters *before, char *out, size_t n);

#endif
