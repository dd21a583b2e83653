/* bench_moe_layer.c — the cpu variant of the MoE layer benchmark (bench_moe_layer_driver.h): wall time of the
 * CPU layer (moe_layer_forward / moe_layer_backward on moe_runtime_create_cpu, a world of one), against the
 * time OpenBLAS alone needs for the same GEMMs.
 *
 * The driver measures, at T tokens, width d, hidden d_ff, E experts, top-k (softmax, renormalised, dropless
 * unless --capacity-factor > 0, default aux/z coefficients): forward, backward and forward+backward ms
 * (median and min over --iters timed iterations after --warmup untimed ones), the GEMM FLOPs and the achieved
 * GFLOP/s. This table adds the "floor": it replays exactly the layer's cblas_sgemm calls (same shapes,
 * transposes and betas, one per expert and projection, plus the router's) on scratch buffers, takes the
 * median of several replays as OpenBLAS's sgemm rate here, and prints floor_ms = GEMM FLOPs / rate and
 * layer_ms / floor_ms. Last line: "json: {...}".
 *
 *   meson setup build-bench --buildtype=release && ninja -C build-bench bench/bench_moe_layer
 *   OPENBLAS_CORETYPE=SkylakeX build-bench/bench/bench_moe_layer [--tokens 4096 --d-model 512 --d-ff 1024
 *       --experts 8 --top-k 2 --capacity-factor 0 --warmup 2 --iters 7]
 */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_moe_layer_driver.h"

static float *alloc(size_t n) {
    float *p = malloc((n ? n : 1) * sizeof *p);
    if (!p) bench_fail("out of memory");
    return p;
}

/* Scratch for the sgemm-only replay: the layer's GEMM operands with its shapes. */
typedef struct {
    float *x, *logits, *xp, *h1, *h3, *act, *y, *dy, *dh1, *dh3, *dxp, *dlogits, *dx;
    moe_layer_weights w, g;
} replay_bufs;

/* The forward GEMMs of moe_layer_forward: router logits, then w1, w3, w2 per expert. */
static void replay_forward(const replay_bufs *b, const int *offset, int T, int d, int f, int E) {
    const size_t wc = (size_t)f * d;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, E, d, 1, b->x, d, b->w.router_w, d, 0, b->logits, E);
    for (int e = 0; e < E; e++) {
        int n = offset[e + 1] - offset[e];
        if (n == 0) continue;
        size_t r0 = offset[e];
        const float *x = b->xp + r0 * d;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, f, d, 1, x, d, b->w.w1 + e * wc, d, 0,
                    b->h1 + r0 * f, f);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, f, d, 1, x, d, b->w.w3 + e * wc, d, 0,
                    b->h3 + r0 * f, f);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, d, f, 1, b->act + r0 * f, f, b->w.w2 + e * wc, f,
                    0, b->y + r0 * d, d);
    }
}

/* The backward GEMMs of moe_layer_backward: six per expert, then the router's weight and input grads. */
static void replay_backward(const replay_bufs *b, const int *offset, int T, int d, int f, int E) {
    const size_t wc = (size_t)f * d;
    for (int e = 0; e < E; e++) {
        int n = offset[e + 1] - offset[e];
        if (n == 0) continue;
        size_t r0 = offset[e];
        const float *x = b->xp + r0 * d, *dY = b->dy + r0 * d, *A = b->act + r0 * f;
        float *dH1 = b->dh1 + r0 * f, *dH3 = b->dh3 + r0 * f, *dX = b->dxp + r0 * d;
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, d, f, n, 1, dY, d, A, f, 1, b->g.w2 + e * wc, f);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, f, d, 1, dY, d, b->w.w2 + e * wc, f, 0, dH1, f);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, f, d, n, 1, dH1, f, x, d, 1, b->g.w1 + e * wc, d);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, f, d, n, 1, dH3, f, x, d, 1, b->g.w3 + e * wc, d);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, d, f, 1, dH1, f, b->w.w1 + e * wc, d, 0, dX, d);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, d, f, 1, dH3, f, b->w.w3 + e * wc, d, 1, dX, d);
    }
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, E, d, T, 1, b->dlogits, E, b->x, d, 1, b->g.router_w, d);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, d, E, 1, b->dlogits, E, b->w.router_w, d, 1, b->dx, d);
}

static void open_cpu(bench_layer_run *r) {
    bench_check(moe_runtime_create_cpu(&r->rt), "moe_runtime_create_cpu");
    bench_check(moe_parallel_create_self(&r->par), "moe_parallel_create_self");
}

static void describe_openblas(const bench_layer_run *r) {
    (void)r;
    const char *coretype = getenv("OPENBLAS_CORETYPE");
    printf("openblas: config=%s corename=%s threads=%d OPENBLAS_CORETYPE=%s\n", openblas_get_config(),
           openblas_get_corename(), openblas_get_num_threads(), coretype ? coretype : "(unset)");
}

/* The floor, measured by report_floor and put in the JSON line by json_floor. */
static struct {
    int replays;
    double sgemm_forward_ms, sgemm_backward_ms, rate_gflops, floor_ms[3], ratio[3];
} floor_result;

/* The same sgemm calls alone, median of several replays (after one untimed one). On the CPU runtime the
 * run's buffers are host memory, so the replay reads the layer's own weights and input. */
static void report_floor(bench_layer_run *r) {
    const int T = r->num_tokens, d = r->o->d_model, f = r->o->d_ff, E = r->o->experts, N = r->o->iters;
    const size_t P = moe_layer_num_params(&r->cfg);
    int *offset = calloc(E + 1, sizeof *offset);
    if (!offset) bench_fail("out of memory");
    for (int e = 0; e < E; e++) offset[e + 1] = offset[e] + r->stats.num_tokens_per_expert[e];
    const long rows = offset[E];
    replay_bufs rb;
    size_t A = rows ? rows : 1;
    rb.x = r->x, rb.dx = r->dx, rb.w = r->w, rb.g = r->g;
    rb.logits = alloc((size_t)T * E), rb.dlogits = alloc((size_t)T * E);
    rb.xp = alloc(A * d), rb.y = alloc(A * d), rb.dy = alloc(A * d), rb.dxp = alloc(A * d);
    rb.h1 = alloc(A * f), rb.h3 = alloc(A * f), rb.act = alloc(A * f), rb.dh1 = alloc(A * f), rb.dh3 = alloc(A * f);
    moe_rng rng = moe_rng_seeded((uint64_t)r->o->seed + 1);
    moe_rng_fill_uniform(&rng, rb.dlogits, (size_t)T * E, 1e-3);
    moe_rng_fill_uniform(&rng, rb.xp, A * d, 1.0), moe_rng_fill_uniform(&rng, rb.dy, A * d, 1.0);
    moe_rng_fill_uniform(&rng, rb.act, A * f, 1.0), moe_rng_fill_uniform(&rng, rb.dh3, A * f, 1.0);
    const int R = N > 5 ? N : 5;
    double *rf = malloc(R * sizeof *rf), *rbk = malloc(R * sizeof *rbk);
    if (!rf || !rbk) bench_fail("out of memory");
    for (int it = -1; it < R; it++) {
        memset(r->grads, 0, P * sizeof *r->grads);
        double t0 = bench_now_ms();
        replay_forward(&rb, offset, T, d, f, E);
        double t1 = bench_now_ms();
        replay_backward(&rb, offset, T, d, f, E);
        double t2 = bench_now_ms();
        if (it >= 0) rf[it] = t1 - t0, rbk[it] = t2 - t1;
    }
    const double gemm_f = bench_median(rf, R), gemm_b = bench_median(rbk, R);
    const double flop_f = r->flop_forward, flop_b = r->flop_backward, flop_t = flop_f + flop_b;
    const double rate = flop_t / (gemm_f + gemm_b) * 1e-6; /* GFLOP/s */
    const double floor_ms[3] = {flop_f / rate * 1e-6, flop_b / rate * 1e-6, flop_t / rate * 1e-6};
    const double *layer_ms = r->median_ms; /* forward, backward, fwd+bwd: the first three series */
    floor_result.replays = R, floor_result.sgemm_forward_ms = gemm_f, floor_result.sgemm_backward_ms = gemm_b;
    floor_result.rate_gflops = rate;
    for (int i = 0; i < 3; i++) floor_result.floor_ms[i] = floor_ms[i], floor_result.ratio[i] = layer_ms[i] / floor_ms[i];
    printf("sgemm alone (same calls, median of %d): forward %.2f ms (%.1f GFLOP/s), backward %.2f ms "
           "(%.1f GFLOP/s), rate %.1f GFLOP/s\n", R, gemm_f, flop_f / gemm_f * 1e-6, gemm_b, flop_b / gemm_b * 1e-6, rate);
    printf("floor_ms: forward %.2f  backward %.2f  total %.2f   layer_ms/floor_ms: forward %.3f  backward %.3f  "
           "total %.3f\n", floor_ms[0], floor_ms[1], floor_ms[2], floor_result.ratio[0], floor_result.ratio[1],
           floor_result.ratio[2]);
    free(rf), free(rbk), free(offset), free(rb.logits), free(rb.dlogits), free(rb.xp), free(rb.y), free(rb.dy);
    free(rb.dxp), free(rb.h1), free(rb.h3), free(rb.act), free(rb.dh1), free(rb.dh3);
}

static void json_openblas_and_floor(const bench_layer_run *r) {
    (void)r;
    const char *coretype = getenv("OPENBLAS_CORETYPE");
    printf(",\"openblas_threads\":%d,\"openblas_corename\":", openblas_get_num_threads());
    bench_json_string(openblas_get_corename());
    printf(",\"openblas_config\":");
    bench_json_string(openblas_get_config());
    printf(",\"openblas_coretype_env\":");
    if (coretype) bench_json_string(coretype);
    else printf("null");
    const double *fl = floor_result.floor_ms, *ra = floor_result.ratio;
    printf(",\"sgemm_ms\":{\"forward\":%.4f,\"backward\":%.4f},\"sgemm_gflops\":%.3f,"
           "\"floor_ms\":{\"forward\":%.4f,\"backward\":%.4f,\"total\":%.4f},"
           "\"ratio\":{\"forward\":%.4f,\"backward\":%.4f,\"total\":%.4f}",
           floor_result.sgemm_forward_ms, floor_result.sgemm_backward_ms, floor_result.rate_gflops, fl[0], fl[1], fl[2],
           ra[0], ra[1], ra[2]);
}

static const bench_layer_variant kCpu = {
    .program = "bench_moe_layer",
    .bench = "moe_layer_cpu",
    .synopsis = "bench_moe_layer [flags]",
    .about = "wall time of the CPU MoE layer (forward, backward) against OpenBLAS's sgemm alone on the same calls",
    .notes = "OPENBLAS_CORETYPE and OPENBLAS_NUM_THREADS pick OpenBLAS's kernels and threads (first output line)",
    .tokens_flag = "--tokens",
    .defaults = {.tokens = 4096, .d_model = 512, .d_ff = 1024, .experts = 8, .top_k = 2, .layout_invariant = 1,
                 .warmup = 2, .iters = 7, .seed = 0x5eed, .capacity_factor = 0, .ep = 1},
    .open = open_cpu,
    .describe = describe_openblas,
    .report = report_floor,
    .json = json_openblas_and_floor,
};

int main(int argc, char **argv) { return bench_moe_layer_main(&kCpu, argc, argv); }
