/* runtime_cuda.c — the CUDA runtime (moe/runtime.h): one device's context (core/gpu.h), device memory,
 * pinned host memory, copies queued on the context's stream, and the CUDA op tables: the layer's (layer_ops_cuda.c)
 * and the dense model's (dense_ops_cuda.c). In libmoe_cuda only, so libmoe keeps no CUDA symbol. */
#include <stdlib.h>

#include "core/fail.h"
#include "moe/runtime_backend.h"

static moe_status gpu_alloc(moe_runtime *rt, size_t nbytes, void **out) {
    MOE_TRY(moe_gpu_alloc(rt->gpu, nbytes, out));
    moe_status st = moe_gpu_zero(rt->gpu, *out, nbytes);
    if (st == MOE_OK) st = moe_gpu_synchronize(rt->gpu);
    if (st != MOE_OK) moe_gpu_free(rt->gpu, *out), *out = NULL;
    return st;
}

static void gpu_free(moe_runtime *rt, void *ptr) { moe_gpu_free(rt->gpu, ptr); }
static moe_status gpu_host_alloc(moe_runtime *rt, size_t nbytes, void **out) {
    return moe_gpu_host_alloc(rt->gpu, nbytes, out);
}
static void gpu_host_free(moe_runtime *rt, void *ptr) { moe_gpu_host_free(rt->gpu, ptr); }

static moe_status gpu_copy(moe_runtime *rt, void *dst, const void *src, size_t nbytes, moe_copy_direction dir) {
    (void)dir; /* unified addressing tells the directions apart */
    return moe_gpu_copy_async(rt->gpu, dst, src, nbytes);
}

static moe_status gpu_copy_2d(moe_runtime *rt, void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                              size_t width_nbytes, size_t rows) {
    return moe_gpu_copy_2d_async(rt->gpu, dst, dst_pitch, src, src_pitch, width_nbytes, rows);
}

static moe_status gpu_zero(moe_runtime *rt, void *dst, size_t nbytes) { return moe_gpu_zero(rt->gpu, dst, nbytes); }
static moe_status gpu_synchronize(moe_runtime *rt) { return moe_gpu_synchronize(rt->gpu); }

static const moe_memory_ops gpu_memory = {
    .alloc = gpu_alloc,
    .free = gpu_free,
    .host_alloc = gpu_host_alloc,
    .host_free = gpu_host_free,
    .copy = gpu_copy,
    .copy_2d = gpu_copy_2d,
    .zero = gpu_zero,
    .synchronize = gpu_synchronize,
};

static void cuda_destroy(moe_runtime *rt) {
    moe_gpu_destroy(rt->gpu);
    free(rt);
}

moe_status moe_runtime_create_cuda(int device, moe_runtime **out) {
    moe_gpu *gpu = NULL;
    MOE_TRY(moe_gpu_create(device, &gpu));
    moe_runtime *rt = calloc(1, sizeof *rt);
    if (!rt) return moe_gpu_destroy(gpu), MOE_ERR_OUT_OF_MEMORY;
    *rt = (moe_runtime){.name = "cuda", .gpu = gpu, .memory = &gpu_memory, .layer = &moe_layer_ops_cuda, .dense = &moe_dense_ops_cuda,
                        .destroy = cuda_destroy};
    *out = rt;
    return MOE_OK;
}
