/* test_gpu_experts.cu — the GPU SwiGLU experts (experts/expert_ffn.cu) against the CPU reference.
 *   moe_swiglu_forward_cuda / moe_swiglu_backward_cuda: against the formulas of expert_ffn_cpu.c in fp32 on the same
 *     bf16 inputs, f = 13 (scalar path) and 96 (16-byte path); the scalar path on misaligned pointers is
 *     bitwise equal to the vector path.
 *   moe_expert_weights_to_bf16_cuda: bitwise equal to moe_bf16_from_float of w1 | w3 packed per expert, and of w2.
 *   moe_expert_ffn_forward_cuda / _backward_cuda, all four modes: against moe_expert_ffn_forward_cpu / _backward_cpu
 *     (float build, one call per expert, segments = 1) on bf16-rounded weights, inputs and dy. The CPU
 *     backward is given the activations the GPU forward saved (h13, act), so its tolerances measure the
 *     backward's own roundings. Experts with zero rows and skewed counts; weight gradients start from
 *     random values (beta = 1 is tested) and are compared as increments; a zero-row expert's gradients
 *     must stay bitwise unchanged and its bf16 weights are poisoned (NaN) so that reading them shows.
 *   The modes agree within the "expert_ffn modes" row; each mode run twice is bitwise equal.
 *   Row blocks and pinned cuBLASLt calls (MOE_EXPERT_GEMM_ROW_BLOCKS and _LT, layout invariance): an expert's rows
 *     give the same bits, forward and backward, whether the expert has 150 rows or only a part of them (the first 37,
 *     or the 113 from row 37 on): what differs between two ranks' layouts of the same tokens. Widths that are not
 *     multiples of 8 (d 60, f 52) run LT mode's row-block fallback.
 *   The backward with segments = 1, 2, 3, 4, 8 (expert_ffn.h's contract; empty segments, an expert without rows),
 *     both modes: bitwise the host's sum, in the documented order (the tree; segment order for 3), of the
 *     products of separate one-segment CUDA calls, the in-order sum and one product per expert shown to differ
 *     from it (the check is not blind); within the "expert_ffn ..." rows of the CPU backward with the same
 *     segments.
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

static size_t bits_differ16(const uint16_t *a, const uint16_t *b, size_t n) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += a[i] != b[i];
    return bad;
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
    float *grads, *wscratch; /* wscratch: the row-block mode's weight-gradient leaves (one segment) */
} fixture;

enum { NUM_MODES = 4 };
static const char *mode_name(int mode) {
    return mode == MOE_EXPERT_GEMM_GROUPED      ? "grouped"
           : mode == MOE_EXPERT_GEMM_PER_EXPERT ? "per-expert"
           : mode == MOE_EXPERT_GEMM_ROW_BLOCKS ? "row-blocks"
                                                : "lt";
}

static void gpu_run_once(moe_gpu *gpu, moe_expert_gemm_mode mode, const fixture *F, gpu_run *out) {
    const size_t rows = F->rows, E = F->E, d = F->d, f = F->f, gn = 3 * E * F->wcount;
    test_gpu_poison(gpu, F->h13, rows * 2 * f * 2 + 2);
    test_gpu_poison(gpu, F->act, rows * f * 2 + 2);
    test_gpu_poison(gpu, F->y, rows * d * 2 + 2);
    test_gpu_poison(gpu, F->dh13, rows * 2 * f * 2 + 2);
    test_gpu_poison(gpu, F->dact, rows * f * 2 + 2);
    test_gpu_poison(gpu, F->dxp, rows * d * 2 + 2);
    CHECK_OK(moe_gpu_upload(gpu, F->grads, F->grads0, gn * sizeof(float)));
    moe_layer_weights g = {NULL, F->grads, F->grads + E * F->wcount, F->grads + 2 * E * F->wcount, 0};
    CHECK_OK(moe_expert_ffn_forward_cuda(gpu, mode, &F->wb, F->E, F->d, F->f, F->offset, F->xp, F->h13, F->act, F->y));
    CHECK_OK(moe_expert_ffn_backward_cuda(gpu, mode, &F->wb, &g, F->E, F->d, F->f, F->offset, 1, F->xp, F->h13, F->act,
                                          F->dy, F->dh13, F->dact, F->dxp, F->wscratch));
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
    moe_layer_weights dw = {NULL, d_w, d_w + wn, d_w + 2 * wn, 0};
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
    F.wscratch = (float *)test_gpu_alloc(gpu, moe_expert_ffn_wgrad_scratch_count(F.d, F.f, 1) * sizeof(float));

    gpu_run runs[NUM_MODES][2]; /* [mode][repeat] */
    for (int mode = 0; mode < NUM_MODES; mode++)
        for (int rep = 0; rep < 2; rep++) gpu_run_once(gpu, (moe_expert_gemm_mode)mode, &F, &runs[mode][rep]);

    /* CPU forward on the same bf16 values */
    moe_gemm_rows_plan plan;
    CHECK_OK(moe_gemm_rows_plan_init(&plan, 0, 0, F.d > F.f ? F.d : F.f));
    moe_layer_weights wc = {NULL, w1, w3, w2, 0};
    float *h1 = (float *)xmalloc(rows * f * 4), *h3 = (float *)xmalloc(rows * f * 4);
    float *act = (float *)xmalloc(rows * f * 4), *y = (float *)xmalloc(rows * d * 4);
    moe_expert_ffn_forward_cpu(&wc, F.E, F.d, F.f, F.offset, xp, h1, h3, act, y, &plan);
    float *h13_want = (float *)xmalloc(rows * 2 * f * 4);
    for (size_t r = 0; r < rows; r++) {
        memcpy(h13_want + r * 2 * f, h1 + r * f, f * 4);
        memcpy(h13_want + r * 2 * f + f, h3 + r * f, f * 4);
    }

    for (int mode = 0; mode < NUM_MODES; mode++) {
        const gpu_run *g = &runs[mode][0];
        char l[160];
        snprintf(l, sizeof l, "%s %s", label, mode_name(mode));
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
        moe_layer_weights gcw = {NULL, gc, gc + wn, gc + 2 * wn, 0};
        float *dh1 = (float *)xmalloc(rows * f * 4), *dh3 = (float *)xmalloc(rows * f * 4);
        float *dxp_want = (float *)xmalloc(rows * d * 4);
        float *wscratch = (float *)xmalloc(moe_expert_ffn_wgrad_scratch_count(F.d, F.f, 1) * 4); /* leaf + sum */
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
    snprintf(l, sizeof l, "%s row-blocks vs per-expert", label);
    compare_runs(l, &F, &runs[MOE_EXPERT_GEMM_ROW_BLOCKS][0], &runs[MOE_EXPERT_GEMM_PER_EXPERT][0]);
    snprintf(l, sizeof l, "%s lt vs per-expert", label);
    compare_runs(l, &F, &runs[MOE_EXPERT_GEMM_LT][0], &runs[MOE_EXPERT_GEMM_PER_EXPERT][0]);

    for (int mode = 0; mode < NUM_MODES; mode++)
        for (int rep = 0; rep < 2; rep++) gpu_run_free(&runs[mode][rep]);
    moe_gemm_rows_plan_free(&plan);
    free(w1), free(w3), free(w2), free(xpb), free(dyb), free(xp), free(dy), free(F.grads0);
    free(h1), free(h3), free(act), free(y), free(h13_want);
    void *dev[] = {d_w, F.wb.w13, F.wb.w2, F.xp, F.dy, F.h13, F.act, F.y, F.dh13, F.dact, F.dxp, F.grads, F.wscratch};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) test_gpu_free(gpu, dev[i]);
}

/* ---- row blocks: a row's bits whatever its expert's row count ---- */

/* One expert (d, f) over rows [first, end) of 150-row buffers in `mode`: the rows' h13, act, y and dxp (host, the
 * whole buffers, poisoned where not written). */
static void rows_run(moe_gpu *gpu, moe_expert_gemm_mode mode, const moe_expert_weights_bf16 *wb, int d, int f,
                     int rows, int first, int end, const moe_bf16 *xp, const moe_bf16 *dy, uint16_t *out[4]) {
    const size_t n13 = (size_t)rows * 2 * f, na = (size_t)rows * f, nd = (size_t)rows * d;
    moe_bf16 *h13 = (moe_bf16 *)test_gpu_alloc(gpu, n13 * 2), *act = (moe_bf16 *)test_gpu_alloc(gpu, na * 2);
    moe_bf16 *y = (moe_bf16 *)test_gpu_alloc(gpu, nd * 2), *dxp = (moe_bf16 *)test_gpu_alloc(gpu, nd * 2);
    moe_bf16 *dh13 = (moe_bf16 *)test_gpu_alloc(gpu, n13 * 2), *dact = (moe_bf16 *)test_gpu_alloc(gpu, na * 2);
    float *grads = (float *)test_gpu_alloc(gpu, 3 * (size_t)f * d * sizeof(float));
    float *wscratch = (float *)test_gpu_alloc(gpu, moe_expert_ffn_wgrad_scratch_count(d, f, 1) * sizeof(float));
    const int offset[2] = {first, end};
    moe_layer_weights g = {NULL, grads, grads + (size_t)f * d, grads + 2 * (size_t)f * d, 0};
    CHECK_OK(moe_expert_ffn_forward_cuda(gpu, mode, wb, 1, d, f, offset, xp, h13, act, y));
    CHECK_OK(moe_expert_ffn_backward_cuda(gpu, mode, wb, &g, 1, d, f, offset, 1, xp, h13, act, dy, dh13, dact, dxp,
                                          wscratch));
    const void *dev[4] = {h13, act, y, dxp};
    const size_t n[4] = {n13, na, nd, nd};
    for (int i = 0; i < 4; i++) {
        out[i] = (uint16_t *)xmalloc(n[i] * 2);
        test_gpu_download(gpu, out[i], dev[i], n[i] * 2);
    }
    void *all[] = {h13, act, y, dxp, dh13, dact, grads, wscratch};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) test_gpu_free(gpu, all[i]);
}

static void test_row_blocks(moe_gpu *gpu, int d, int f, moe_rng *rng) {
    const int rows = 150, part = 37; /* 150 = 2 blocks + 22 rows; 37 and 113: other paddings */
    const size_t wn = (size_t)f * d;
    uint16_t *xpb, *dyb;
    float *w = bf16_uniform(rng, 3 * wn, 0.2, NULL);
    float *xp = bf16_uniform(rng, (size_t)rows * d, 1.0, &xpb), *dy = bf16_uniform(rng, (size_t)rows * d, 1.0, &dyb);
    float *d_w = (float *)test_gpu_upload(gpu, w, 3 * wn * sizeof(float));
    moe_layer_weights dw = {NULL, d_w, d_w + wn, d_w + 2 * wn, 0};
    moe_expert_weights_bf16 wb = {(moe_bf16 *)test_gpu_alloc(gpu, 2 * wn * 2), (moe_bf16 *)test_gpu_alloc(gpu, wn * 2)};
    CHECK_OK(moe_expert_weights_to_bf16_cuda(gpu, &dw, 1, d, f, &wb));
    moe_bf16 *d_xp = (moe_bf16 *)test_gpu_upload(gpu, xpb, (size_t)rows * d * 2);
    moe_bf16 *d_dy = (moe_bf16 *)test_gpu_upload(gpu, dyb, (size_t)rows * d * 2);
    const char *names[4] = {"h13", "act", "y", "dxp"};
    const int width[4] = {2 * f, f, d, d};
    for (int mode = MOE_EXPERT_GEMM_PER_EXPERT; mode <= MOE_EXPERT_GEMM_LT; mode++) {
        uint16_t *whole[4], *head[4], *tail[4];
        rows_run(gpu, (moe_expert_gemm_mode)mode, &wb, d, f, rows, 0, rows, d_xp, d_dy, whole);
        rows_run(gpu, (moe_expert_gemm_mode)mode, &wb, d, f, rows, 0, part, d_xp, d_dy, head);
        rows_run(gpu, (moe_expert_gemm_mode)mode, &wb, d, f, rows, part, rows, d_xp, d_dy, tail);
        size_t differ = 0;
        for (int i = 0; i < 4; i++) {
            const size_t split = (size_t)part * width[i], n = (size_t)rows * width[i];
            const size_t bad =
                bits_differ16(whole[i], head[i], split) + bits_differ16(whole[i] + split, tail[i] + split, n - split);
            if (moe_expert_gemm_rows_invariant((moe_expert_gemm_mode)mode))
                CHECK(bad == 0, "%s (d %d, f %d): %s: %zu of %zu values of an expert's rows differ with its row count",
                      mode_name(mode), d, f, names[i], bad, n);
            differ += bad;
            free(whole[i]), free(head[i]), free(tail[i]);
        }
        printf("%-12s d %-3d f %-3d %zu values differ with the expert's row count (150 rows, or 37 + 113)\n",
               mode_name(mode), d, f, differ);
    }
    void *dev[] = {d_w, wb.w13, wb.w2, d_xp, d_dy};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) test_gpu_free(gpu, dev[i]);
    free(w), free(xp), free(dy), free(xpb), free(dyb);
}

/* ---- segments (expert_ffn.h's contract): per-segment products added in the fixed tree ---- */

enum { SEG_E = 4, SEG_D = 64, SEG_F = 96, SEG_MAX = 8 };

/* n bf16 values k / 8, k uniform in [-4, 4]: products k k' / 64 and their sums over d = 64 are exact in fp32 in
 * any order, so dA = dY W2 (and with it dh13) has the same bits whatever rows a call covers. */
static float *bf16_eighths(moe_rng *rng, size_t n, uint16_t **bits) {
    float *f = (float *)xmalloc(n * sizeof(float));
    uint16_t *b = (uint16_t *)xmalloc(n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++) {
        f[i] = (float)((int)(moe_rng_next(rng) % 9) - 4) / 8;
        b[i] = moe_bf16_from_float(f[i]);
    }
    *bits = b;
    return f;
}

/* The documented order, written independently of core/tree_schedule.c: tree over [lo, hi) (a power of two) */
static float tree_sum(float *const *leaf, int lo, int hi, size_t i) {
    if (hi - lo == 1) return leaf[lo][i];
    const int mid = lo + (hi - lo) / 2;
    const float left = tree_sum(leaf, lo, mid, i), right = tree_sum(leaf, mid, hi, i);
    return left + right;
}

/* g + the segments' sum: the tree when S is a power of two, else (((g + l0) + l1) + ...); in_order forces the
 * latter (the order the check must tell apart from the tree). */
static void host_segment_sum(float *const *leaf, int S, int in_order, const float *g0, size_t count, float *out) {
    const int tree = !(S & (S - 1)) && !in_order;
    for (size_t i = 0; i < count; i++) {
        float g = g0[i];
        if (tree) g = g + tree_sum(leaf, 0, S, i);
        else
            for (int s = 0; s < S; s++) g = g + leaf[s][i];
        out[i] = g;
    }
}

static size_t bits_differ(const float *a, const float *b, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += memcmp(&a[i], &b[i], sizeof(float)) != 0;
    return k;
}

/* Expert 2 has no rows, expert 3's rows are all in its last segment; with 3 or more segments, segment 1 of
 * experts 0 and 1 is empty, and with 8, expert 0's segment 6 too. */
static int segment_rows(int e, int s, int S, moe_rng *rng) {
    if (e == 2 || (e == 3 && s != S - 1) || (S > 2 && s == 1) || (S == 8 && e == 0 && s == 6)) return 0;
    return 1 + (int)(moe_rng_next(rng) % 40);
}

/* The backward with S segments (both modes) against (a) the host sum, in the documented order, of the products
 * of separate one-segment CUDA calls (bitwise, S > 1), (b) the CPU backward with the same segments (tolerance
 * rows), and shows (a) can fail: the in-order sum, and the one-product-per-expert call (segments = 1), differ
 * from it. Each separate call forms its leaf as the segmented call does, with beta 0: it is a two-segment call
 * (the segment, then an empty one) onto zero gradients, whose tree gives 0 + (leaf + 0) = the leaf exactly. (A
 * one-segment call would be one beta-1 product onto zeros, for which cuBLAS may choose another kernel or split
 * than for beta 0 at the same shape: other bits, not an error.) */
static void test_segments(moe_gpu *gpu, int S, moe_rng *rng) {
    const int E = SEG_E, d = SEG_D, f = SEG_F;
    const size_t wc = (size_t)d * f, wn = E * wc;
    int seg[SEG_E * SEG_MAX + 1], off[SEG_E + 1];
    seg[0] = 0;
    for (int e = 0; e < E; e++)
        for (int s = 0; s < S; s++) seg[e * S + s + 1] = seg[e * S + s] + segment_rows(e, s, S, rng);
    for (int e = 0; e <= E; e++) off[e] = seg[e * S];
    const size_t rows = seg[E * S];
    char label[64];
    snprintf(label, sizeof label, "segments=%d rows=%zu", S, rows);

    uint16_t *w1b, *w3b, *w2b, *xpb, *dyb, *h13b, *actb;
    float *w1 = bf16_uniform(rng, wn, sqrt(3.0 / d), &w1b), *w3 = bf16_uniform(rng, wn, sqrt(3.0 / d), &w3b);
    float *w2 = bf16_eighths(rng, wn, &w2b), *dy = bf16_eighths(rng, rows * d, &dyb);
    float *xp = bf16_uniform(rng, rows * d, 1.0, &xpb), *h13 = bf16_uniform(rng, rows * 2 * f, 2.0, &h13b);
    float *act = bf16_uniform(rng, rows * f, 1.0, &actb);
    float *grads0 = test_alloc_uniform(rng, 3 * wn, 1.0); /* [w1 | w3 | w2] */
    uint16_t *w13b = (uint16_t *)xmalloc(2 * wn * 2);
    for (size_t e = 0; e < (size_t)E; e++) {
        memcpy(w13b + e * 2 * wc, w1b + e * wc, wc * 2);
        memcpy(w13b + e * 2 * wc + wc, w3b + e * wc, wc * 2);
    }
    moe_expert_weights_bf16 wb = {(moe_bf16 *)test_gpu_upload(gpu, w13b, 2 * wn * 2),
                                  (moe_bf16 *)test_gpu_upload(gpu, w2b, wn * 2)};
    test_gpu_poison(gpu, wb.w13 + 2 * 2 * wc, 2 * wc * 2); /* expert 2 has no rows: NaN weights must not be read */
    test_gpu_poison(gpu, wb.w2 + 2 * wc, wc * 2);
    moe_bf16 *d_xp = (moe_bf16 *)test_gpu_upload(gpu, xpb, rows * d * 2);
    moe_bf16 *d_dy = (moe_bf16 *)test_gpu_upload(gpu, dyb, rows * d * 2);
    moe_bf16 *d_h13 = (moe_bf16 *)test_gpu_upload(gpu, h13b, rows * 2 * f * 2);
    moe_bf16 *d_act = (moe_bf16 *)test_gpu_upload(gpu, actb, rows * f * 2);
    moe_bf16 *d_dh13 = (moe_bf16 *)test_gpu_alloc(gpu, rows * 2 * f * 2);
    moe_bf16 *d_dact = (moe_bf16 *)test_gpu_alloc(gpu, rows * f * 2);
    moe_bf16 *d_dxp = (moe_bf16 *)test_gpu_alloc(gpu, rows * d * 2);
    float *d_grads = (float *)test_gpu_alloc(gpu, 3 * wn * sizeof(float));
    float *d_scratch = (float *)test_gpu_alloc(gpu, moe_expert_ffn_wgrad_scratch_count(d, f, S) * sizeof(float));
    moe_layer_weights g = {NULL, d_grads, d_grads + wn, d_grads + 2 * wn, 0};

    if (S > 1) /* more than one segment needs the scratch */
        CHECK(moe_expert_ffn_backward_cuda(gpu, MOE_EXPERT_GEMM_PER_EXPERT, &wb, &g, E, d, f, seg, S, d_xp, d_h13,
                                           d_act, d_dy, d_dh13, d_dact, d_dxp, NULL) == MOE_ERR_INVALID_ARG,
              "%s: no scratch accepted", label);

    /* the segmented backward, both modes; and one product per expert (the order the segments replace) */
    float *got[2], *one_product = (float *)xmalloc(3 * wn * 4);
    uint16_t *dxp_got = (uint16_t *)xmalloc(rows * d * 2 + 2);
    for (int mode = 0; mode < 3; mode++) {
        const int segmented = mode < 2;
        CHECK_OK(moe_gpu_upload(gpu, d_grads, grads0, 3 * wn * sizeof(float)));
        test_gpu_poison(gpu, d_scratch, moe_expert_ffn_wgrad_scratch_count(d, f, S) * sizeof(float));
        CHECK_OK(moe_expert_ffn_backward_cuda(gpu, segmented ? (moe_expert_gemm_mode)mode : MOE_EXPERT_GEMM_PER_EXPERT,
                                              &wb, &g, E, d, f, segmented ? seg : off, segmented ? S : 1, d_xp, d_h13,
                                              d_act, d_dy, d_dh13, d_dact, d_dxp, d_scratch));
        float *out = segmented ? (got[mode] = (float *)xmalloc(3 * wn * 4)) : one_product;
        test_gpu_download(gpu, out, d_grads, 3 * wn * 4);
        if (mode == MOE_EXPERT_GEMM_PER_EXPERT) test_gpu_download(gpu, dxp_got, d_dxp, rows * d * 2);
    }

    /* (a) each segment's product alone: a one-expert, one-segment call from zero gradients */
    float *want = (float *)xmalloc(3 * wn * 4), *in_order = (float *)xmalloc(3 * wn * 4);
    memcpy(want, grads0, 3 * wn * 4), memcpy(in_order, grads0, 3 * wn * 4);
    float *leaf_store = (float *)xmalloc((size_t)S * 3 * wc * 4), *leaf[3][SEG_MAX];
    float *d_leaf = (float *)test_gpu_alloc(gpu, 3 * wc * sizeof(float));
    float *d_leaf_scratch = (float *)test_gpu_alloc(gpu, moe_expert_ffn_wgrad_scratch_count(d, f, 2) * sizeof(float));
    moe_layer_weights gl = {NULL, d_leaf, d_leaf + wc, d_leaf + 2 * wc, 0};
    for (int e = 0; e < E; e++) {
        if (off[e + 1] == off[e]) continue; /* an expert without rows keeps its gradients */
        moe_expert_weights_bf16 we = {wb.w13 + (size_t)e * 2 * wc, wb.w2 + (size_t)e * wc};
        for (int s = 0; s < S; s++) {
            float *l = leaf_store + (size_t)s * 3 * wc;
            for (int b = 0; b < 3; b++) leaf[b][s] = l + b * wc;
            const int *range = seg + e * S + s;
            if (range[1] == range[0]) { /* an empty segment's product is zero */
                memset(l, 0, 3 * wc * 4);
                continue;
            }
            const int leaf_then_empty[3] = {range[0], range[1], range[1]};
            CHECK_OK(moe_gpu_zero(gpu, d_leaf, 3 * wc * sizeof(float)));
            CHECK_OK(moe_expert_ffn_backward_cuda(gpu, MOE_EXPERT_GEMM_PER_EXPERT, &we, &gl, 1, d, f, leaf_then_empty, 2,
                                                  d_xp, d_h13, d_act, d_dy, d_dh13, d_dact, d_dxp, d_leaf_scratch));
            test_gpu_download(gpu, l, d_leaf, 3 * wc * 4);
        }
        for (int b = 0; b < 3; b++) {
            const size_t o = b * wn + e * wc;
            host_segment_sum(leaf[b], S, 0, grads0 + o, wc, want + o);
            host_segment_sum(leaf[b], S, 1, grads0 + o, wc, in_order + o);
        }
    }
    /* one segment is the single beta-1 product, whose epilogue (g + the sum, or split-K partials added into g)
     * is cuBLAS's: not a sum this test writes down */
    for (int mode = 0; mode < 2 && S > 1; mode++) {
        const size_t bad = bits_differ(got[mode], want, 3 * wn);
        CHECK(bad == 0, "%s %s: %zu of %zu gradient values differ from the documented sum of the segments' products",
              label, mode == MOE_EXPERT_GEMM_GROUPED ? "grouped" : "per-expert", bad, 3 * wn);
    }
    const size_t tree_vs_order = bits_differ(want, in_order, 3 * wn);
    const size_t tree_vs_one = bits_differ(want, one_product, 3 * wn);
    if (S == 2 || S == 4 || S == 8) /* else the documented order is the segment order */
        CHECK(tree_vs_order > 0, "%s: the tree and the in-order sum agree everywhere: the bitwise check is blind",
              label);
    if (S > 1)
        CHECK(tree_vs_one > 0, "%s: one product per expert gives the segments' sum: the bitwise check is blind", label);
    printf("%-40s %s; differ from that sum: in order %zu, one product %zu\n", label,
           S > 1 ? "checked against the tree of one-segment calls" : "one product", tree_vs_order, tree_vs_one);

    /* (b) the CPU backward with the same segments on the same bf16 values */
    moe_gemm_rows_plan plan;
    CHECK_OK(moe_gemm_rows_plan_init(&plan, 0, 0, f));
    float *h1 = (float *)xmalloc(rows * f * 4 + 4), *h3 = (float *)xmalloc(rows * f * 4 + 4);
    for (size_t r = 0; r < rows; r++) {
        memcpy(h1 + r * f, h13 + r * 2 * f, f * 4);
        memcpy(h3 + r * f, h13 + r * 2 * f + f, f * 4);
    }
    float *gc = (float *)xmalloc(3 * wn * 4), *dh1 = (float *)xmalloc(rows * f * 4 + 4);
    float *dh3 = (float *)xmalloc(rows * f * 4 + 4), *dxp_want = (float *)xmalloc(rows * d * 4 + 4);
    float *wscratch = (float *)xmalloc(moe_expert_ffn_wgrad_scratch_count(d, f, S) * 4);
    memcpy(gc, grads0, 3 * wn * 4);
    moe_layer_weights wcpu = {NULL, w1, w3, w2, 0}, gcw = {NULL, gc, gc + wn, gc + 2 * wn, 0};
    CHECK_OK(moe_expert_ffn_backward_cpu(&wcpu, &gcw, E, d, f, seg, S, xp, h1, h3, act, dy, dh1, dh3, dxp_want,
                                         wscratch, &plan));
    float *dxpg = to_float(dxp_got, rows * d);
    test_tolerance_check("expert_ffn dxp", "bf16", dxpg, dxp_want, rows * d, "%s", label);
    const char *gops[] = {"expert_ffn dW1", "expert_ffn dW3", "expert_ffn dW2"};
    fixture F; /* for increment() */
    memset(&F, 0, sizeof F);
    F.E = E, F.wcount = wc, F.grads0 = grads0;
    for (int b = 0; b < 3; b++) {
        float *gi = increment(&F, got[MOE_EXPERT_GEMM_PER_EXPERT], b), *wi = increment(&F, gc, b);
        test_tolerance_check(gops[b], "bf16", gi, wi, wn, "%s", label);
        free(gi), free(wi);
    }
    size_t moved = 0; /* expert 2 (no rows): gradients bitwise unchanged */
    for (int mode = 0; mode < 2; mode++)
        for (int b = 0; b < 3; b++) moved += bits_differ(got[mode] + b * wn + 2 * wc, grads0 + b * wn + 2 * wc, wc);
    CHECK(moved == 0, "%s: gradients of the expert without rows changed (%zu values)", label, moved);

    moe_gemm_rows_plan_free(&plan);
    free(w1b), free(w3b), free(w2b), free(xpb), free(dyb), free(h13b), free(actb), free(w13b);
    free(w1), free(w3), free(w2), free(dy), free(xp), free(h13), free(act), free(grads0);
    free(got[0]), free(got[1]), free(one_product), free(dxp_got), free(want), free(in_order), free(leaf_store);
    free(h1), free(h3), free(gc), free(dh1), free(dh3), free(dxp_want), free(wscratch), free(dxpg);
    void *dev[] = {wb.w13, wb.w2, d_xp, d_dy, d_h13, d_act, d_dh13, d_dact, d_dxp, d_grads, d_scratch, d_leaf,
                   d_leaf_scratch};
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
        {2, 60, 52, {9, 70}}, /* widths not multiples of 8: LT mode's row-block fallback, grouped's per-expert */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) test_experts(gpu, &cases[i], &rng);
    test_row_blocks(gpu, 64, 96, &rng);
    test_row_blocks(gpu, 60, 52, &rng);
    const int segments[] = {1, 2, 3, 4, 8};
    for (size_t i = 0; i < sizeof segments / sizeof segments[0]; i++) test_segments(gpu, segments[i], &rng);
    moe_gpu_destroy(gpu);
    return test_finish("test_gpu_experts");
}
