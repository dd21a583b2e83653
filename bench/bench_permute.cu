/* bench_permute.cu — bandwidth of the row movers of kernels/permute.cu against cudaMemcpyAsync
 * device-to-device moving the same number of bytes (read + written).
 *
 * T tokens of width d, k distinct experts each out of E (uniformly random, nothing dropped), rows in
 * expert-major then token order. Bytes counted once each (re-reads served by cache are not counted):
 *   permute           reads T k d fp32 (gathered), writes T k d bf16;
 *   combine           reads T k d bf16, writes T d fp32 (gates and slots are negligible);
 *   combine backward  reads T d fp32 (dout) and T k d bf16 (y), writes T k d bf16 (dy).
 * A memcpy of N bytes reads N and writes N, so the reference for an op moving B bytes copies B / 2.
 * Prints the GPU, then per op: median and min ms over --iters timed runs after --warmup ones (cudaEvent on
 * the context's stream), GB/s = bytes / time, the memcpy's GB/s and the op's percentage of it; one
 * "json: {...}" line per op. Exit 77 without a GPU.
 *
 *   ninja -C build bench/bench_permute && build/bench/bench_permute [--tokens 16384 --d-model 4096
 *       --top-k 2 --experts 8 --warmup 5 --iters 20] */
#include <stdlib.h>
#include <string.h>

#include "core/gpu_cuda.h"

extern "C" {
#define _Noreturn [[noreturn]] /* bench_util.h is C11; the same meaning in C++ */
#include "bench/bench_util.h"
#undef _Noreturn
#include "kernels/permute.h"
#include "core/rng.h"
}

#include "bench/bench_gpu.cuh"

typedef struct {
    int tokens, d_model, top_k, experts, warmup, iters;
} options;

static const bench_flag kFlags[] = {
    BENCH_INT("--tokens", options, tokens, 1, 1 << 20, "tokens T"),
    BENCH_INT("--d-model", options, d_model, 1, 1 << 16, "row width d"),
    BENCH_INT("--top-k", options, top_k, 1, 64, "distinct experts per token k"),
    BENCH_INT("--experts", options, experts, 1, 4096, "experts E"),
    BENCH_INT("--warmup", options, warmup, 0, 10000, "untimed runs per op"),
    BENCH_INT("--iters", options, iters, 1, 10000, "timed runs per op"),
};

static void check(const void *opt) {
    const options *o = (const options *)opt;
    if (o->top_k > o->experts) bench_usage_error("--top-k must not exceed --experts", NULL);
    if ((double)o->tokens * o->top_k * o->d_model * 4 > 32e9) bench_usage_error("shape too large (over 32 GB)", NULL);
}

/* positional: designated initializers are C++20 */
static const bench_cli kCli = {"bench_permute", "bench_permute [flags]",
                               "bandwidth of permute / combine / combine backward (kernels/permute.cu) against a\n"
                               "device-to-device cudaMemcpyAsync of the same bytes; exit 77 without a GPU",
                               kFlags, sizeof kFlags / sizeof kFlags[0], NULL, check};

static void *dev_alloc(moe_gpu *gpu, size_t nbytes) {
    void *p = NULL;
    bench_check(moe_gpu_alloc(gpu, nbytes, &p), "cudaMalloc");
    return p;
}

static void *dev_upload(moe_gpu *gpu, const void *host, size_t nbytes) {
    void *p = dev_alloc(gpu, nbytes);
    bench_check(moe_gpu_upload(gpu, p, host, nbytes), "upload");
    return p;
}

static void report(const char *gpu_name, const options *o, const char *op, double bytes, double ms, double min_ms,
                   double copy_ms) {
    const double gbs = bytes / (ms * 1e6), copy_gbs = bytes / (copy_ms * 1e6);
    printf("%-17s %8.3f ms (min %8.3f)  %7.1f GB/s   memcpy %7.1f GB/s   %5.1f%%\n", op, ms, min_ms, gbs, copy_gbs,
           100 * gbs / copy_gbs);
    printf("json: {\"bench\":\"permute\",\"gpu\":");
    bench_json_string(gpu_name);
    printf(",\"op\":\"%s\",\"tokens\":%d,\"d_model\":%d,\"top_k\":%d,\"bytes\":%.0f,\"ms\":%.4f,\"min_ms\":%.4f,"
           "\"gbs\":%.1f,\"memcpy_gbs\":%.1f,\"pct_memcpy\":%.1f}\n",
           op, o->tokens, o->d_model, o->top_k, bytes, ms, min_ms, gbs, copy_gbs, 100 * gbs / copy_gbs);
}

int main(int argc, char **argv) {
    options o = {16384, 4096, 2, 8, 5, 20}; /* tokens, d_model, top_k, experts, warmup, iters */
    bench_parse_flags(&kCli, argc, argv, &o);
    cudaDeviceProp prop;
    moe_gpu *gpu = bench_gpu_open("bench_permute", &prop);
    const int T = o.tokens, k = o.top_k, E = o.experts, d = o.d_model, rows = T * k;
    printf("permute / combine: %d tokens, d_model %d, top-k %d of %d experts, %d timed iters\n", T, d, k, E, o.iters);

    /* routing: k distinct experts per token, rows in expert-major then token order */
    moe_rng rng = moe_rng_seeded(7);
    int *expert = (int *)malloc((size_t)rows * sizeof(int)), *offset = (int *)calloc(E + 1, sizeof(int));
    int *slot = (int *)malloc((size_t)rows * sizeof(int)), *perm = (int *)malloc((size_t)rows * sizeof(int));
    float *gate = (float *)malloc((size_t)rows * sizeof(float));
    if (!expert || !offset || !slot || !perm || !gate) bench_fail("out of memory");
    for (int t = 0; t < T; t++)
        for (int j = 0; j < k; j++) {
            int e, dup;
            do {
                e = (int)(moe_rng_next(&rng) % (uint64_t)E), dup = 0;
                for (int i = 0; i < j; i++) dup |= expert[t * k + i] == e;
            } while (dup);
            expert[t * k + j] = e, offset[e + 1]++;
            gate[t * k + j] = (float)(moe_rng_uniform(&rng) + 1) / 2;
        }
    for (int e = 0; e < E; e++) offset[e + 1] += offset[e];
    for (int t = 0; t < T; t++)
        for (int j = 0; j < k; j++) {
            int row = offset[expert[t * k + j]]++;
            slot[t * k + j] = row, perm[row] = t;
        }

    const size_t td = (size_t)T * d, rd = (size_t)rows * d;
    float *x = (float *)dev_alloc(gpu, td * 4), *out = (float *)dev_alloc(gpu, td * 4);
    float *dout = (float *)dev_alloc(gpu, td * 4), *dgate = (float *)dev_alloc(gpu, (size_t)rows * 4);
    moe_bf16 *xp = (moe_bf16 *)dev_alloc(gpu, rd * 2), *dy = (moe_bf16 *)dev_alloc(gpu, rd * 2);
    int *d_slot = (int *)dev_upload(gpu, slot, (size_t)rows * 4), *d_perm = (int *)dev_upload(gpu, perm, (size_t)rows * 4);
    float *d_gate = (float *)dev_upload(gpu, gate, (size_t)rows * 4);
    bench_check(moe_gpu_zero(gpu, x, td * 4), "memset"); /* values do not change the traffic */
    bench_check(moe_gpu_zero(gpu, dout, td * 4), "memset");
    const double permute_bytes = (double)rd * (4 + 2), combine_bytes = (double)rd * 2 + (double)td * 4;
    const double backward_bytes = (double)td * 4 + (double)rd * (2 + 2);
    /* one scratch pair big enough for the largest copy */
    const size_t copy_max = (size_t)(backward_bytes > permute_bytes ? backward_bytes : permute_bytes) / 2 + 16;
    void *src = dev_alloc(gpu, copy_max), *dst = dev_alloc(gpu, copy_max);

    auto copy_ms = [&](double bytes) {
        double min_ms;
        size_t n = (size_t)(bytes / 2);
        return bench_time_ms(gpu, o.warmup, o.iters,
                             [&]() { BENCH_CUDA(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, gpu->stream)); },
                             &min_ms);
    };
    double min_ms, ms;
    ms = bench_time_ms(gpu, o.warmup, o.iters,
                       [&]() { bench_check(moe_permute_rows_cuda(gpu, x, d_perm, rows, d, xp), "moe_permute_rows_cuda"); },
                       &min_ms);
    report(prop.name, &o, "permute", permute_bytes, ms, min_ms, copy_ms(permute_bytes));
    ms = bench_time_ms(
        gpu, o.warmup, o.iters,
        [&]() { bench_check(moe_combine_rows_cuda(gpu, xp, d_slot, d_gate, T, k, d, out), "moe_combine_rows_cuda"); }, &min_ms);
    report(prop.name, &o, "combine", combine_bytes, ms, min_ms, copy_ms(combine_bytes));
    ms = bench_time_ms(gpu, o.warmup, o.iters,
                       [&]() {
                           bench_check(moe_combine_rows_backward_cuda(gpu, dout, xp, d_slot, d_gate, T, k, d, dy, dgate),
                                       "moe_combine_rows_backward_cuda");
                       },
                       &min_ms);
    report(prop.name, &o, "combine backward", backward_bytes, ms, min_ms, copy_ms(backward_bytes));

    void *dev[] = {x, out, dout, dgate, xp, dy, d_slot, d_perm, d_gate, src, dst};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) moe_gpu_free(gpu, dev[i]);
    free(expert), free(offset), free(slot), free(perm), free(gate);
    moe_gpu_destroy(gpu);
    return 0;
}
