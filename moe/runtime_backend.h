/* runtime_backend.h — inside moe/ only: what a runtime is made of, for the files that build one
 * (runtime.c for the CPU, runtime_cuda.c for CUDA) and for the orchestration that runs its op tables. */
#ifndef MOE_MOE_RUNTIME_BACKEND_H
#define MOE_MOE_RUNTIME_BACKEND_H

#include "moe/dense_ops.h"
#include "moe/layer_ops.h"
#include "moe/runtime.h"

/* The memory functions of runtime.h, per kind of runtime; `async` copies go between device memory and
 * runtime host memory; same-kind copies and zeroing are queued. */
typedef enum { MOE_COPY_TO_DEVICE, MOE_COPY_TO_HOST, MOE_COPY_ON_DEVICE } moe_copy_direction;

typedef struct {
    moe_status (*alloc)(moe_runtime *rt, size_t nbytes, void **out);
    void (*free)(moe_runtime *rt, void *ptr);
    moe_status (*host_alloc)(moe_runtime *rt, size_t nbytes, void **out);
    void (*host_free)(moe_runtime *rt, void *ptr);
    moe_status (*copy)(moe_runtime *rt, void *dst, const void *src, size_t nbytes, moe_copy_direction dir);
    moe_status (*copy_2d)(moe_runtime *rt, void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                          size_t width_nbytes, size_t rows);
    moe_status (*zero)(moe_runtime *rt, void *dst, size_t nbytes);
    moe_status (*synchronize)(moe_runtime *rt);
} moe_memory_ops;

struct moe_runtime {
    const char *name;
    moe_gpu *gpu; /* owned; NULL on the CPU */
    const moe_memory_ops *memory;
    const moe_layer_ops *layer;
    const moe_dense_ops *dense;
    void (*destroy)(moe_runtime *rt); /* frees the context (if any) and rt */
    void *scratch[MOE_SCRATCH_SLOTS];  /* moe_runtime_scratch's, freed before destroy */
    size_t scratch_nbytes[MOE_SCRATCH_SLOTS];
    unsigned long long allocations; /* moe_runtime_alloc and _host_alloc calls so far (moe_runtime_allocations) */
};

#endif
