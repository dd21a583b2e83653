/* bench_moe_layer_gpu.c — the gpu variant of the MoE layer benchmark (bench_moe_layer_driver.h): wall time
 * of the layer on one GPU (moe_runtime_create_cuda(0), moe_parallel_create_self_gpu: a world of one).
 *
 * The driver measures forward, backward and forward+backward ms (median and min over --iters after
 * --warmup; the runtime is synchronised after each part, so each time includes the device's work), the GEMM
 * FLOPs (experts: forward 3 GEMMs of 2*rows*d*d_ff with rows = kept assignments, backward twice that; plus
 * the router's) and the achieved GFLOP/s; the model and batch are made on the host from --seed and uploaded.
 * The expert GEMM path: fixed row blocks with --layout-invariant 1 (the default); with 0, MOE_EXPERT_GEMM
 * (per-expert, the default, or grouped). Exits 77 without a GPU, after the flags are parsed (so --help and
 * --dry-run work anywhere). Last line: "json: {...}".
 * Compare with bench/bench_moe_layer_torch_gpu.py on the same shapes.
 *
 *   ninja -C build bench/bench_moe_layer_gpu && build/bench/bench_moe_layer_gpu [--tokens 16384
 *       --d-model 4096 --d-ff 14336 --experts 8 --top-k 2 --capacity-factor 0 --warmup 3 --iters 10]
 */
#include <stdlib.h>

#include "alltoall/parallel_gpu.h"
#include "bench/bench_moe_layer_driver.h"
#include "core/gpu_cuda.h"

static struct cudaDeviceProp prop;

static void open_gpu(bench_layer_run *r) {
    int devices = 0;
    bench_check(moe_gpu_device_count(&devices), "moe_gpu_device_count");
    if (devices == 0) {
        printf("bench_moe_layer_gpu: no CUDA device on this machine; nothing to measure\n");
        exit(77);
    }
    bench_check(moe_runtime_create_cuda(0, &r->rt), "moe_runtime_create_cuda(0)");
    bench_check(moe_parallel_create_self_gpu(moe_runtime_gpu(r->rt), &r->par), "moe_parallel_create_self_gpu");
    if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) bench_fail("cudaGetDeviceProperties failed");
}

/* moe/layer_ops_cuda.c's choice: row blocks under layout invariance, else MOE_EXPERT_GEMM's */
static const char *expert_gemm_mode(const bench_layer_run *r) {
    const char *mode = getenv("MOE_EXPERT_GEMM");
    return r->cfg.layout_invariant ? "row-blocks" : mode ? mode : "per-expert";
}

static void describe_gpu(const bench_layer_run *r) {
    (void)r;
    printf("gpu %s (%d SMs, %.1f GB) | expert GEMMs: %s\n", prop.name, prop.multiProcessorCount,
           prop.totalGlobalMem / 1e9, expert_gemm_mode(r));
}

static void json_gpu(const bench_layer_run *r) {
    (void)r;
    printf(",\"gpu\":");
    bench_json_string(prop.name);
    printf(",\"expert_gemm\":");
    bench_json_string(expert_gemm_mode(r));
}

static const bench_layer_variant kGpu = {
    .program = "bench_moe_layer_gpu",
    .bench = "moe_layer_gpu",
    .synopsis = "bench_moe_layer_gpu [flags]",
    .about = "wall time of the MoE layer (forward, backward) on one GPU; exit 77 without a GPU",
    .notes = "MOE_EXPERT_GEMM=per-expert|grouped picks the expert GEMM path with --layout-invariant 0",
    .tokens_flag = "--tokens",
    .defaults = {.tokens = 16384, .d_model = 4096, .d_ff = 14336, .experts = 8, .top_k = 2, .layout_invariant = 1,
                 .precision = MOE_PRECISION_BF16, /* the CUDA experts run bf16 */
                 .warmup = 3, .iters = 10, .seed = 1, .capacity_factor = 0, .ep = 1},
    .open = open_gpu,
    .describe = describe_gpu,
    .json = json_gpu,
};

int main(int argc, char **argv) { return bench_moe_layer_main(&kGpu, argc, argv); }
