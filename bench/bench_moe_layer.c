/* bench_moe_layer.c — wall time of the CPU MoE layer (moe_layer_forward / moe_layer_backward), against
 * the time OpenBLAS alone needs for the same GEMMs.
 *
 * Measures, at T tokens, width d, hidden d_ff, E experts, top-k (softmax, renormalised, dropless unless
 * --capacity-factor > 0, default aux/z coefficients): forward, backward and forward+backward ms (median
 * and min over --iters timed iterations after --warmup untimed ones, CLOCK_MONOTONIC), the GEMM FLOPs
 * (expert FFN: forward 3 GEMMs of 2*rows*d*d_ff with rows = kept assignments, backward twice that; the
 * router: 2*T*d*E forward, twice that backward) and the achieved GFLOP/s. The "floor" replays exactly the
 * layer's cblas_sgemm calls (same shapes, transposes and betas, one per expert and projection, plus the
 * router's) on scratch buffers, takes the median of several replays as OpenBLAS's sgemm rate here, and
 * prints floor_ms = GEMM FLOPs / rate and layer_ms / floor_ms. Last line: "json: {...}".
 *
 *   meson setup build-bench --buildtype=release && ninja -C build-bench bench/bench_moe_layer
 *   OPENBLAS_CORETYPE=SkylakeX build-bench/bench/bench_moe_layer [--tokens 4096 --d-model 512 --d-ff 1024
 *       --experts 8 --top-k 2 --capacity-factor 0 --warmup 2 --iters 7]
 */
#include <cblas.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_util.h"
#include "moe/moe.h"
#include "core/rng.h"

typedef struct {
    int tokens, d_model, d_ff, experts, top_k, warmup, iters, layout_invariant;
    double capacity_factor;
} options;

static void usage(FILE *f) {
    fprintf(f, "usage: bench_moe_layer [--tokens N] [--d-model N] [--d-ff N] [--experts N] [--top-k N]\n"
               "                       [--capacity-factor X] [--layout-invariant 0|1] [--warmup N] [--iters N]\n"
               "  defaults: --tokens 4096 --d-model 512 --d-ff 1024 --experts 8 --top-k 2\n"
               "            --capacity-factor 0 (dropless) --layout-invariant 1 --warmup 2 --iters 7\n");
}

static options parse_args(int argc, char **argv) {
    options o = {4096, 512, 1024, 8, 2, 2, 7, 1, 0.0};
    for (int i = 1; i < argc; i++) {
        const bench_flag fl = bench_next_flag(argc, argv, &i);
        const char *name = fl.name, *val = fl.value;
        if (!strcmp(name, "--tokens")) o.tokens = bench_parse_int(name, val, 1, 1 << 22);
        else if (!strcmp(name, "--d-model")) o.d_model = bench_parse_int(name, val, 1, 1 << 16);
        else if (!strcmp(name, "--d-ff")) o.d_ff = bench_parse_int(name, val, 1, 1 << 17);
        else if (!strcmp(name, "--experts")) o.experts = bench_parse_int(name, val, 1, 4096);
        else if (!strcmp(name, "--top-k")) o.top_k = bench_parse_int(name, val, 1, 4096);
        else if (!strcmp(name, "--warmup")) o.warmup = bench_parse_int(name, val, 0, 100000);
        else if (!strcmp(name, "--iters")) o.iters = bench_parse_int(name, val, 1, 100000);
        else if (!strcmp(name, "--layout-invariant")) o.layout_invariant = bench_parse_int(name, val, 0, 1);
        else if (!strcmp(name, "--capacity-factor"))
            o.capacity_factor = bench_parse_real(
                val, 0, 1e6, "--capacity-factor must be a finite number in [0, 1e6] (0 = dropless)");
        else bench_usage_error("unknown flag", name);
    }
    if (o.top_k > o.experts) bench_usage_error("--top-k must not exceed --experts", NULL);
    /* the largest activation buffer is T*k*d_ff reals; keep it (and int row counts) well in range */
    double biggest = (double)o.tokens * o.top_k * (o.d_ff > o.d_model ? o.d_ff : o.d_model);
    if ((double)o.tokens * o.top_k > 1 << 30 || biggest * sizeof(float) > 16e9)
        bench_usage_error("shape too large (activations over 16 GB)", NULL);
    return o;
}

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

int main(int argc, char **argv) {
    bench_init("bench_moe_layer", usage);
    options o = parse_args(argc, argv);
    const int T = o.tokens, d = o.d_model, f = o.d_ff, E = o.experts, k = o.top_k, N = o.iters;
    moe_config cfg = moe_config_default(d, f, E, k);
    cfg.capacity_factor = (float)o.capacity_factor;
    cfg.layout_invariant = o.layout_invariant;
    bench_check(moe_config_validate(&cfg), "moe_config_validate");

    const char *coretype = getenv("OPENBLAS_CORETYPE");
    printf("openblas: config=%s corename=%s threads=%d OPENBLAS_CORETYPE=%s\n", openblas_get_config(),
           openblas_get_corename(), openblas_get_num_threads(), coretype ? coretype : "(unset)");
    printf("shape: T=%d d=%d d_ff=%d E=%d k=%d capacity_factor=%g (%s) layout_invariant=%d warmup=%d iters=%d\n", T, d,
           f, E, k, o.capacity_factor, o.capacity_factor > 0 ? "capacity" : "dropless", o.layout_invariant, o.warmup, N);

    /* Weights, input and upstream gradient from a fixed seed; uniform(-a, a) with a = sqrt(3/fan_in). */
    moe_rng rng = moe_rng_seeded(0x5eed);
    size_t P = moe_layer_num_params(&cfg), Td = (size_t)T * d;
    float *wbuf = alloc(P), *gbuf = alloc(P), *x = alloc(Td), *dout = alloc(Td), *out = alloc(Td), *dx = alloc(Td);
    moe_layer_weights w = moe_layer_weights_view(&cfg, wbuf), g = moe_layer_weights_view(&cfg, gbuf);
    moe_layer_weights_init(&cfg, &w, &rng);
    moe_rng_fill_uniform(&rng, x, Td, 1.0);
    moe_rng_fill_uniform(&rng, dout, Td, 1.0);

    moe_layer *layer;
    bench_check(moe_layer_create(&cfg, NULL, NULL, &layer), "moe_layer_create");
    moe_layer_stats stats;
    double *tf = malloc(N * sizeof *tf), *tb = malloc(N * sizeof *tb), *tt = malloc(N * sizeof *tt);
    if (!tf || !tb || !tt) bench_fail("out of memory");
    for (int it = -o.warmup; it < N; it++) {
        memset(gbuf, 0, P * sizeof *gbuf); /* untimed: a training step zeroes the gradients once */
        double t0 = bench_now_ms();
        bench_check(moe_layer_forward(layer, &w, x, T, out, &stats), "moe_layer_forward");
        double t1 = bench_now_ms();
        bench_check(moe_layer_backward(layer, &w, dout, dx, &g), "moe_layer_backward");
        double t2 = bench_now_ms();
        if (it >= 0) tf[it] = t1 - t0, tb[it] = t2 - t1, tt[it] = t2 - t0;
    }
    double checksum = 0;
    for (size_t i = 0; i < Td; i++) checksum += (double)out[i] + dx[i];

    /* Routing of the (deterministic) last forward: rows per expert, and the GEMM FLOPs they imply. */
    int *offset = calloc(E + 1, sizeof *offset);
    if (!offset) bench_fail("out of memory");
    printf("rows per expert:");
    for (int e = 0; e < E; e++) {
        offset[e + 1] = offset[e] + stats.num_tokens_per_expert[e];
        printf(" %d", stats.num_tokens_per_expert[e]);
    }
    const long rows = offset[E];
    printf("  (kept %ld of %d, dropped %d)\n", rows, stats.num_assignments, stats.num_dropped);
    printf("losses: aux=%.6f z=%.6f  checksum(out+dx)=%.6e\n", stats.aux_loss, stats.z_loss, checksum);
    const double expert_fwd = 3.0 * 2.0 * rows * d * f, router_fwd = 2.0 * T * d * E;
    const double flop_f = expert_fwd + router_fwd, flop_b = 2 * expert_fwd + 2 * router_fwd, flop_t = flop_f + flop_b;

    /* The floor: the same sgemm calls alone, median of several replays (after one untimed one). */
    replay_bufs rb;
    size_t A = rows ? rows : 1;
    rb.x = x, rb.dx = dx, rb.w = w, rb.g = g;
    rb.logits = alloc((size_t)T * E), rb.dlogits = alloc((size_t)T * E);
    rb.xp = alloc(A * d), rb.y = alloc(A * d), rb.dy = alloc(A * d), rb.dxp = alloc(A * d);
    rb.h1 = alloc(A * f), rb.h3 = alloc(A * f), rb.act = alloc(A * f), rb.dh1 = alloc(A * f), rb.dh3 = alloc(A * f);
    moe_rng_fill_uniform(&rng, rb.dlogits, (size_t)T * E, 1e-3);
    moe_rng_fill_uniform(&rng, rb.xp, A * d, 1.0), moe_rng_fill_uniform(&rng, rb.dy, A * d, 1.0);
    moe_rng_fill_uniform(&rng, rb.act, A * f, 1.0), moe_rng_fill_uniform(&rng, rb.dh3, A * f, 1.0);
    const int R = N > 5 ? N : 5;
    double *rf = malloc(R * sizeof *rf), *rbk = malloc(R * sizeof *rbk);
    if (!rf || !rbk) bench_fail("out of memory");
    for (int it = -1; it < R; it++) {
        memset(gbuf, 0, P * sizeof *gbuf);
        double t0 = bench_now_ms();
        replay_forward(&rb, offset, T, d, f, E);
        double t1 = bench_now_ms();
        replay_backward(&rb, offset, T, d, f, E);
        double t2 = bench_now_ms();
        if (it >= 0) rf[it] = t1 - t0, rbk[it] = t2 - t1;
    }
    const double gemm_f = bench_median(rf, R), gemm_b = bench_median(rbk, R);
    const double rate_f = flop_f / gemm_f * 1e-6, rate_b = flop_b / gemm_b * 1e-6; /* GFLOP/s */
    const double rate = flop_t / (gemm_f + gemm_b) * 1e-6;
    const double floor_f = flop_f / rate * 1e-6, floor_b = flop_b / rate * 1e-6, floor_t = flop_t / rate * 1e-6;

    const double mf = bench_median(tf, N), mb = bench_median(tb, N), mt = bench_median(tt, N);
    printf("GEMM GFLOP per iteration: forward %.3f (experts %.3f + router %.4f), backward %.3f, total %.3f\n",
           flop_f * 1e-9, expert_fwd * 1e-9, router_fwd * 1e-9, flop_b * 1e-9, flop_t * 1e-9);
    printf("layer forward : median %8.2f ms  min %8.2f ms  %7.1f GFLOP/s\n", mf, bench_min(tf, N), flop_f / mf * 1e-6);
    printf("layer backward: median %8.2f ms  min %8.2f ms  %7.1f GFLOP/s\n", mb, bench_min(tb, N), flop_b / mb * 1e-6);
    printf("layer fwd+bwd : median %8.2f ms  min %8.2f ms  %7.1f GFLOP/s\n", mt, bench_min(tt, N), flop_t / mt * 1e-6);
    printf("sgemm alone (same calls, median of %d): forward %.2f ms (%.1f GFLOP/s), backward %.2f ms "
           "(%.1f GFLOP/s), rate %.1f GFLOP/s\n", R, gemm_f, rate_f, gemm_b, rate_b, rate);
    printf("floor_ms: forward %.2f  backward %.2f  total %.2f   layer_ms/floor_ms: forward %.3f  backward %.3f  "
           "total %.3f\n", floor_f, floor_b, floor_t, mf / floor_f, mb / floor_b, mt / floor_t);

    printf("json: {\"bench\":\"moe_layer_cpu\",\"tokens\":%d,\"d_model\":%d,\"d_ff\":%d,\"experts\":%d,\"top_k\":%d,"
           "\"capacity_factor\":%g,\"layout_invariant\":%d,\"warmup\":%d,\"iters\":%d,\"openblas_threads\":%d,"
           "\"openblas_corename\":",
           T, d, f, E, k, o.capacity_factor, o.layout_invariant, o.warmup, N, openblas_get_num_threads());
    bench_json_string(openblas_get_corename());
    printf(",\"openblas_config\":");
    bench_json_string(openblas_get_config());
    printf(",\"openblas_coretype_env\":");
    if (coretype) bench_json_string(coretype);
    else printf("null");
    printf(",\"rows\":%ld,\"dropped\":%d,\"forward_ms\":{\"median\":%.4f,\"min\":%.4f},"
           "\"backward_ms\":{\"median\":%.4f,\"min\":%.4f},\"total_ms\":{\"median\":%.4f,\"min\":%.4f},"
           "\"gflop\":{\"forward\":%.6f,\"backward\":%.6f,\"total\":%.6f},\"gflops\":%.3f,"
           "\"sgemm_ms\":{\"forward\":%.4f,\"backward\":%.4f},\"sgemm_gflops\":%.3f,"
           "\"floor_ms\":{\"forward\":%.4f,\"backward\":%.4f,\"total\":%.4f},"
           "\"ratio\":{\"forward\":%.4f,\"backward\":%.4f,\"total\":%.4f}}\n",
           rows, stats.num_dropped, mf, bench_min(tf, N), mb, bench_min(tb, N), mt, bench_min(tt, N), flop_f * 1e-9,
           flop_b * 1e-9, flop_t * 1e-9, flop_t / mt * 1e-6, gemm_f, gemm_b, rate, floor_f, floor_b, floor_t,
           mf / floor_f, mb / floor_b, mt / floor_t);

    moe_layer_destroy(layer);
    free(wbuf), free(gbuf), free(x), free(dout), free(out), free(dx), free(tf), free(tb), free(tt), free(offset);
    free(rf), free(rbk), free(rb.logits), free(rb.dlogits), free(rb.xp), free(rb.y), free(rb.dy), free(rb.dxp);
    free(rb.h1), free(rb.h3), free(rb.act), free(rb.dh1), free(rb.dh3);
    return 0;
}
