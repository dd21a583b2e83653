/* bench_moe_layer_gpu.c — wall time of the MoE layer on one GPU (CUDA backend, a world of one):
 * forward, backward and forward+backward ms (median and min over --iters after --warmup; each call
 * returns after its work is done), the expert GEMM FLOPs (forward 3 GEMMs of 2*rows*d*d_ff with rows =
 * kept assignments, backward twice that) and the achieved TFLOP/s. The expert GEMM path is picked by
 * MOE_EXPERT_GEMM (per-expert, the default, or grouped). Exits 77 without a GPU. Last line: "json: {...}".
 * Compare with bench/bench_moe_layer_torch.py --device cuda on the same shapes.
 *
 *   build/bench/bench_moe_layer_gpu [--tokens 16384 --d-model 4096 --d-ff 14336 --experts 8 --top-k 2
 *       --capacity-factor 0 --warmup 3 --iters 10]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alltoall/parallel_gpu.h"
#include "bench/bench_util.h"
#include "core/gpu_cuda.h"
#include "core/rng.h"

typedef struct {
    int tokens, d_model, d_ff, experts, top_k, warmup, iters;
    double capacity_factor;
} options;

static void usage(FILE *f) {
    fprintf(f, "usage: bench_moe_layer_gpu [--tokens N] [--d-model N] [--d-ff N] [--experts N] [--top-k N]\n"
               "                           [--capacity-factor X] [--warmup N] [--iters N]\n"
               "  defaults: --tokens 16384 --d-model 4096 --d-ff 14336 --experts 8 --top-k 2\n"
               "            --capacity-factor 0 (dropless) --warmup 3 --iters 10\n");
}

static options parse_args(int argc, char **argv) {
    options o = {16384, 4096, 14336, 8, 2, 3, 10, 0.0};
    for (int i = 1; i < argc; i++) {
        bench_flag f = bench_next_flag(argc, argv, &i);
        int *target = !strcmp(f.name, "tokens")    ? &o.tokens
                      : !strcmp(f.name, "d-model") ? &o.d_model
                      : !strcmp(f.name, "d-ff")    ? &o.d_ff
                      : !strcmp(f.name, "experts") ? &o.experts
                      : !strcmp(f.name, "top-k")   ? &o.top_k
                      : !strcmp(f.name, "warmup")  ? &o.warmup
                      : !strcmp(f.name, "iters")   ? &o.iters
                                                   : NULL;
        if (target) *target = bench_parse_int(f.name, f.value, 1, 1 << 26);
        else if (!strcmp(f.name, "capacity-factor"))
            o.capacity_factor = bench_parse_real(f.value, 0, 1e6, "--capacity-factor must be in [0, 1e6]");
        else bench_usage_error("unknown flag", f.name);
    }
    return o;
}

/* n floats of scale * [-1, 1) on the device, made on the host in chunks */
static float *device_uniform(moe_gpu *gpu, moe_rng *rng, size_t n, double scale) {
    void *dev;
    bench_check(moe_gpu_alloc(gpu, n * sizeof(float), &dev), "cudaMalloc");
    const size_t chunk = 1 << 22;
    float *host = malloc(chunk * sizeof(float));
    if (!host) bench_fail("out of memory");
    for (size_t at = 0; at < n; at += chunk) {
        size_t m = n - at < chunk ? n - at : chunk;
        moe_rng_fill_uniform(rng, host, m, scale);
        bench_check(moe_gpu_upload(gpu, (float *)dev + at, host, m * sizeof(float)), "upload");
    }
    free(host);
    return dev;
}

int main(int argc, char **argv) {
    bench_init("bench_moe_layer_gpu", usage);
    options o = parse_args(argc, argv);
    if (moe_gpu_device_count() == 0) {
        printf("bench_moe_layer_gpu: no CUDA device on this machine\n");
        return 77;
    }
    moe_runtime *rt;
    moe_parallel *par;
    bench_check(moe_runtime_create_cuda(0, &rt), "CUDA runtime");
    moe_gpu *gpu = moe_runtime_gpu(rt);
    bench_check(moe_parallel_create_self_gpu(gpu, &par), "GPU layout");
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) bench_fail("cudaGetDeviceProperties failed");
    moe_config cfg = moe_config_default(o.d_model, o.d_ff, o.experts, o.top_k);
    cfg.capacity_factor = (float)o.capacity_factor;
    const char *mode = getenv("MOE_EXPERT_GEMM");
    printf("gpu %s | T=%d d=%d d_ff=%d E=%d k=%d cf=%g | expert GEMMs: %s\n", prop.name, o.tokens, o.d_model, o.d_ff,
           o.experts, o.top_k, o.capacity_factor, mode ? mode : "per-expert");
    moe_rng rng = moe_rng_seeded(1);
    size_t P = moe_layer_num_params(&cfg), n = (size_t)o.tokens * o.d_model;
    float *w = device_uniform(gpu, &rng, P, 0.02), *g = device_uniform(gpu, &rng, P, 0);
    float *x = device_uniform(gpu, &rng, n, 1), *dout = device_uniform(gpu, &rng, n, 1);
    float *out = device_uniform(gpu, &rng, n, 0), *dx = device_uniform(gpu, &rng, n, 0);
    moe_layer_weights wv = moe_layer_weights_view(&cfg, w), gv = moe_layer_weights_view(&cfg, g);
    moe_layer *L;
    bench_check(moe_layer_create(&cfg, rt, par, &L), "moe_layer_create");

    double *fwd = malloc(o.iters * sizeof(double)), *bwd = malloc(o.iters * sizeof(double));
    double *both = malloc(o.iters * sizeof(double));
    moe_layer_stats st;
    for (int it = -o.warmup; it < o.iters; it++) {
        double t0 = bench_now_ms();
        bench_check(moe_layer_forward(L, &wv, x, o.tokens, out, &st), "forward");
        double t1 = bench_now_ms();
        bench_check(moe_layer_backward(L, &wv, dout, dx, &gv), "backward");
        double t2 = bench_now_ms();
        if (it >= 0) fwd[it] = t1 - t0, bwd[it] = t2 - t1, both[it] = t2 - t0;
    }
    double rows = (double)st.num_rows_received, flops_fwd = 3 * 2 * rows * o.d_model * o.d_ff;
    double f_ms = bench_median(fwd, o.iters), b_ms = bench_median(bwd, o.iters), fb_ms = bench_median(both, o.iters);
    printf("forward  %8.3f ms (min %8.3f)  expert GEMMs %.1f TFLOP/s\n", f_ms, bench_min(fwd, o.iters),
           flops_fwd / f_ms * 1e-9);
    printf("backward %8.3f ms (min %8.3f)  expert GEMMs %.1f TFLOP/s\n", b_ms, bench_min(bwd, o.iters),
           2 * flops_fwd / b_ms * 1e-9);
    printf("fwd+bwd  %8.3f ms (min %8.3f)  dropped %d of %d\n", fb_ms, bench_min(both, o.iters), st.num_dropped,
           st.num_assignments);
    printf("json: {\"gpu\": ");
    bench_json_string(prop.name);
    printf(", \"tokens\": %d, \"d_model\": %d, \"d_ff\": %d, \"experts\": %d, \"top_k\": %d, \"expert_gemm\": ", o.tokens,
           o.d_model, o.d_ff, o.experts, o.top_k);
    bench_json_string(mode ? mode : "per-expert");
    printf(", \"forward_ms\": %.4f, \"backward_ms\": %.4f, \"fwd_bwd_ms\": %.4f}\n", f_ms, b_ms, fb_ms);
    moe_layer_destroy(L);
    float *bufs[] = {w, g, x, dout, out, dx};
    for (int i = 0; i < 6; i++) moe_gpu_free(gpu, bufs[i]);
    moe_parallel_destroy(par);
    moe_runtime_destroy(rt);
    free(fwd), free(bwd), free(both);
    return 0;
}
