/* bench_grouped_gemm.cu — the bf16 expert FFN forward on the GPU (moe_expert_ffn_forward_cuda: H13 = X W13^T,
 * act = swiglu, Y = act W2^T) over E experts, in both modes (one cublasGemmGroupedBatchedEx per projection,
 * or one cublasGemmEx per expert), against the dense equivalent: the same rows through one expert's
 * weights as one cublasGemmEx per projection plus the same swiglu kernel — the same FLOPs and bytes of
 * activations, with no grouping. Rows per expert: balanced (rows / E each) or skewed (Zipf: expert e gets
 * a share proportional to 1 / (e + 1)^s).
 *
 * Prints the GPU, then per (E, distribution, mode): median and min ms over --iters timed runs after
 * --warmup untimed ones (cudaEvent on the context's stream), TFLOP/s = 6 rows d d_ff / time, and the
 * percentage of the dense rate; one "json: {...}" line per result. Exit 77 without a GPU.
 *
 *   ninja -C build bench/bench_grouped_gemm && build/bench/bench_grouped_gemm [--experts 0 --d-model 4096
 *       --d-ff 14336 --rows 16384 --zipf 1.0 --warmup 3 --iters 10]
 * --experts 0 runs E = 8 and E = 64 (the weights of 64 experts at the defaults are 22.5 GB of bf16). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/gpu_cuda.h"

extern "C" {
#define _Noreturn [[noreturn]] /* bench_util.h is C11; the same meaning in C++ */
#include "bench/bench_util.h"
#undef _Noreturn
#include "experts/expert_ffn.h"
}

#include "bench/bench_gpu.cuh"

typedef struct {
    int experts, d_model, d_ff, rows, warmup, iters;
    double zipf;
} options;

static const bench_flag kFlags[] = {
    BENCH_INT("--experts", options, experts, 0, 1024, "experts E (0: runs E = 8, then E = 64)"),
    BENCH_INT("--d-model", options, d_model, 8, 1 << 16, "row width d, a multiple of 8"),
    BENCH_INT("--d-ff", options, d_ff, 8, 1 << 17, "hidden width of each expert, a multiple of 8"),
    BENCH_INT("--rows", options, rows, 1, 1 << 22, "rows over all experts"),
    BENCH_REAL("--zipf", options, zipf, 0, 10, "skew s of the skewed split: expert e gets a share ~ 1/(e+1)^s"),
    BENCH_INT("--warmup", options, warmup, 0, 10000, "untimed runs per measurement"),
    BENCH_INT("--iters", options, iters, 1, 10000, "timed runs per measurement"),
};

static void check(const void *opt) {
    const options *o = (const options *)opt;
    if (o->d_model % 8 || o->d_ff % 8) bench_usage_error("--d-model and --d-ff must be multiples of 8", NULL);
}

/* positional: designated initializers are C++20 */
static const bench_cli kCli = {"bench_grouped_gemm", "bench_grouped_gemm [flags]",
                               "the bf16 expert FFN forward, grouped and per-expert GEMMs, against one dense GEMM\n"
                               "of the same FLOPs; exit 77 without a GPU",
                               kFlags, sizeof kFlags / sizeof kFlags[0], NULL, check};

/* Deterministic pseudo-random bf16 in [-scale, scale): the values do not matter for timing, zeros would. */
__global__ void fill_bf16(uint16_t *p, size_t n, uint32_t seed, float scale) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
        float u = (h >> 8) * (1.0f / 16777216.0f) * 2.0f - 1.0f;
        p[i] = __bfloat16_as_ushort(__float2bfloat16_rn(u * scale));
    }
}

static uint16_t *alloc_filled(moe_gpu *gpu, size_t n, uint32_t seed, float scale) {
    void *p = NULL;
    bench_check(moe_gpu_alloc(gpu, n * sizeof(uint16_t), &p), "cudaMalloc");
    fill_bf16<<<4096, 256, 0, gpu->stream>>>((uint16_t *)p, n, seed, scale);
    BENCH_CUDA(cudaGetLastError());
    return (uint16_t *)p;
}

/* Rows per expert: offset[E + 1]. zipf = 0 gives the balanced split. */
static void split_rows(int rows, int E, double s, int *offset) {
    double total = 0;
    for (int e = 0; e < E; e++) total += pow(e + 1, -s);
    int assigned = 0;
    offset[0] = 0;
    for (int e = 0; e < E; e++) {
        int n = (int)floor(rows * pow(e + 1, -s) / total);
        offset[e + 1] = offset[e] + n, assigned += n;
    }
    for (int e = 0; assigned < rows; e = (e + 1) % E, assigned++) /* the remainder, one row each */
        for (int j = e + 1; j <= E; j++) offset[j]++;
}

static void report(const char *gpu_name, const options *o, int E, const char *dist, const char *mode, double ms,
                   double min_ms, double dense_tflops) {
    const double tflops = 6.0 * o->rows * o->d_model * o->d_ff / (ms * 1e9);
    printf("E=%-3d %-9s %-10s %9.3f ms (min %9.3f)  %7.1f TFLOP/s  %6.1f%% of dense\n", E, dist, mode, ms, min_ms,
           tflops, 100 * tflops / dense_tflops);
    printf("json: {\"bench\":\"grouped_gemm\",\"gpu\":");
    bench_json_string(gpu_name);
    printf(",\"experts\":%d,\"d_model\":%d,\"d_ff\":%d,\"rows\":%d,\"dist\":\"%s\",\"mode\":\"%s\",\"ms\":%.4f,"
           "\"min_ms\":%.4f,\"tflops\":%.2f,\"pct_dense\":%.2f}\n",
           E, o->d_model, o->d_ff, o->rows, dist, mode, ms, min_ms, tflops, 100 * tflops / dense_tflops);
}

static void run_experts(moe_gpu *gpu, const char *gpu_name, const options *o, int E) {
    const int d = o->d_model, f = o->d_ff, rows = o->rows;
    const size_t wcount = (size_t)f * d;
    size_t free_b = 0, total_b = 0;
    BENCH_CUDA(cudaMemGetInfo(&free_b, &total_b));
    const double need = 2.0 * (3.0 * E * wcount + (double)rows * (2 * d + 3 * f));
    if (need > 0.95 * free_b)
        bench_fail("E=%d needs %.1f GB of bf16 weights and activations, the GPU has %.1f GB free; lower --experts, "
                   "--d-ff or --rows",
                   E, need / 1e9, free_b / 1e9);
    moe_expert_weights_bf16 w;
    w.w13 = alloc_filled(gpu, 2 * E * wcount, 1, 0.03f);
    w.w2 = alloc_filled(gpu, E * wcount, 2, 0.03f);
    uint16_t *xp = alloc_filled(gpu, (size_t)rows * d, 3, 1.0f);
    void *h13, *act, *y;
    bench_check(moe_gpu_alloc(gpu, (size_t)rows * 2 * f * 2, &h13), "cudaMalloc");
    bench_check(moe_gpu_alloc(gpu, (size_t)rows * f * 2, &act), "cudaMalloc");
    bench_check(moe_gpu_alloc(gpu, (size_t)rows * d * 2, &y), "cudaMalloc");

    /* dense: all rows through expert 0's weights, one cublasGemmEx per projection (tensor-op math, as the
     * expert GEMMs use; column-major views as in experts/expert_ffn.cu) */
    const float one = 1.0f, zero = 0.0f;
    BENCH_CUBLAS(cublasSetMathMode(
        gpu->blas, (cublasMath_t)(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
    auto dense = [&]() {
        BENCH_CUBLAS(cublasGemmEx(gpu->blas, CUBLAS_OP_T, CUBLAS_OP_N, 2 * f, rows, d, &one, w.w13, CUDA_R_16BF, d, xp,
                                  CUDA_R_16BF, d, &zero, h13, CUDA_R_16BF, 2 * f, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT));
        bench_check(moe_swiglu_forward_cuda(gpu, (const moe_bf16 *)h13, rows, f, (moe_bf16 *)act), "moe_swiglu_forward_cuda");
        BENCH_CUBLAS(cublasGemmEx(gpu->blas, CUBLAS_OP_T, CUBLAS_OP_N, d, rows, f, &one, w.w2, CUDA_R_16BF, f, act,
                                  CUDA_R_16BF, f, &zero, y, CUDA_R_16BF, d, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    };
    double dense_min, dense_ms = bench_time_ms(gpu, o->warmup, o->iters, dense, &dense_min);
    const double dense_tflops = 6.0 * rows * d * f / (dense_ms * 1e9);
    report(gpu_name, o, E, "-", "dense", dense_ms, dense_min, dense_tflops);

    int *offset = (int *)malloc((E + 1) * sizeof(int));
    if (!offset) bench_fail("out of memory");
    const struct {
        const char *name;
        double s;
    } dists[] = {{"balanced", 0.0}, {"zipf", o->zipf}};
    for (int di = 0; di < 2; di++) {
        split_rows(rows, E, dists[di].s, offset);
        int most = 0, least = rows;
        for (int e = 0; e < E; e++) {
            int n = offset[e + 1] - offset[e];
            most = n > most ? n : most, least = n < least ? n : least;
        }
        printf("E=%-3d %-9s rows per expert: max %d, min %d\n", E, dists[di].name, most, least);
        for (int mode = 0; mode < 2; mode++) {
            auto grouped = [&]() {
                bench_check(moe_expert_ffn_forward_cuda(gpu, (moe_expert_gemm_mode)mode, &w, E, d, f, offset,
                                                    (const moe_bf16 *)xp, (moe_bf16 *)h13, (moe_bf16 *)act,
                                                    (moe_bf16 *)y),
                            "moe_expert_ffn_forward_cuda");
            };
            double min_ms, ms = bench_time_ms(gpu, o->warmup, o->iters, grouped, &min_ms);
            report(gpu_name, o, E, dists[di].name, mode == MOE_EXPERT_GEMM_GROUPED ? "grouped" : "per-expert", ms, min_ms,
                   dense_tflops);
        }
    }
    free(offset);
    moe_gpu_free(gpu, w.w13), moe_gpu_free(gpu, w.w2), moe_gpu_free(gpu, xp);
    moe_gpu_free(gpu, h13), moe_gpu_free(gpu, act), moe_gpu_free(gpu, y);
}

int main(int argc, char **argv) {
    options o = {0, 4096, 14336, 16384, 3, 10, 1.0}; /* experts, d_model, d_ff, rows, warmup, iters, zipf */
    bench_parse_flags(&kCli, argc, argv, &o);
    cudaDeviceProp prop;
    moe_gpu *gpu = bench_gpu_open("bench_grouped_gemm", &prop);
    printf("expert FFN forward, bf16 in/out, fp32 accumulation: d_model %d, d_ff %d, %d rows, %d timed iters\n",
           o.d_model, o.d_ff, o.rows, o.iters);
    if (o.experts) run_experts(gpu, prop.name, &o, o.experts);
    else {
        run_experts(gpu, prop.name, &o, 8);
        run_experts(gpu, prop.name, &o, 64);
    }
    moe_gpu_destroy(gpu);
    return 0;
}
