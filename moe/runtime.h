/* runtime.h — where the work runs: the CPU, or one CUDA device with its stream and handles (core/gpu.h).
 * A runtime owns its memory functions and the tables of ops that run there (the MoE layer's, moe/layer_ops.h;
 * the dense model's, moe/dense_ops.h), so orchestration code (moe/layer.c, models/) is written once. Who talks
 * to whom is the parallel layout's business (alltoall/parallel.h); a GPU layout borrows the runtime's GPU.
 *
 * Memory: "device" memory is the runtime's (host memory on the CPU). Host syncs: alloc, free (cudaFree waits
 * for the device), upload, download and synchronize wait; copy, zero and the *_async copies are queued. */
#ifndef MOE_MOE_RUNTIME_H
#define MOE_MOE_RUNTIME_H

#include <stddef.h>

#include "core/gpu.h"
#include "core/types.h"

typedef struct moe_runtime moe_runtime;

/* The CPU (OpenBLAS). */
moe_status moe_runtime_create_cpu(moe_runtime **out);
/* CUDA device `device` (only in libmoe_cuda: programs that link it). MOE_ERR_NO_DEVICE when the ordinal is
 * not a usable device. */
moe_status moe_runtime_create_cuda(int device, moe_runtime **out);
void moe_runtime_destroy(moe_runtime *rt);

const char *moe_runtime_name(const moe_runtime *rt); /* "cpu", "cuda" */
/* The CUDA context, or NULL on the CPU (a GPU parallel layout's transports use its stream). */
moe_gpu *moe_runtime_gpu(const moe_runtime *rt);

/* Device memory (zeroed); NULL-safe free. */
moe_status moe_runtime_alloc(moe_runtime *rt, size_t nbytes, void **out);
void moe_runtime_free(moe_runtime *rt, void *ptr);
/* How many allocations (moe_runtime_alloc, moe_runtime_host_alloc, the regrows and scratch growth through them) the
 * runtime has made: a training step after the first should make none (issue 50, item 4; on a GPU each is a
 * cudaMalloc, and growing frees first, which waits for the device). */
unsigned long long moe_runtime_allocations(const moe_runtime *rt);
/* Waits for the runtime's queued work, then frees and reallocates n device buffers to nbytes[i] each (contents are
 * not kept): how every buffer that grows with the batch grows. */
moe_status moe_runtime_regrow(moe_runtime *rt, void **ptrs[], const size_t *nbytes, int n);
/* Scratch shared by every user of the runtime, one purpose per slot. Its users run one after another on the
 * runtime (each MoE layer's backward in turn, on the one stream), so one buffer of the largest size asked serves
 * them all, instead of one per layer. *out is valid until the next call for the slot with a larger nbytes (which
 * frees and reallocates; contents are not kept) or the runtime's end. */
typedef enum {
    MOE_SCRATCH_EXPERT_WGRAD, /* the experts' per-segment weight-gradient leaves (experts/expert_ffn.h) */
    /* an MoE layer's buffers that live within one pass (moe/layer.c) */
    MOE_SCRATCH_SEND_XP,      /* [T k, d] input rows in send order          */
    MOE_SCRATCH_SEND_DY,      /* [T k, d] dL/dy in send order               */
    MOE_SCRATCH_SEND_DXP,     /* [T k, d] dL/dxp back from the experts      */
    MOE_SCRATCH_RECV_STAGING, /* [N, d] the exchanges' landing zone         */
    MOE_SCRATCH_RECV_Y,       /* [N, d] expert outputs                      */
    MOE_SCRATCH_RECV_DY,      /* [N, d]                                     */
    MOE_SCRATCH_RECV_DX,      /* [N, d]                                     */
    MOE_SCRATCH_EXPERT_DH_A,  /* the experts' backward scratch (moe/layer_ops_*.c) */
    MOE_SCRATCH_EXPERT_DH_B,
    MOE_SCRATCH_EXPERT_STAGE, /* ... and the CPU experts' bf16-staged GEMM inputs: MOE_GEMM_STAGE_SLOTS slots */
    MOE_SCRATCH_EXPERT_STAGE_END = MOE_SCRATCH_EXPERT_STAGE + 4,
    /* what an MoE layer keeps for backward unless recomputed (moe.h's moe_recompute): then one slot serves every
     * layer, rebuilt just before each layer's backward */
    MOE_SCRATCH_KEEP_X,       /* [T, d] the layer's input                   (recompute full)      */
    MOE_SCRATCH_KEEP_Y,       /* [T k, d] expert outputs in send order      (recompute full)      */
    MOE_SCRATCH_KEEP_RECV_X,  /* [N, d] the rows the experts received       (recompute full)      */
    MOE_SCRATCH_KEEP_H_A,     /* the experts' SwiGLU intermediates          (recompute moe, full) */
    MOE_SCRATCH_KEEP_H_B,
    MOE_SCRATCH_KEEP_H_C,
    MOE_SCRATCH_SLOTS
} moe_scratch_slot;
moe_status moe_runtime_scratch(moe_runtime *rt, moe_scratch_slot slot, size_t nbytes, void **out);

/* Host memory the device can copy from and to asynchronously (pinned on CUDA). */
moe_status moe_runtime_host_alloc(moe_runtime *rt, size_t nbytes, void **out);
void moe_runtime_host_free(moe_runtime *rt, void *ptr);

/* Synchronous copies between host and device memory (either way may name the same buffer twice on the CPU). */
moe_status moe_runtime_upload(moe_runtime *rt, void *dst, const void *host_src, size_t nbytes);
moe_status moe_runtime_download(moe_runtime *rt, void *host_dst, const void *src, size_t nbytes);
/* Queued copies between device memory and runtime host memory: host_src must stay as it is, and host_dst
 * is complete, only after the next moe_runtime_synchronize. */
moe_status moe_runtime_upload_async(moe_runtime *rt, void *dst, const void *host_src, size_t nbytes);
moe_status moe_runtime_download_async(moe_runtime *rt, void *host_dst, const void *src, size_t nbytes);
/* Queued, within device memory. */
moe_status moe_runtime_copy(moe_runtime *rt, void *dst, const void *src, size_t nbytes);
moe_status moe_runtime_zero(moe_runtime *rt, void *dst, size_t nbytes);
/* Queued, within device memory: `rows` rows of width_nbytes, read every src_pitch bytes and written every dst_pitch
 * bytes (a block of columns out of a row-major matrix, or into one). The regions must not overlap. */
moe_status moe_runtime_copy_2d(moe_runtime *rt, void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                               size_t width_nbytes, size_t rows);
/* Waits for everything queued; a fault on the device shows up here. */
moe_status moe_runtime_synchronize(moe_runtime *rt);

#endif
