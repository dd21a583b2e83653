/* test_gpu_experts.cu — the GPU SwiGLU experts (experts/expert_ffn.cu) against the CPU reference.
 *   moe_swiglu_forward_cuda / moe_swiglu_backward_cuda: against the formulas of expert_ffn_cpu.c in fp32 on the same
 *     bf16 inputs, f = 13 (scalar path) and 96 (16-byte path); the scalar path on misaligned pointers is
 *     bitwise equal to the vector path.
 *   moe_expert_weights_to_bf16_cuda: bitwise equal to moe_bf16_from_float of w1 | w3 packed per expert, and of w2.
 *   moe_expert_ffn_forward_cuda / _backward_cuda, both modes: against moe_expert_ffn_forward_cpu / _backward_cpu
 *     (float build, one call per expert, segments = 1) on bf16-rounded weights, inputs and dy. The CPU
 *     backward is given the activations the GPU forward saved (h13, act), so its tolerances measure the
 *     backward's own roundings. Experts with zero rows and skewed counts; weight gradients start from
 *     random values (beta = 1 is tested) and are compared as increments; a zero-row expert's gradients
 *     must stay bitwise unchanged and its bf16 weights are poisoned (NaN) so that reading them shows.
 *   The two modes agree within the "expert_ffn modes" row; each mode run twice is bitwise equal.
 * Tolerances: the rows "swiglu ..." and "expert_ffn ..." (bf16) of tests/test_tolerance.c, whose element
 * bounds here are scaled by rms(want).
 * Outputs are poisoned before each run. Exit 77 (skip) when no GPU is present.
 * Run: meson test -C build --suite gpu */
#include <math.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "experts/expert_ffn.h"
#include "kernels/cast.h"
#include "tests/test_gpu_util.h"
#include "tests/test_tolerance.h"
}

static void *xmalloc(size_t nbytes) {
    void *p = malloc(nbytes ? nbytes : 1);
    if (!p) {
        fprintf(stderr, "test: out of memory\n");
        exit(1);
    }
    return p;
}

static float *to_float(const uint16_t *b, size_t n) {
    float *f = (float *)xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) f[i] = moe_bf16_to_float(b[i]);
    return f;
}

/* n uniform values of the given scale, rounded to bf16: as floats and as bf16 bits. */
static float *bf16_uniform(moe_rng *rng, size_t n, double scale, uint16_t **bits) {
    float *f = test_alloc_uniform(rng, n, scale);
    uint16_t *b = (uint16_t *)xmalloc(n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++) b[i] = moe_bf16_from_float(f[i]), f[i] = moe_bf16_to_float(b[i]);
    if (bits) *bits = b;
    else free(b);
    return f;
}

static float sigmoid(float h) { return 1.0f / (1.0f + expf(-h)); }

/* ---- swiglu ---- */

static void test_swiglu(moe_gpu *gpu, int rows, int f, moe_rng *rng) {
    const size_t n13 = (size_t)rows * 2 * f, n = (size_t)rows * f;
    uint16_t *h13b, *dab;
    float *h13 = bf16_uniform(rng, n13, 4.0, &h13b), *da = bf16_uniform(rng, n, 1.0, &dab);
    float *act_want = (float *)xmalloc(n * sizeof(float)), *dh_want = (float *)xmalloc(n13 * sizeof(float));
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < f; c++) {
            float h1 = h13[(size_t)r * 2 * f + c], h3 = h13[(size_t)r * 2 * f + f + c], dA = da[(size_t)r * f + c];
            float s = sigmoid(h1);
            act_want[(size_t)r * f + c] = h1 * s * h3;
            dh_want[(size_t)r * 2 * f + f + c] = dA * h1 * s;
            dh_want[(size_t)r * 2 * f + c] = dA * h3 * s * (1 + h1 * (1 - s));
        }
    /* aligned buffers, and the same data one element past an aligned start (the scalar path) */
    uint16_t *got_act[2], *got_dh[2];
    for (int mis = 0; mis < 2; mis++) {
        uint16_t *d_h13 = (uint16_t *)test_gpu_alloc(gpu, (n13 + 1) * 2), *d_da = (uint16_t *)test_gpu_alloc(gpu, (n + 1) * 2);
        uint16_t *d_act = (uint16_t *)test_gpu_alloc(gpu, (n + 1) * 2), *d_dh = (uint16_t *)test_gpu_alloc(gpu, (n13 + 1) * 2);
        CHECK_OK(moe_gpu_upload(gpu, d_h13 + mis, h13b, n13 * 2));
        CHECK_OK(moe_gpu_upload(gpu, d_da + mis, dab, n * 2));
        CHECK_OK(moe_swiglu_forward_cuda(gpu, d_h13 + mis, rows, f, d_act + mis));
        CHECK_OK(moe_swiglu_backward_cuda(gpu, d_h13 + mis, d_da + mis, rows, f, d_dh + mis));
        got_act[mis] = (uint16_t *)xmalloc(n * 2), got_dh[mis] = (uint16_t *)xmalloc(n13 * 2);
        test_gpu_download(gpu, got_act[mis], d_act + mis, n * 2);
        test_gpu_download(gpu, got_dh[mis], d_dh + mis, n13 * 2);
        test_gpu_free(gpu, d_h13), test_gpu_free(gpu, d_da), test_gpu_free(gpu, d_act), test_gpu_free(gpu, d_dh);
    }
    char label[64];
    snprintf(label, sizeof label, "rows=%d f=%d", rows, f);
    float *act = to_float(got_act[0], n), *dh = to_float(got_dh[0], n13);
    test_tolerance_check("swiglu act", "bf16", act, act_want, n, "%s", label);
    test_tolerance_check("swiglu dh13", "bf16", dh, dh_want, n13, "%s", label);
    CHECK(memcmp(got_act[0], got_act[1], n * 2) == 0 && memcmp(got_dh[0], got_dh[1], n13 * 2) == 0,
          "%s: the misaligned (scalar) path differs from the aligned one", label);
    for (int i = 0; i < 2; i++) free(got_act[i]), free(got_dh[i]);
    free(h13b), free(dab), free(h13), free(da), free(act_want), free(dh_want), free(act), free(dh);
}

/* ---- the expert FFN ---- */

typedef struct {
    int E, d, f;
    int counts[8];
} ecase;

typedef struct { /* host copies of one GPU run */
    uint16_t *h13, *act, *y, *dxp;
    float *grads; /* [w1 | w3 | w2] */
} gpu_run;

typedef struct {
    int E, d, f, rows, offset[9];
    size_t wcount; /* f * d per expert and matrix */
    float *grads0; /* initial gradients [w1 | w3 | w2] */
    /* device */
    moe_expert_weights_bf16 wb;
    moe_bf16 *xp, *dy, *h13, *act, *y, *dh13, *dact, *dxp;
    float *grads;
} fixture;

static void gpu_run_once(moe_gpu *gpu, moe_expert_gemm_mode mode, const fixture *F, gpu_run *out) {
    const size_t rows = F->rows, E = F->E, d = F->d, f = F->f, gn = 3 * E * F->wcount;
    test_gpu_poison(gpu, F->h13, rows * 2 * f * 2 + 2);
    test_gpu_poison(gpu, F->act, rows * f * 2 + 2);
    test_gpu_poison(gpu, F->y, rows * d * 2 + 2);
    test_gpu_poison(gpu, F->dh13, rows * 2 * f * 2 + 2);
    test_gpu_poison(gpu, F->dact, rows * f * 2 + 2);
    test_gpu_poison(gpu, F->dxp, rows * d * 2 + 2);
    CHECK_OK(moe_gpu_upload(gpu, F->grads, F->grads0, gn * sizeof(float)));
    moe_layer_weights g = {NULL, F->grads, F->grads + E * F->wcount, F->grads + 2 * E * F->wcount};
    CHECK_OK(moe_expert_ffn_forward_cuda(gpu, mode, &F->wb, F->E, F->d, F->f, F->offset, F->xp, F->h13, F->act, F->y));
    CHECK_OK(moe_expert_ffn_backward_cuda(gpu, mode, &F->wb, &g, F->E, F->d, F->f, F->offset, F->xp, F->h13, F->act, F->dy,
                                      F->dh13, F->dact, F->dxp));
    out->h13 = (uint16_t *)xmalloc(rows * 2 * f * 2), out->act = (uint16_t *)xmalloc(rows * f * 2);
    out->y = (uint16_t *)xmalloc(rows * d * 2), out->dxp = (uint16_t *)xmalloc(rows * d * 2);
    out->grads = (float *)xmalloc(gn * sizeof(float));
    test_gpu_download(gpu, out->h13, F->h13, rows * 2 * f * 2);
    test_gpu_download(gpu, out->act, F->act, rows * f * 2);
    test_gpu_download(gpu, out->y, F->y, rows * d * 2);
    test_gpu_download(gpu, out->dxp, F->dxp, rows * d * 2);
    test_gpu_download(gpu, out->grads, F->grads, gn * sizeof(float));
}

static void gpu_run_free(gpu_run *r) { free(r->h13), free(r->act), free(r->y), free(r->dxp), free(r->grads); }

static int runs_equal(const fixture *F, const gpu_run *a, const gpu_run *b) {
    const size_t rows = F->rows, d = F->d, f = F->f;
    return !memcmp(a->h13, b->h13, rows * 2 * f * 2) && !memcmp(a->act, b->act, rows * f * 2) &&
           !memcmp(a->y, b->y, rows * d * 2) && !memcmp(a->dxp, b->dxp, rows * d * 2) &&
           !memcmp(a->grads, b->grads, 3 * (size_t)F->E * F->wcount * sizeof(float));
}

/* got - grads0 over one of the three gradient blocks (blk 0: w1, 1: w3, 2: w2) */
static float *increment(const fixture *F, const float *g, int blk) {
    const size_t n = (size_t)F->E * F->wcount, o = (size_t)blk * n;
    float *inc = (float *)xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) inc[i] = g[o + i] - F->grads0[o + i];
    return inc;
}

/* Compares two runs' outputs (and increments) with one tolerance row, or a run against the CPU. */
static void compare_runs(const char *label, const fixture *F, const gpu_run *got, const gpu_run *want_run) {
    const size_t rows = F->rows, d = F->d, f = F->f;
    const char *names[] = {"h13", "act", "y", "dxp"};
    const uint16_t *g[] = {got->h13, got->act, got->y, got->dxp}, *w[] = {want_run->h13, want_run->act, want_run->y,
                                                                           want_run->dxp};
    const size_t n[] = {rows * 2 * f, rows * f, rows * d, rows * d};
    for (int i = 0; i < 4; i++) {
        float *gf = to_float(g[i], n[i]), *wf = to_float(w[i], n[i]);
        char l[256];
        snprintf(l, sizeof l, "%s %s", label, names[i]);
        test_tolerance_check("expert_ffn modes", "bf16", gf, wf, n[i], "%s", l);
        free(gf), free(wf);
    }
    const char *gnames[] = {"dW1", "dW3", "dW2"};
    for (int b = 0; b < 3; b++) {
        float *gi = increment(F, got->grads, b), *wi = increment(F, want_run->grads, b);
        char l[256];
        snprintf(l, sizeof l, "%s %s", label, gnames[b]);
        test_tolerance_check("expert_ffn modes", "bf16", gi, wi, (size_t)F->E * F->wcount, "%s", l);
        free(gi), free(wi);
    }
}

static void test_experts(moe_gpu *gpu, const ecase *c, moe_rng *rng) {
    fixture F;
    memset(&F, 0, sizeof F);
    F.E = c->E, F.d = c->d, F.f = c->f, F.wcount = (size_t)c->f * c->d;
    F.offset[0] = 0;
    for (int e = 0; e < c->E; e++) F.offset[e + 1] = F.offset[e] + c->counts[e];
    F.rows = F.offset[c->E];
    const size_t E = F.E, d = F.d, f = F.f, rows = F.rows, wn = E * F.wcount;
    char label[96];
    snprintf(label, sizeof label, "E=%d d=%d f=%d rows=%d", F.E, F.d, F.f, F.rows);

    /* bf16-valued inputs: weights with the init bound sqrt(3 / fan_in), rows and dy uniform */
    float *w1 = bf16_uniform(rng, wn, sqrt(3.0 / d), NULL), *w3 = bf16_uniform(rng, wn, sqrt(3.0 / d), NULL);
    float *w2 = bf16_uniform(rng, wn, sqrt(3.0 / f), NULL);
    uint16_t *xpb, *dyb;
    float *xp = bf16_uniform(rng, rows * d, 1.0, &xpb), *dy = bf16_uniform(rng, rows * d, 1.0, &dyb);
    F.grads0 = test_alloc_uniform(rng, 3 * wn, 1.0);

    /* device weights: fp32 [w1 | w3 | w2] -> bf16, checked bitwise */
    float *d_w = (float *)test_gpu_alloc(gpu, 3 * wn * sizeof(float));
    CHECK_OK(moe_gpu_upload(gpu, d_w, w1, wn * sizeof(float)));
    CHECK_OK(moe_gpu_upload(gpu, d_w + wn, w3, wn * sizeof(float)));
    CHECK_OK(moe_gpu_upload(gpu, d_w + 2 * wn, w2, wn * sizeof(float)));
    moe_layer_weights dw = {NULL, d_w, d_w + wn, d_w + 2 * wn};
    F.wb.w13 = (moe_bf16 *)test_gpu_alloc(gpu, 2 * wn * 2);
    F.wb.w2 = (moe_bf16 *)test_gpu_alloc(gpu, wn * 2);
    CHECK_OK(moe_expert_weights_to_bf16_cuda(gpu, &dw, F.E, F.d, F.f, &F.wb));
    uint16_t *w13_got = (uint16_t *)xmalloc(2 * wn * 2), *w2_got = (uint16_t *)xmalloc(wn * 2);
    test_gpu_download(gpu, w13_got, F.wb.w13, 2 * wn * 2);
    test_gpu_download(gpu, w2_got, F.wb.w2, wn * 2);
    size_t bad = 0;
    for (size_t e = 0; e < E; e++)
        for (size_t i = 0; i < F.wcount; i++) {
            bad += w13_got[e * 2 * F.wcount + i] != moe_bf16_from_float(w1[e * F.wcount + i]);
            bad += w13_got[e * 2 * F.wcount + F.wcount + i] != moe_bf16_from_float(w3[e * F.wcount + i]);
            bad += w2_got[e * F.wcount + i] != moe_bf16_from_float(w2[e * F.wcount + i]);
        }
    CHECK(bad == 0, "%s: moe_expert_weights_to_bf16_cuda: %zu of %zu values differ", label, bad, 3 * wn);
    free(w13_got), free(w2_got);
    for (int e = 0; e < F.E; e++) /* a zero-row expert's weights must not be read: make them NaN */
        if (c->counts[e] == 0) {
            test_gpu_poison(gpu, F.wb.w13 + (size_t)e * 2 * F.wcount, 2 * F.wcount * 2);
            test_gpu_poison(gpu, F.wb.w2 + (size_t)e * F.wcount, F.wcount * 2);
        }

    F.xp = (moe_bf16 *)test_gpu_upload(gpu, xpb, rows * d * 2);
    F.dy = (moe_bf16 *)test_gpu_upload(gpu, dyb, rows * d * 2);
    F.h13 = (moe_bf16 *)test_gpu_alloc(gpu, rows * 2 * f * 2 + 2);
    F.act = (moe_bf16 *)test_gpu_alloc(gpu, rows * f * 2 + 2);
    F.y = (moe_bf16 *)test_gpu_alloc(gpu, rows * d * 2 + 2);
    F.dh13 = (moe_bf16 *)test_gpu_alloc(gpu, rows * 2 * f * 2 + 2);
    F.dact = (moe_bf16 *)test_gpu_alloc(gpu, rows * f * 2 + 2);
    F.dxp = (moe_bf16 *)test_gpu_alloc(gpu, rows * d * 2 + 2);
    F.grads = (float *)test_gpu_alloc(gpu, 3 * wn * sizeof(float));

    gpu_run runs[2][2]; /* [mode][repeat] */
    for (int mode = 0; mode < 2; mode++)
        for (int rep = 0; rep < 2; rep++) gpu_run_once(gpu, (moe_expert_gemm_mode)mode, &F, &runs[mode][rep]);

    /* CPU forward on the same bf16 values */
    moe_gemm_rows_plan plan;
    CHECK_OK(moe_gemm_rows_plan_init(&plan, 0, 0, F.d > F.f ? F.d : F.f));
    moe_layer_weights wc = {NULL, w1, w3, w2};
    float *h1 = (float *)xmalloc(rows * f * 4), *h3 = (float *)xmalloc(rows * f * 4);
    float *act = (float *)xmalloc(rows * f * 4), *y = (float *)xmalloc(rows * d * 4);
    moe_expert_ffn_forward_cpu(&wc, F.E, F.d, F.f, F.offset, xp, h1, h3, act, y, &plan);
    float *h13_want = (float *)xmalloc(rows * 2 * f * 4);
    for (size_t r = 0; r < rows; r++) {
        memcpy(h13_want + r * 2 * f, h1 + r * f, f * 4);
        memcpy(h13_want + r * 2 * f + f, h3 + r * f, f * 4);
    }

    for (int mode = 0; mode < 2; mode++) {
        const gpu_run *g = &runs[mode][0];
        char l[160];
        snprintf(l, sizeof l, "%s %s", label, mode == MOE_EXPERT_GEMM_GROUPED ? "grouped" : "per-expert");
        float *h13g = to_float(g->h13, rows * 2 * f), *actg = to_float(g->act, rows * f);
        float *yg = to_float(g->y, rows * d), *dxpg = to_float(g->dxp, rows * d);
        test_tolerance_check("expert_ffn h13", "bf16", h13g, h13_want, rows * 2 * f, "%s", l);
        test_tolerance_check("expert_ffn act", "bf16", actg, act, rows * f, "%s", l);
        test_tolerance_check("expert_ffn y", "bf16", yg, y, rows * d, "%s", l);

        /* CPU backward from the activations this GPU run saved */
        float *h1g = (float *)xmalloc(rows * f * 4), *h3g = (float *)xmalloc(rows * f * 4);
        for (size_t r = 0; r < rows; r++) {
            memcpy(h1g + r * f, h13g + r * 2 * f, f * 4);
            memcpy(h3g + r * f, h13g + r * 2 * f + f, f * 4);
        }
        float *gc = (float *)xmalloc(3 * wn * 4);
        memcpy(gc, F.grads0, 3 * wn * 4);
        moe_layer_weights gcw = {NULL, gc, gc + wn, gc + 2 * wn};
        float *dh1 = (float *)xmalloc(rows * f * 4), *dh3 = (float *)xmalloc(rows * f * 4);
        float *dxp_want = (float *)xmalloc(rows * d * 4), *wscratch = (float *)xmalloc(F.wcount * 4);
        moe_expert_ffn_backward_cpu(&wc, &gcw, F.E, F.d, F.f, F.offset, 1, xp, h1g, h3g, actg, dy, dh1, dh3, dxp_want,
                                wscratch, &plan);
        test_tolerance_check("expert_ffn dxp", "bf16", dxpg, dxp_want, rows * d, "%s", l);
        const char *gops[] = {"expert_ffn dW1", "expert_ffn dW3", "expert_ffn dW2"};
        for (int b = 0; b < 3; b++) {
            float *gi = increment(&F, g->grads, b), *wi = increment(&F, gc, b);
            test_tolerance_check(gops[b], "bf16", gi, wi, wn, "%s", l);
            free(gi), free(wi);
        }
        size_t moved = 0; /* zero-row experts: gradients bitwise unchanged */
        for (int e = 0; e < F.E; e++)
            if (c->counts[e] == 0)
                for (int b = 0; b < 3; b++)
                    moved += memcmp(g->grads + b * wn + e * F.wcount, F.grads0 + b * wn + e * F.wcount,
                                    F.wcount * 4) != 0;
        CHECK(moved == 0, "%s: gradients of a zero-row expert changed (%zu blocks)", l, moved);
        int same = runs_equal(&F, &runs[mode][0], &runs[mode][1]);
        CHECK(same, "%s: two runs are not bitwise equal", l);
        printf("%-52s two runs %s\n", l, same ? "bitwise equal" : "DIFFER");
        free(h13g), free(actg), free(yg), free(dxpg), free(h1g), free(h3g), free(gc), free(dh1), free(dh3);
        free(dxp_want), free(wscratch);
    }
    char l[160];
    snprintf(l, sizeof l, "%s grouped vs per-expert", label);
    compare_runs(l, &F, &runs[MOE_EXPERT_GEMM_GROUPED][0], &runs[MOE_EXPERT_GEMM_PER_EXPERT][0]);

    for (int mode = 0; mode < 2; mode++)
        for (int rep = 0; rep < 2; rep++) gpu_run_free(&runs[mode][rep]);
    moe_gemm_rows_plan_free(&plan);
    free(w1), free(w3), free(w2), free(xpb), free(dyb), free(xp), free(dy), free(F.grads0);
    free(h1), free(h3), free(act), free(y), free(h13_want);
    void *dev[] = {d_w, F.wb.w13, F.wb.w2, F.xp, F.dy, F.h13, F.act, F.y, F.dh13, F.dact, F.dxp, F.grads};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) test_gpu_free(gpu, dev[i]);
}

int main(void) {
    moe_gpu *gpu = test_gpu_require("test_gpu_experts");
    moe_rng rng = moe_rng_seeded(1234);
    test_swiglu(gpu, 50, 13, &rng);
    test_swiglu(gpu, 64, 96, &rng);
    /* skewed counts with empty experts (first, middle, last) and a one-row expert; a Zipf-like spread */
    const ecase cases[] = {
        {4, 64, 96, {37, 0, 200, 1}},
        {8, 256, 512, {0, 400, 200, 133, 0, 80, 67, 0}},
        {3, 128, 64, {1, 1, 300}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) test_experts(gpu, &cases[i], &rng);
    moe_gpu_destroy(gpu);
    return test_finish("test_gpu_experts");
}
