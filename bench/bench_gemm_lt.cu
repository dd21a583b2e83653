/* bench_gemm_lt.cu — the pinned batch-invariant cuBLASLt GEMM (kernels/gemm_lt.h) against unconstrained cuBLAS at the
 * dense linears' training shapes (issue 50, item 2's target: each product >= 90% of unconstrained cuBLAS). Per weight
 * W [out, in] of the ~1.2B benchmark model (d_model 1024, 16 heads / 8 kv of 64, vocab 32000) and of Mixtral 8x7B
 * (d_model 4096, 32 heads / 8 kv of 128, d_ff 14336, vocab 32000; its w1/w3/w2 are the experts' shapes), at --tokens
 * rows, the three products of the linear: forward y = x W^T (M = tokens, N = out, K = in), backward input dx = dy W
 * (M = tokens, N = in, K = out) and weight gradient dW = dy^T x (M = out, N = in, K = tokens), each timed as
 *   pinned      moe_gemm_lt_run: one cublasLtMatmul with the shape's pinned algorithm, bf16 in, fp32 out, beta 0
 *   from fp32   moe_gemm_lt_run_f32 on fp32 buffers: the casts to bf16 that kernels/linear.cu's MOE_LINEAR_LT pays
 *               today, then the pinned call
 *   lt          cublasLtMatmul with the heuristic's first choice for this very M and --workspace-mib of workspace
 *   gemmex      cublasGemmEx (CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT, default math: cuBLAS's own choice, what
 *               torch.matmul calls), the same bf16 inputs and fp32 output
 * Prints per product the median ms and TFLOP/s (2 M N K / time) of each, pinned / the faster unconstrained one, and
 * the pinned configuration; one "json: {...}" line per product. Exit 77 without a GPU.
 *
 *   ninja -C build bench/bench_gemm_lt && build/bench/bench_gemm_lt [--model all --tokens 8192 --warmup 3 --iters 10
 *       --workspace-mib 32 --from-fp32 1] */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/gpu_cuda.h"

extern "C" {
#define _Noreturn [[noreturn]] /* bench_util.h is C11; the same meaning in C++ */
#include "bench/bench_util.h"
#undef _Noreturn
#include "kernels/gemm_lt.h"
}

#include "bench/bench_gpu.cuh"

typedef struct {
    int model, tokens, warmup, iters, workspace_mib, from_fp32;
} options;

static const char *const kModels[] = {"all", "1.2b", "mixtral", NULL};

static const bench_flag kFlags[] = {
    BENCH_CHOICE("--model", options, model, kModels, "the weights of the 1.2B benchmark model, Mixtral 8x7B, or all"),
    BENCH_INT("--tokens", options, tokens, 1, 1 << 20, "token rows (M of the row-wise products, K of the weight's)"),
    BENCH_INT("--warmup", options, warmup, 0, 10000, "untimed runs per measurement"),
    BENCH_INT("--iters", options, iters, 1, 10000, "timed runs per measurement"),
    BENCH_INT("--workspace-mib", options, workspace_mib, 0, 4096, "the unconstrained cublasLtMatmul's workspace"),
    BENCH_INT("--from-fp32", options, from_fp32, 0, 1, "1: also time the call from fp32 buffers (the casts)"),
};

/* positional: designated initializers are C++20 */
static const bench_cli kCli = {"bench_gemm_lt", "bench_gemm_lt [flags]",
                               "the pinned batch-invariant cuBLASLt GEMM against cublasLt's heuristic and cublasGemmEx\n"
                               "at the dense linears' training shapes; exit 77 without a GPU",
                               kFlags, sizeof kFlags / sizeof kFlags[0], NULL, NULL};

typedef struct {
    int model; /* 1: 1.2B, 2: Mixtral (kModels) */
    const char *name;
    int out, in;
} weight_shape;

static const weight_shape kWeights[] = {
    {1, "q/o_proj", 1024, 1024}, {1, "k/v_proj", 512, 1024},     {1, "lm_head", 32000, 1024},
    {2, "q/o_proj", 4096, 4096}, {2, "k/v_proj", 1024, 4096},    {2, "w1/w3", 14336, 4096},
    {2, "w2", 4096, 14336},      {2, "lm_head", 32000, 4096},
};
static const char *const kModelNames[] = {"", "1.2B", "Mixtral 8x7B"};
static const char *const kProducts[] = {"forward", "backward input", "weight gradient"};

/* Deterministic pseudo-random values in [-scale, scale) (as bf16, or fp32 holding bf16 values): zeros would time
 * another kernel path. */
__global__ void fill(uint16_t *bf16, float *f32, size_t n, uint32_t seed, float scale) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
        const __nv_bfloat16 v = __float2bfloat16_rn(((h >> 8) * (1.0f / 16777216.0f) * 2.0f - 1.0f) * scale);
        if (bf16) bf16[i] = __bfloat16_as_ushort(v);
        if (f32) f32[i] = __bfloat162float(v);
    }
}

static void *alloc(moe_gpu *gpu, size_t nbytes) {
    void *p = NULL;
    bench_check(moe_gpu_alloc(gpu, nbytes, &p), "cudaMalloc");
    return p;
}

static void filled(moe_gpu *gpu, uint16_t *bf16, float *f32, size_t n, uint32_t seed) {
    fill<<<4096, 256, 0, gpu->stream>>>(bf16, f32, n, seed, 1.0f);
    BENCH_CUDA(cudaGetLastError());
}

/* cuBLASLt's descriptors of a shape at M, heap-made (the unconstrained call's) */
struct lt_call {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t first, second, d;
};

static lt_call make_lt_call(const moe_gemm_lt_shape &s, int M) {
    const moe__gemm_lt_colmajor c = moe__gemm_lt_colmajor_of(&s, M);
    lt_call l;
    BENCH_CUBLAS(cublasLtMatmulDescCreate(&l.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const int32_t op_first = c.op_first ? CUBLAS_OP_T : CUBLAS_OP_N, op_second = c.op_second ? CUBLAS_OP_T : CUBLAS_OP_N;
    BENCH_CUBLAS(cublasLtMatmulDescSetAttribute(l.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof op_first));
    BENCH_CUBLAS(cublasLtMatmulDescSetAttribute(l.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof op_second));
    BENCH_CUBLAS(cublasLtMatrixLayoutCreate(&l.first, CUDA_R_16BF, c.first_rows, c.first_cols, c.first_ld));
    BENCH_CUBLAS(cublasLtMatrixLayoutCreate(&l.second, CUDA_R_16BF, c.second_rows, c.second_cols, c.second_ld));
    BENCH_CUBLAS(cublasLtMatrixLayoutCreate(&l.d, CUDA_R_32F, c.d_rows, c.d_cols, c.d_ld));
    return l;
}

static void free_lt_call(lt_call &l) {
    cublasLtMatmulDescDestroy(l.op);
    cublasLtMatrixLayoutDestroy(l.first), cublasLtMatrixLayoutDestroy(l.second), cublasLtMatrixLayoutDestroy(l.d);
}

static double tflops(double flops, double ms) { return ms > 0 ? flops / (ms * 1e9) : 0; }

static void run_product(moe_gpu *gpu, const char *gpu_name, const options *o, const weight_shape &w, int product,
                        void *workspace) {
    const int T = o->tokens;
    /* (trans_a, trans_b, N, K) and M as kernels/linear_gemms.c's moe__linear_lt_call makes them */
    moe_gemm_lt_shape s;
    int M;
    if (product == 0) s = {0, 1, w.out, w.in, MOE_GEMM_LT_BF16, 0}, M = T;
    else if (product == 1) s = {0, 0, w.in, w.out, MOE_GEMM_LT_BF16, 0}, M = T;
    else s = {1, 0, w.in, T, MOE_GEMM_LT_BF16, 0}, M = w.out;
    const moe__gemm_lt_colmajor c = moe__gemm_lt_colmajor_of(&s, M);
    const double flops = 2.0 * M * s.n * s.k;
    const int a_rows = s.trans_a ? s.k : M, a_width = s.trans_a ? M : s.k;
    const int b_rows = s.trans_b ? s.n : s.k, b_width = s.trans_b ? s.k : s.n;
    const int lda = moe_gemm_lt_ld_a(&s, M), ldb = moe_gemm_lt_ld_b(&s);
    /* bf16 operands with the padded rows (the pad holds values too: nothing reads it) */
    uint16_t *A = (uint16_t *)alloc(gpu, (size_t)a_rows * lda * 2), *B = (uint16_t *)alloc(gpu, (size_t)b_rows * ldb * 2);
    float *D = (float *)alloc(gpu, (size_t)M * s.n * sizeof(float));
    filled(gpu, A, NULL, (size_t)a_rows * lda, 1);
    filled(gpu, B, NULL, (size_t)b_rows * ldb, 2);
    char label[160];
    snprintf(label, sizeof label, "%s %s [%d, %d] %s", kModelNames[w.model], w.name, w.out, w.in, kProducts[product]);
    printf("%s: M %d N %d K %d (%.1f GFLOP)\n", label, M, s.n, s.k, flops / 1e9);

    /* pinned, through a set as kernels/linear.cu holds them */
    moe_gemm_lt_set *set = NULL;
    bench_check(moe_gemm_lt_set_create(&set), "moe_gemm_lt_set_create");
    const moe_gemm_lt *g = NULL;
    bench_check(moe_gemm_lt_set_get(gpu, set, &s, &g), "moe_gemm_lt_set_get");
    static char text[4096];
    double min_ms = 0, pinned_ms = 0, f32_ms = 0;
    if (g) {
        moe_gemm_lt_describe(g, text, sizeof text);
        pinned_ms = bench_time_ms(gpu, o->warmup, o->iters, [&]() {
            bench_check(moe_gemm_lt_run(gpu, g, M, A, B, 0, D), "moe_gemm_lt_run");
        }, &min_ms);
        if (o->from_fp32) {
            float *A32 = (float *)alloc(gpu, (size_t)a_rows * a_width * sizeof(float));
            float *B32 = (float *)alloc(gpu, (size_t)b_rows * b_width * sizeof(float));
            filled(gpu, NULL, A32, (size_t)a_rows * a_width, 3);
            filled(gpu, NULL, B32, (size_t)b_rows * b_width, 4);
            f32_ms = bench_time_ms(gpu, o->warmup, o->iters, [&]() {
                bench_check(moe_gemm_lt_run_f32(gpu, set, g, M, A32, B32, 0, D), "moe_gemm_lt_run_f32");
            }, &min_ms);
            moe_gpu_free(gpu, A32), moe_gpu_free(gpu, B32);
        }
    } else {
        moe_gemm_lt_set_describe(set, text, sizeof text);
        text[strcspn(text, "\n")] = '\0';
    }

    /* unconstrained cuBLASLt: the heuristic's first choice for this M, with workspace */
    const size_t ws_nbytes = (size_t)o->workspace_mib << 20;
    lt_call l = make_lt_call(s, M);
    cublasLtMatmulPreference_t pref;
    BENCH_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws64 = ws_nbytes;
    BENCH_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws64, sizeof ws64));
    cublasLtMatmulHeuristicResult_t best;
    memset(&best, 0, sizeof best);
    int found = 0; /* none (or a refusal): the gemmex column alone */
    if (cublasLtMatmulAlgoGetHeuristic(gpu->blaslt, l.op, l.first, l.second, l.d, l.d, pref, 1, &best, &found) !=
        CUBLAS_STATUS_SUCCESS)
        found = 0;
    const float one = 1, zero = 0;
    double lt_ms = 0;
    if (found)
        lt_ms = bench_time_ms(gpu, o->warmup, o->iters, [&]() {
            BENCH_CUBLAS(cublasLtMatmul(gpu->blaslt, l.op, &one, B, l.first, A, l.second, &zero, D, l.d, D, l.d,
                                        &best.algo, workspace, ws_nbytes, gpu->stream));
        }, &min_ms);
    cublasLtMatmulPreferenceDestroy(pref);
    free_lt_call(l);

    /* cublasGemmEx: cuBLAS's own choice under the default math mode */
    const double gemmex_ms = bench_time_ms(gpu, o->warmup, o->iters, [&]() {
        BENCH_CUBLAS(cublasGemmEx(gpu->blas, c.op_first ? CUBLAS_OP_T : CUBLAS_OP_N,
                                  c.op_second ? CUBLAS_OP_T : CUBLAS_OP_N, c.m, c.n, c.k, &one, B, CUDA_R_16BF,
                                  c.first_ld, A, CUDA_R_16BF, c.second_ld, &zero, D, CUDA_R_32F, c.d_ld,
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }, &min_ms);

    const double best_ms = lt_ms > 0 && lt_ms < gemmex_ms ? lt_ms : gemmex_ms;
    const double ratio = pinned_ms > 0 ? best_ms / pinned_ms : 0, ratio_f32 = f32_ms > 0 ? best_ms / f32_ms : 0;
    printf("  pinned %8.3f ms %6.1f TFLOP/s | from fp32 %8.3f ms %6.1f | lt %8.3f ms %6.1f | gemmex %8.3f ms %6.1f | "
           "pinned at %.0f%% of the faster unconstrained (from fp32 %.0f%%)\n",
           pinned_ms, tflops(flops, pinned_ms), f32_ms, tflops(flops, f32_ms), lt_ms, tflops(flops, lt_ms), gemmex_ms,
           tflops(flops, gemmex_ms), 100 * ratio, 100 * ratio_f32);
    printf("  pinned: %s\n", text);
    printf("json: {\"bench\":\"gemm_lt\",\"gpu\":");
    bench_json_string(gpu_name);
    printf(",\"model\":\"%s\",\"weight\":\"%s\",\"out\":%d,\"in\":%d,\"product\":\"%s\",\"m\":%d,\"n\":%d,\"k\":%d,"
           "\"pinned_ms\":%.4f,\"from_fp32_ms\":%.4f,\"lt_ms\":%.4f,\"gemmex_ms\":%.4f,\"pinned_tflops\":%.2f,"
           "\"pct_unconstrained\":%.2f,\"pct_unconstrained_from_fp32\":%.2f,\"pinned_algo\":",
           kModelNames[w.model], w.name, w.out, w.in, kProducts[product], M, s.n, s.k, pinned_ms, f32_ms, lt_ms,
           gemmex_ms, tflops(flops, pinned_ms), 100 * ratio, 100 * ratio_f32);
    bench_json_string(text);
    printf("}\n");
    fflush(stdout);
    moe_gemm_lt_set_destroy(gpu, set);
    moe_gpu_free(gpu, A), moe_gpu_free(gpu, B), moe_gpu_free(gpu, D);
}

int main(int argc, char **argv) {
    options o = {0, 8192, 3, 10, 32, 1}; /* model, tokens, warmup, iters, workspace_mib, from_fp32 */
    bench_parse_flags(&kCli, argc, argv, &o);
    cudaDeviceProp prop;
    moe_gpu *gpu = bench_gpu_open("bench_gemm_lt", &prop);
    /* cuBLAS's unconstrained choice: the default math mode (the context's is pedantic, for its fp32 SGEMMs) */
    BENCH_CUBLAS(cublasSetMathMode(gpu->blas, CUBLAS_DEFAULT_MATH));
    void *workspace = o.workspace_mib ? alloc(gpu, (size_t)o.workspace_mib << 20) : NULL;
    printf("dense linear GEMMs, bf16 in, fp32 accumulation and out, %d tokens, %d timed iters after %d\n", o.tokens,
           o.iters, o.warmup);
    for (const weight_shape &w : kWeights)
        if (o.model == 0 || o.model == w.model)
            for (int product = 0; product < 3; product++) run_product(gpu, prop.name, &o, w, product, workspace);
    moe_gpu_free(gpu, workspace);
    moe_gpu_destroy(gpu);
    return 0;
}
