/* train/device_cuda.c — the CUDA placement of moe-train (train/device_cuda.h): built as its own module where
 * libmoe_cuda builds, loaded by train/device.c on --device cuda. */
#include "train/device_cuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alltoall/comm_gpu_mpi.h"
#include "alltoall/parallel_gpu_mpi.h"
#include "alltoall/parallel_mpi.h"
#include "core/fail.h"
#include "core/gpu.h"
#include "kernels/attention.h"
#include "kernels/gemm_lt.h"
#include "train/machine.h"
#include "train/rank_agreement.h"

/* The ranks of this node and this rank's index among them. */
static void node_layout(MPI_Comm world, int *node_rank, int *node_ranks) {
    MPI_Comm node;
    *node_rank = 0, *node_ranks = 1;
    if (MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) != MPI_SUCCESS) return;
    MPI_Comm_rank(node, node_rank);
    MPI_Comm_size(node, node_ranks);
    MPI_Comm_free(&node);
}

/* An estimate of what this rank keeps on its GPU (train/options.h; 12-40% above the peaks measured on the CPU), refused
 * when more than the device has free: a sentence now instead of an out-of-memory error in the middle of set-up. */
static moe_status check_memory(const moe_train_options *o, int world_size, moe_gpu *gpu, int device, FILE *log) {
    const moe_train_memory need = moe_train_options_memory(o, world_size);
    size_t free_bytes = 0, total_bytes = 0;
    MOE_TRY(moe_gpu_memory_info(gpu, &free_bytes, &total_bytes));
    const double gib = 1024.0 * 1024 * 1024;
    if (log)
        fprintf(log, "GPU memory per rank: about %.2f GiB (weights and gradients %.2f, AdamW moments %.2f, "
                     "activations %.2f) of %.1f GiB free on device %d (%.1f GiB)\n",
                need.total / gib, need.params / gib, need.moments / gib, need.activations / gib, free_bytes / gib,
                device, total_bytes / gib);
    if (need.total <= (double)free_bytes) return MOE_OK;
    return moe_fail(MOE_ERR_OUT_OF_MEMORY, "this configuration needs about %.2f GiB on each GPU (weights and "
                    "gradients %.2f, AdamW moments %.2f, activations %.2f GiB) but device %d has %.2f GiB free: use "
                    "a smaller --batch, --micro-batches with a smaller batch, --zero 1, a larger --ep, or more GPUs",
                    need.total / gib, need.params / gib, need.moments / gib, need.activations / gib, device,
                    free_bytes / gib);
}

moe_status moe_train_place_cuda(const moe_train_options *o, MPI_Comm world, FILE *log, moe_train_placement *out) {
    int node_rank, node_ranks, world_size, count = 0;
    MPI_Comm_size(world, &world_size);
    node_layout(world, &node_rank, &node_ranks);
    moe_status st = moe_gpu_device_count(&count);
    if (st == MOE_OK && count == 0)
        st = moe_fail(MOE_ERR_NO_DEVICE, "--device cuda: this node has no CUDA device (or no NVIDIA driver)");
    const int share = count > 0 && node_ranks > count;
    moe_gpu_transport transport = o->gpu_transport >= 0 ? (moe_gpu_transport)o->gpu_transport
                                  : share             ? MOE_GPU_TRANSPORT_MPI
                                                      : MOE_GPU_TRANSPORT_NCCL;
#ifndef MOE_HAVE_NCCL
    if (o->gpu_transport < 0) transport = MOE_GPU_TRANSPORT_MPI; /* the only one in this build */
#endif
    if (st == MOE_OK && share && transport == MOE_GPU_TRANSPORT_NCCL)
        st = moe_fail(MOE_ERR_INVALID_CONFIG, "%d ranks on a node with %d GPU(s): NCCL refuses two ranks on one GPU; "
                      "use --gpu-transport mpi or at most one rank per GPU", node_ranks, count);
    out->device = count > 0 ? node_rank % count : -1;
    if (st == MOE_OK) st = moe_runtime_create_cuda(out->device, &out->rt);
    if (st == MOE_OK) st = check_memory(o, world_size, moe_runtime_gpu(out->rt), out->device, log);
    char gpu[384]; /* the machine record's "gpu" (train/machine.h): checkpoints keep it, a resume elsewhere says so */
    if (st == MOE_OK) st = moe_gpu_describe(moe_runtime_gpu(out->rt), gpu, sizeof gpu);
#ifdef MOE_HAVE_NCCL
    if (st == MOE_OK && transport == MOE_GPU_TRANSPORT_NCCL) { /* its collectives' algorithms are its version's */
        const size_t used = strlen(gpu);
        snprintf(gpu + used, sizeof gpu - used, "; ");
        st = moe_comm_nccl_version(gpu + strlen(gpu), sizeof gpu - strlen(gpu));
    }
#endif
    if (st == MOE_OK) moe_run_machine_set_gpu(gpu);
    MOE_TRY(moe_train_agree(world, st));
    if (log)
        fprintf(log, "placement: %d rank(s) per node on %d GPU(s); %s transport\n", node_ranks, count,
                transport == MOE_GPU_TRANSPORT_NCCL ? "NCCL" : "MPI-staged");
    /* the bf16 attention's slow path, said once (kernels/attention.h: flash where the head_dim has its kernels) */
    const int hd = moe_model_head_dim(&o->model);
    const char *flash = getenv("MOE_FLASH_ATTENTION");
    char why[64];
    snprintf(why, sizeof why, flash && !strcmp(flash, "0") ? "MOE_FLASH_ATTENTION=0" : "head_dim %d", hd);
    if (log && o->model.attention == MOE_ATTENTION_FUSED &&
        moe_precision_bf16_inputs(o->model.moe.precision, MOE_GEMM_ATTENTION) &&
        !moe_attention_flash_applies(hd))
        fprintf(log, "note: attention runs its fp32 kernels, one thread per query row (~1 TFLOP/s on an H100), not the "
                "tensor-core flash ones (head_dim 32, 64 or 128): %s\n", why);
    return moe_parallel_create_mpi_gpu(world, o->pp, o->ep, o->tp, o->exchange_timeout_s, moe_runtime_gpu(out->rt),
                                       transport, &out->par);
}

void moe_train_cuda_counters(moe_runtime *rt, moe_gpu_counters *out) { moe_gpu_counters_get(moe_runtime_gpu(rt), out); }

int moe_train_cuda_gemms(moe_runtime *rt, char *out, size_t n) {
    return moe_gemm_lt_context_describe(moe_runtime_gpu(rt), out, n);
}

moe_status moe_train_cuda_profiler_range(moe_runtime *rt, int start) {
    return moe_gpu_profiler_range(moe_runtime_gpu(rt), start);
}
