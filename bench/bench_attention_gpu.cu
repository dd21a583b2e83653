/* bench_attention_gpu.cu — the fused causal GQA attention on the GPU (kernels/attention_fused.cu, and under bf16
 * the tensor-core flash kernels of kernels/attention_flash.cu where they apply), forward and backward, as training
 * calls it: fp32 [tokens, heads, hd] buffers in, fp32 out (bf16 rounding inside the kernels under --bf16 1).
 *
 * FLOPs counted as FlashAttention's benchmarks count a causal attention: forward 4 N H S^2 hd / 2 (two products
 * over the S^2 / 2 pairs a causal mask keeps), backward 2.5x that (five products). Prints the GPU, the kernels that
 * ran ("flash" or "plain"), median and min ms of the forward, the backward and both, TFLOP/s of each, and one
 * "json: {...}" line (bench/bench_attention_torch_gpu.py reads it to put the peer beside it). Exit 77 without a GPU.
 *
 *   ninja -C build bench/bench_attention_gpu && build/bench/bench_attention_gpu [--seqs 8 --heads 16
 *       --kv-heads 8 --seq-len 1024 --head-dim 64 --bf16 1 --warmup 3 --iters 10] */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/gpu_cuda.h"

extern "C" {
#define _Noreturn [[noreturn]] /* bench_util.h is C11; the same meaning in C++ */
#include "bench/bench_util.h"
#undef _Noreturn
#include "core/rng.h"
#include "kernels/attention.h"
}

#include "bench/bench_gpu.cuh"

typedef struct {
    int seqs, heads, kv_heads, seq_len, head_dim, bf16, warmup, iters;
} options;

static const bench_flag kFlags[] = {
    BENCH_INT("--seqs", options, seqs, 1, 65535, "sequences N"),
    BENCH_INT("--heads", options, heads, 1, 1024, "query heads H"),
    BENCH_INT("--kv-heads", options, kv_heads, 1, 1024, "kv heads (divides --heads)"),
    BENCH_INT("--seq-len", options, seq_len, 1, 1 << 17, "sequence length S"),
    BENCH_INT("--head-dim", options, head_dim, 1, 256, "head width hd"),
    BENCH_INT("--bf16", options, bf16, 0, 1, "bf16 precision (the flash kernels where they apply); 0: fp32"),
    BENCH_INT("--warmup", options, warmup, 0, 10000, "untimed runs per pass"),
    BENCH_INT("--iters", options, iters, 1, 10000, "timed runs per pass"),
};

static void check(const void *opt) {
    const options *o = (const options *)opt;
    if (o->heads % o->kv_heads) bench_usage_error("--kv-heads must divide --heads", NULL);
    if ((double)o->seqs * o->seq_len * o->heads * o->head_dim * 4 * 8 > 40e9)
        bench_usage_error("shape too large (its buffers over 40 GB)", NULL);
}

/* positional: designated initializers are C++20 */
static const bench_cli kCli = {"bench_attention_gpu", "bench_attention_gpu [flags]",
                               "the fused causal attention's forward and backward on the GPU (kernels/attention.h),\n"
                               "as training calls it; exit 77 without a GPU",
                               kFlags, sizeof kFlags / sizeof kFlags[0], NULL, check};

static float *random_buffer(moe_gpu *gpu, moe_rng *rng, size_t n) {
    float *host = (float *)malloc(n * sizeof(float));
    void *dev = NULL;
    if (!host) bench_fail("out of memory");
    moe_rng_fill_uniform(rng, host, n, 1);
    bench_check(moe_gpu_alloc(gpu, n * sizeof(float), &dev), "cudaMalloc");
    bench_check(moe_gpu_upload(gpu, dev, host, n * sizeof(float)), "upload");
    free(host);
    return (float *)dev;
}

int main(int argc, char **argv) {
    options o = {8, 16, 8, 1024, 64, 1, 3, 10};
    bench_parse_flags(&kCli, argc, argv, &o);
    cudaDeviceProp prop;
    moe_gpu *gpu = bench_gpu_open("bench_attention_gpu", &prop);
    const int N = o.seqs, S = o.seq_len, H = o.heads, KV = o.kv_heads, hd = o.head_dim;
    const size_t nq = (size_t)N * S * H * hd, nkv = (size_t)N * S * KV * hd, nlse = (size_t)N * H * S;
    moe_rng rng = moe_rng_seeded(11);
    float *q = random_buffer(gpu, &rng, nq), *k = random_buffer(gpu, &rng, nkv), *v = random_buffer(gpu, &rng, nkv);
    float *dout = random_buffer(gpu, &rng, nq), *out = random_buffer(gpu, &rng, nq), *lse = random_buffer(gpu, &rng, nlse);
    float *dq = random_buffer(gpu, &rng, nq), *dk = random_buffer(gpu, &rng, nkv), *dv = random_buffer(gpu, &rng, nkv);
    const char *kernels = o.bf16 && moe_attention_flash_applies(hd) ? "flash" : "plain";
    printf("attention: %d sequences x %d tokens, %d heads / %d kv, head_dim %d, %s, %s kernels\n", N, S, H, KV, hd,
           o.bf16 ? "bf16" : "fp32", kernels);

    auto forward = [&]() {
        bench_check(moe_attention_fused_forward_cuda(gpu, q, k, v, N, S, H, KV, hd, o.bf16, lse, out), "forward");
    };
    auto backward = [&]() {
        bench_check(moe_attention_fused_backward_cuda(gpu, q, k, v, out, lse, dout, N, S, H, KV, hd, o.bf16, dq, dk, dv),
                    "backward");
    };
    const double fwd_flops = 2.0 * N * H * (double)S * S * hd, bwd_flops = 2.5 * fwd_flops;
    double min_ms[3], ms[3];
    ms[0] = bench_time_ms(gpu, o.warmup, o.iters, forward, &min_ms[0]);
    ms[1] = bench_time_ms(gpu, o.warmup, o.iters, backward, &min_ms[1]);
    ms[2] = bench_time_ms(gpu, o.warmup, o.iters, [&]() { forward(), backward(); }, &min_ms[2]);
    const char *names[3] = {"forward", "backward", "forward+backward"};
    const double flops[3] = {fwd_flops, bwd_flops, fwd_flops + bwd_flops};
    for (int p = 0; p < 3; p++)
        printf("%-17s %9.3f ms (min %9.3f)  %7.1f TFLOP/s\n", names[p], ms[p], min_ms[p], flops[p] / (ms[p] * 1e9));
    printf("json: {\"bench\":\"attention\",\"gpu\":");
    bench_json_string(prop.name);
    printf(",\"kernels\":\"%s\",", kernels);
    bench_json_flags(&o);
    printf(",\"forward_ms\":%.4f,\"backward_ms\":%.4f,\"both_ms\":%.4f,\"both_tflops\":%.1f}\n", ms[0], ms[1], ms[2],
           flops[2] / (ms[2] * 1e9));

    void *dev[] = {q, k, v, dout, out, lse, dq, dk, dv};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) moe_gpu_free(gpu, dev[i]);
    moe_gpu_destroy(gpu);
    return 0;
}
