/* train/device_cuda.h — moe-train's CUDA part: a module of its own (libmoe_train_cuda.so, beside moe-train),
 * loaded by train/device.c only on --device cuda, so that a CPU run does not load the CUDA libraries (cuBLAS
 * and cuBLASLt alone cost each process ~80 ms of CPU and 27,000 page faults at start). The module holds
 * libmoe_cuda and resolves the rest of the library against moe-train's own symbols (moe-train exports them),
 * so that one copy of each exists (the failure messages of core/fail.c above all). */
#ifndef MOE_TRAIN_DEVICE_CUDA_H
#define MOE_TRAIN_DEVICE_CUDA_H

#include "train/device.h"

#define MOE_TRAIN_CUDA_MODULE "libmoe_train_cuda.so"

/* The module's entry points, found by these names. */
#define MOE_TRAIN_CUDA_PLACE "moe_train_place_cuda"
#define MOE_TRAIN_CUDA_PROFILER_RANGE "moe_train_cuda_profiler_range"
#define MOE_TRAIN_CUDA_COUNTERS "moe_train_cuda_counters"
#define MOE_TRAIN_CUDA_GEMMS "moe_train_cuda_gemms"

/* moe_train_place's --device cuda (train/device.h): the device, the runtime on it, the layout, the memory check. */
typedef moe_status (*moe_train_place_cuda_fn)(const moe_train_options *o, MPI_Comm world, FILE *log,
                                              moe_train_placement *out);
/* Starts (start 1) or stops (0) the profiler's range on the runtime's device. */
typedef moe_status (*moe_train_cuda_profiler_range_fn)(moe_runtime *rt, int start);
/* The runtime's GPU's host waits and allocations so far (core/gpu.h). */
typedef void (*moe_train_cuda_counters_fn)(moe_runtime *rt, moe_gpu_counters *out);
/* The GEMMs pinned on the runtime's device so far, a line each (kernels/gemm_lt.h); returns what snprintf would. */
typedef int (*moe_train_cuda_gemms_fn)(moe_runtime *rt, char *out, size_t n);

/* From moe-train, for the module: moe_train_agree (train/rank_agreement.h). */

moe_status moe_train_place_cuda(const moe_train_options *o, MPI_Comm world, FILE *log, moe_train_placement *out);
moe_status moe_train_cuda_profiler_range(moe_runtime *rt, int start);
void moe_train_cuda_counters(moe_runtime *rt, moe_gpu_counters *out);
int moe_train_cuda_gemms(moe_runtime *rt, char *out, size_t n);

#endif
