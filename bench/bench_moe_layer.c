/* bench_moe_layer.c — the cpu variant of the MoE layer benchmark (bench_moe_layer_driver.h): wall time of the
 * CPU layer (moe_layer_forward / moe_layer_backward on moe_runtime_create_cpu, a world of one), against the
 * time the GEMM library alone needs for the same GEMMs.
 *
 * The driver measures, at T tokens, width d, hidden d_ff, E experts, top-k (softmax, renormalised, dropless
 * unless --capacity-factor > 0, default aux/z coefficients): forward, backward and forward+backward ms
 * (median and min over --iters timed iterations after --warmup untimed ones), the GEMM FLOPs and the achieved
 * GFLOP/s. This table adds the "floor": it replays the layer's GEMMs (same shapes, transposes and
 * accumulation, one per expert and projection, plus the router's) as whole calls on the library the layer
 * uses (kernels/gemm_engine.h: oneDNN, or OpenBLAS), threaded by the library itself over --threads (the layer's
 * own calls are single-threaded, spread by the engine), with the expert GEMMs' inputs already in the run's
 * precision (bf16 arrays under --precision bf16 on a native bf16 library: no rounding, no 64-row blocks, no
 * copies), takes the median of several replays as the library's rate here, and prints floor_ms = GEMM FLOPs /
 * rate and layer_ms / floor_ms. Last line: "json: {...}".
 *
 *   meson setup build-bench --buildtype=release && ninja -C build-bench bench/bench_moe_layer
 *   build-bench/bench/bench_moe_layer [--tokens 4096 --d-model 512 --d-ff 1024 --experts 8 --top-k 2
 *       --capacity-factor 0 --precision fp32 --warmup 2 --iters 7]
 */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_moe_layer_driver.h"
#include "core/precision.h"
#include "kernels/cast.h"
#include "kernels/gemm_engine.h"

/* Scratch for the GEMM-only replay: the layer's GEMM operands with its shapes. The expert GEMMs' inputs are
 * bf16 arrays when bf16 is set (es = 2), else floats (es = 4); the router's and every output are floats. */
typedef struct {
    moe_gemm_engine *engine;
    int bf16;
    size_t es;
    float *x, *logits, *dlogits, *dx, *router_w, *g_router_w;
    void *xp, *act, *dy, *dh1, *dh3, *w1, *w3, *w2; /* expert GEMM inputs */
    float *h1, *h3, *y, *dxp, *g1, *g3, *g2;         /* expert GEMM outputs */
} replay_bufs;

static void *alloc(size_t n, size_t size) {
    void *p = malloc((n ? n : 1) * size);
    if (!p) bench_fail("out of memory");
    return p;
}

/* An expert GEMM input of n values: src (or uniform values in [-1, 1) when src is NULL) in the replay's type. */
static void *expert_input(const replay_bufs *b, const float *src, size_t n, moe_rng *rng) {
    float *values = alloc(n, sizeof *values);
    if (src) memcpy(values, src, n * sizeof *values);
    else moe_rng_fill_uniform(rng, values, n, 1.0);
    if (!b->bf16) return values;
    moe_bf16 *converted = alloc(n, sizeof *converted);
    moe_bf16_from_float_n(values, n, converted);
    free(values);
    return converted;
}

/* C[m, n] (+)= op(A) op(B) on the layer's library; expert: the inputs are the replay's expert type. */
static void mm(const replay_bufs *b, int expert, int ta, int tb, int m, int n, int k, const void *A, const void *B,
               int accumulate, float *C) {
    const moe_gemm_call call = {.trans_a = ta, .trans_b = tb, .m = m, .n = n, .k = k, .bf16 = expert && b->bf16,
                                .accumulate = accumulate};
    bench_check(moe_gemm_engine_run_library_threads(b->engine, &call, A, B, C), "the replayed GEMM");
}

#define AT(buf, index) ((const char *)(buf) + (size_t)(index) * b->es)

/* The forward GEMMs of moe_layer_forward: router logits, then w1, w3, w2 per expert. */
static void replay_forward(const replay_bufs *b, const int *offset, int T, int d, int f, int E) {
    const size_t wc = (size_t)f * d;
    mm(b, 0, 0, 1, T, E, d, b->x, b->router_w, 0, b->logits);
    for (int e = 0; e < E; e++) {
        int n = offset[e + 1] - offset[e];
        if (n == 0) continue;
        size_t r0 = offset[e];
        mm(b, 1, 0, 1, n, f, d, AT(b->xp, r0 * d), AT(b->w1, e * wc), 0, b->h1 + r0 * f);
        mm(b, 1, 0, 1, n, f, d, AT(b->xp, r0 * d), AT(b->w3, e * wc), 0, b->h3 + r0 * f);
        mm(b, 1, 0, 1, n, d, f, AT(b->act, r0 * f), AT(b->w2, e * wc), 0, b->y + r0 * d);
    }
}

/* The backward GEMMs of moe_layer_backward: six per expert, then the router's weight and input grads. */
static void replay_backward(const replay_bufs *b, const int *offset, int T, int d, int f, int E) {
    const size_t wc = (size_t)f * d;
    for (int e = 0; e < E; e++) {
        int n = offset[e + 1] - offset[e];
        if (n == 0) continue;
        size_t r0 = offset[e];
        const void *x = AT(b->xp, r0 * d), *dY = AT(b->dy, r0 * d), *A = AT(b->act, r0 * f);
        const void *dH1 = AT(b->dh1, r0 * f), *dH3 = AT(b->dh3, r0 * f);
        float *dX = b->dxp + r0 * d;
        mm(b, 1, 1, 0, d, f, n, dY, A, 1, b->g2 + e * wc);
        mm(b, 1, 0, 0, n, f, d, dY, AT(b->w2, e * wc), 0, b->h1 + r0 * f); /* dA */
        mm(b, 1, 1, 0, f, d, n, dH1, x, 1, b->g1 + e * wc);
        mm(b, 1, 1, 0, f, d, n, dH3, x, 1, b->g3 + e * wc);
        mm(b, 1, 0, 0, n, d, f, dH1, AT(b->w1, e * wc), 0, dX);
        mm(b, 1, 0, 0, n, d, f, dH3, AT(b->w3, e * wc), 1, dX);
    }
    mm(b, 0, 1, 0, E, d, T, b->dlogits, b->x, 1, b->g_router_w);
    mm(b, 0, 0, 0, T, d, E, b->dlogits, b->router_w, 1, b->dx);
}

static void open_cpu(bench_layer_run *r) {
    bench_check(moe_runtime_create_cpu(&r->rt), "moe_runtime_create_cpu");
    bench_check(moe_parallel_create_self(&r->par), "moe_parallel_create_self");
}

static void describe_openblas(const bench_layer_run *r) {
    (void)r;
    const char *coretype = getenv("OPENBLAS_CORETYPE");
    printf("gemm library: %s\n", moe_gemm_library());
    printf("openblas: config=%s corename=%s threads=%d OPENBLAS_CORETYPE=%s\n", openblas_get_config(),
           openblas_get_corename(), openblas_get_num_threads(), coretype ? coretype : "(unset)");
}

/* The floor, measured by report_floor and put in the JSON line by json_floor. */
static struct {
    int replays;
    double gemm_forward_ms, gemm_backward_ms, rate_gflops, floor_ms[3], ratio[3];
} floor_result;

/* The same GEMMs alone, median of several replays (after one untimed one). On the CPU runtime the
 * run's buffers are host memory, so the replay reads the layer's own weights and input. */
static void report_floor(bench_layer_run *r) {
    const int T = r->num_tokens, d = r->o->d_model, f = r->o->d_ff, E = r->o->experts, N = r->o->iters;
    const size_t P = moe_layer_num_params(&r->cfg, r->o->ep);
    int *offset = calloc(E + 1, sizeof *offset);
    if (!offset) bench_fail("out of memory");
    for (int e = 0; e < E; e++) offset[e + 1] = offset[e] + r->stats.num_tokens_per_expert[e];
    const long rows = offset[E];
    const size_t A = rows ? rows : 1, wc = (size_t)E * f * d;
    replay_bufs rb = {.bf16 = r->o->precision == MOE_PRECISION_BF16 && moe_gemm_native_bf16()};
    rb.es = rb.bf16 ? sizeof(moe_bf16) : sizeof(float);
    bench_check(moe_gemm_engine_create(&rb.engine), "moe_gemm_engine_create");
    moe_rng rng = moe_rng_seeded((uint64_t)r->o->seed + 1);
    rb.x = r->x, rb.dx = r->dx, rb.router_w = r->w.router_w, rb.g_router_w = r->g.router_w;
    rb.logits = alloc((size_t)T * E, sizeof(float)), rb.dlogits = alloc((size_t)T * E, sizeof(float));
    moe_rng_fill_uniform(&rng, rb.dlogits, (size_t)T * E, 1e-3);
    rb.w1 = expert_input(&rb, r->w.w1, wc, &rng), rb.w3 = expert_input(&rb, r->w.w3, wc, &rng);
    rb.w2 = expert_input(&rb, r->w.w2, wc, &rng);
    rb.xp = expert_input(&rb, NULL, A * d, &rng), rb.dy = expert_input(&rb, NULL, A * d, &rng);
    rb.act = expert_input(&rb, NULL, A * f, &rng), rb.dh1 = expert_input(&rb, NULL, A * f, &rng);
    rb.dh3 = expert_input(&rb, NULL, A * f, &rng);
    rb.h1 = alloc(A * f, sizeof(float)), rb.h3 = alloc(A * f, sizeof(float));
    rb.y = alloc(A * d, sizeof(float)), rb.dxp = alloc(A * d, sizeof(float));
    rb.g1 = r->g.w1, rb.g3 = r->g.w3, rb.g2 = r->g.w2;
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
    floor_result.replays = R, floor_result.gemm_forward_ms = gemm_f, floor_result.gemm_backward_ms = gemm_b;
    floor_result.rate_gflops = rate;
    for (int i = 0; i < 3; i++) floor_result.floor_ms[i] = floor_ms[i], floor_result.ratio[i] = layer_ms[i] / floor_ms[i];
    printf("GEMMs alone (same products, whole calls, %s inputs, median of %d): forward %.2f ms (%.1f GFLOP/s), backward %.2f ms "
           "(%.1f GFLOP/s), rate %.1f GFLOP/s\n", rb.bf16 ? "bf16" : "fp32", R, gemm_f, flop_f / gemm_f * 1e-6, gemm_b, flop_b / gemm_b * 1e-6, rate);
    printf("floor_ms: forward %.2f  backward %.2f  total %.2f   layer_ms/floor_ms: forward %.3f  backward %.3f  "
           "total %.3f\n", floor_ms[0], floor_ms[1], floor_ms[2], floor_result.ratio[0], floor_result.ratio[1],
           floor_result.ratio[2]);
    void *owned[] = {rf, rbk, offset, rb.logits, rb.dlogits, rb.w1, rb.w3, rb.w2, rb.xp, rb.dy, rb.act, rb.dh1,
                     rb.dh3, rb.h1, rb.h3, rb.y, rb.dxp};
    for (size_t i = 0; i < sizeof owned / sizeof *owned; i++) free(owned[i]);
    moe_gemm_engine_free(rb.engine);
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
    printf(",\"gemm_library\":");
    bench_json_string(moe_gemm_library());
    printf(",\"gemm_ms\":{\"forward\":%.4f,\"backward\":%.4f},\"gemm_gflops\":%.3f,"
           "\"floor_ms\":{\"forward\":%.4f,\"backward\":%.4f,\"total\":%.4f},"
           "\"ratio\":{\"forward\":%.4f,\"backward\":%.4f,\"total\":%.4f}",
           floor_result.gemm_forward_ms, floor_result.gemm_backward_ms, floor_result.rate_gflops, fl[0], fl[1], fl[2],
           ra[0], ra[1], ra[2]);
}

static const bench_layer_variant kCpu = {
    .program = "bench_moe_layer",
    .bench = "moe_layer_cpu",
    .synopsis = "bench_moe_layer [flags]",
    .about = "wall time of the CPU MoE layer (forward, backward) against its GEMM library alone on the same products",
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
