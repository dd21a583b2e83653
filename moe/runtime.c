/* runtime.c — the runtime's functions (runtime.h), which forward to its memory table, and the CPU runtime:
 * host memory, the CPU op tables (layer_ops_cpu.c, dense_ops_cpu.c). */
#include <stdlib.h>
#include <string.h>

#include "core/fail.h"
#include "moe/runtime_backend.h"

const char *moe_runtime_name(const moe_runtime *rt) { return rt->name; }
moe_gpu *moe_runtime_gpu(const moe_runtime *rt) { return rt->gpu; }
const moe_dense_ops *moe_runtime_dense_ops(const moe_runtime *rt) { return rt->dense; }

void moe_runtime_destroy(moe_runtime *rt) {
    if (!rt) return;
    for (int i = 0; i < MOE_SCRATCH_SLOTS; i++) moe_runtime_free(rt, rt->scratch[i]);
    rt->destroy(rt);
}

moe_status moe_runtime_alloc(moe_runtime *rt, size_t nbytes, void **out) {
    rt->allocations++;
    return rt->memory->alloc(rt, nbytes, out);
}

unsigned long long moe_runtime_allocations(const moe_runtime *rt) { return rt->allocations; }
void moe_runtime_free(moe_runtime *rt, void *ptr) { rt->memory->free(rt, ptr); }

moe_status moe_runtime_regrow(moe_runtime *rt, void **ptrs[], const size_t *nbytes, int n) {
    /* queued work may still read or write the old buffers: wait for it by contract (cudaFree waits for the device in
     * practice, but its documentation does not promise it); a regrow is rare (the first steps), so the wait is free */
    MOE_TRY(moe_runtime_synchronize(rt));
    for (int i = 0; i < n; i++) moe_runtime_free(rt, *ptrs[i]), *ptrs[i] = NULL;
    for (int i = 0; i < n; i++) MOE_TRY(moe_runtime_alloc(rt, nbytes[i], ptrs[i]));
    return MOE_OK;
}

moe_status moe_runtime_scratch(moe_runtime *rt, moe_scratch_slot slot, size_t nbytes, void **out) {
    if (slot < 0 || slot >= MOE_SCRATCH_SLOTS) return MOE_ERR_INVALID_ARG;
    if (nbytes > rt->scratch_nbytes[slot]) {
        void **ptrs[] = {&rt->scratch[slot]};
        rt->scratch_nbytes[slot] = 0;
        MOE_TRY(moe_runtime_regrow(rt, ptrs, &nbytes, 1));
        rt->scratch_nbytes[slot] = nbytes;
    }
    *out = rt->scratch[slot];
    return MOE_OK;
}

moe_status moe_runtime_host_alloc(moe_runtime *rt, size_t nbytes, void **out) {
    rt->allocations++;
    return rt->memory->host_alloc(rt, nbytes, out);
}
void moe_runtime_host_free(moe_runtime *rt, void *ptr) { rt->memory->host_free(rt, ptr); }

moe_status moe_runtime_upload(moe_runtime *rt, void *dst, const void *host_src, size_t nbytes) {
    MOE_TRY(rt->memory->copy(rt, dst, host_src, nbytes, MOE_COPY_TO_DEVICE));
    return rt->memory->synchronize(rt);
}

moe_status moe_runtime_download(moe_runtime *rt, void *host_dst, const void *src, size_t nbytes) {
    MOE_TRY(rt->memory->copy(rt, host_dst, src, nbytes, MOE_COPY_TO_HOST));
    return rt->memory->synchronize(rt);
}

moe_status moe_runtime_upload_async(moe_runtime *rt, void *dst, const void *host_src, size_t nbytes) {
    return rt->memory->copy(rt, dst, host_src, nbytes, MOE_COPY_TO_DEVICE);
}

moe_status moe_runtime_download_async(moe_runtime *rt, void *host_dst, const void *src, size_t nbytes) {
    return rt->memory->copy(rt, host_dst, src, nbytes, MOE_COPY_TO_HOST);
}

moe_status moe_runtime_copy_2d(moe_runtime *rt, void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                               size_t width_nbytes, size_t rows) {
    if (width_nbytes > dst_pitch || width_nbytes > src_pitch) return MOE_ERR_INVALID_ARG;
    return rt->memory->copy_2d(rt, dst, dst_pitch, src, src_pitch, width_nbytes, rows);
}

moe_status moe_runtime_copy(moe_runtime *rt, void *dst, const void *src, size_t nbytes) {
    return rt->memory->copy(rt, dst, src, nbytes, MOE_COPY_ON_DEVICE);
}

moe_status moe_runtime_zero(moe_runtime *rt, void *dst, size_t nbytes) { return rt->memory->zero(rt, dst, nbytes); }
moe_status moe_runtime_synchronize(moe_runtime *rt) { return rt->memory->synchronize(rt); }

/* ---- the CPU runtime ---------------------------------------------------------------------------- */

static moe_status host_alloc(moe_runtime *rt, size_t nbytes, void **out) {
    (void)rt;
    *out = calloc(1, nbytes ? nbytes : 1);
    return *out ? MOE_OK : MOE_ERR_OUT_OF_MEMORY;
}

static void host_free(moe_runtime *rt, void *ptr) {
    (void)rt;
    free(ptr);
}

static moe_status host_copy(moe_runtime *rt, void *dst, const void *src, size_t nbytes, moe_copy_direction dir) {
    (void)rt, (void)dir;
    if (nbytes && dst != src) memmove(dst, src, nbytes);
    return MOE_OK;
}

static moe_status host_copy_2d(moe_runtime *rt, void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                               size_t width_nbytes, size_t rows) {
    (void)rt;
    for (size_t r = 0; r < rows && width_nbytes; r++)
        memcpy((char *)dst + r * dst_pitch, (const char *)src + r * src_pitch, width_nbytes);
    return MOE_OK;
}

static moe_status host_zero(moe_runtime *rt, void *dst, size_t nbytes) {
    (void)rt;
    memset(dst, 0, nbytes);
    return MOE_OK;
}

static moe_status host_synchronize(moe_runtime *rt) {
    (void)rt;
    return MOE_OK;
}

static const moe_memory_ops cpu_memory = {
    .alloc = host_alloc,
    .free = host_free,
    .host_alloc = host_alloc,
    .host_free = host_free,
    .copy = host_copy,
    .copy_2d = host_copy_2d,
    .zero = host_zero,
    .synchronize = host_synchronize,
};

static void cpu_destroy(moe_runtime *rt) { free(rt); }

moe_status moe_runtime_create_cpu(moe_runtime **out) {
    if (!out) return MOE_ERR_INVALID_ARG;
    moe_runtime *rt = calloc(1, sizeof *rt);
    if (!rt) return MOE_ERR_OUT_OF_MEMORY;
    *rt = (moe_runtime){.name = "cpu", .memory = &cpu_memory, .layer = &moe_layer_ops_cpu, .dense = &moe_dense_ops_cpu,
                        .destroy = cpu_destroy};
    *out = rt;
    return MOE_OK;
}
