/* test_gpu_router.cu — the router's CUDA ops against their CPU versions (the oracle): logits and their
 * backward GEMMs, scores, gates, aux losses within the "router ..." rows (f32) of tests/test_tolerance.c;
 * the dispatch layout (slot, perm_token, counts, offsets) exactly. Every op also runs twice on the same
 * inputs and must give the same bits. With the layer's plan of fixed row blocks, a token's logits and input gradient
 * are the same bits whatever the number of tokens in the call.
 * Outputs are poisoned (0xFF) before each run; accumulating ops restart from the same initial values.
 * Exit 77 (skip) when no GPU is present. Run: meson test -C build --suite gpu */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "router/aux_loss.h"
#include "router/gates.h"
#include "router/layout.h"
#include "router/routing.h"
#include "tests/test_routing.h"
#include "router/scores.h"
#include "router/topk.h"
#include "tests/test_gpu_util.h"
#include "tests/test_tolerance.h"
}

static void *host_alloc(size_t nbytes) {
    void *p = malloc(nbytes ? nbytes : 1);
    if (!p) {
        fprintf(stderr, "test_gpu_router: out of memory\n");
        exit(1);
    }
    return p;
}

static float *host_copy(const float *a, size_t count) {
    float *b = (float *)host_alloc(count * sizeof(float));
    memcpy(b, a, count * sizeof(float));
    return b;
}

static void check_same_bits(const char *op, const char *shape, const void *a, const void *b, size_t nbytes) {
    CHECK(memcmp(a, b, nbytes) == 0, "%s %s: two runs on the same inputs differ", op, shape);
}

/* softmax or sigmoid scores of random logits (scale 3), on the host */
static float *random_scores(moe_rng *rng, moe_score_func func, int T, int E, float **logits_out) {
    float *logits = test_alloc_uniform(rng, (size_t)T * E, 3.0);
    float *scores = (float *)host_alloc((size_t)T * E * sizeof(float));
    moe_router_scores_cpu(func, logits, T, E, scores);
    if (logits_out)
        *logits_out = logits;
    else
        free(logits);
    return scores;
}

static void test_logits(moe_gpu *gpu, moe_rng *rng, int T, int d, int E) {
    char shape[64];
    snprintf(shape, sizeof shape, "T=%d d=%d E=%d", T, d, E);
    size_t te = (size_t)T * E;
    float *x = test_alloc_uniform(rng, (size_t)T * d, 1.0);
    float *w = test_alloc_uniform(rng, (size_t)E * d, 1 / sqrt((double)d));
    float *want = (float *)host_alloc(te * sizeof(float)), *got[2];
    moe_gemm_rows_plan plan;
    CHECK_OK(moe_gemm_rows_plan_init(&plan, 0, 0, d > E ? d : E));
    CHECK_OK(moe_router_logits_cpu(&plan, x, w, T, d, E, want));
    moe_gemm_rows_plan_free(&plan);
    float *d_x = (float *)test_gpu_upload(gpu, x, (size_t)T * d * sizeof(float));
    float *d_w = (float *)test_gpu_upload(gpu, w, (size_t)E * d * sizeof(float));
    float *d_logits = (float *)test_gpu_alloc(gpu, te * sizeof(float));
    for (int run = 0; run < 2; run++) {
        test_gpu_poison(gpu, d_logits, te * sizeof(float));
        CHECK_OK(moe_router_logits_cuda(gpu, NULL, d_x, d_w, T, d, E, d_logits, NULL));
        got[run] = (float *)host_alloc(te * sizeof(float));
        test_gpu_download(gpu, got[run], d_logits, te * sizeof(float));
    }
    test_tolerance_check("router logits", "f32", got[0], want, te, "logits %s", shape);
    check_same_bits("logits", shape, got[0], got[1], te * sizeof(float));

    /* a non-finite input gives MOE_ERR_NONFINITE, as on the CPU */
    x[(size_t)(T / 2) * d + d / 3] = INFINITY;
    CHECK_OK(moe_gpu_upload(gpu, d_x, x, (size_t)T * d * sizeof(float)));
    moe_status st = moe_router_logits_cuda(gpu, NULL, d_x, d_w, T, d, E, d_logits, NULL);
    CHECK(st == MOE_ERR_NONFINITE, "logits %s with an Inf in x: %s", shape, moe_status_string(st));
    /* the asynchronous form: the flag lands in pinned host memory at the next synchronisation */
    int *flag = NULL;
    CHECK_OK(moe_gpu_host_alloc(gpu, sizeof(int), (void **)&flag));
    CHECK_OK(moe_router_logits_cuda(gpu, NULL, d_x, d_w, T, d, E, d_logits, flag));
    CHECK_OK(moe_gpu_synchronize(gpu));
    CHECK(*flag != 0, "logits %s with an Inf in x: the asynchronous flag stayed 0", shape);
    x[(size_t)(T / 2) * d + d / 3] = 0.5f;
    w[(size_t)(E - 1) * d] = NAN;
    CHECK_OK(moe_gpu_upload(gpu, d_x, x, (size_t)T * d * sizeof(float)));
    CHECK_OK(moe_gpu_upload(gpu, d_w, w, (size_t)E * d * sizeof(float)));
    st = moe_router_logits_cuda(gpu, NULL, d_x, d_w, T, d, E, d_logits, NULL);
    CHECK(st == MOE_ERR_NONFINITE, "logits %s with a NaN in router_w: %s", shape, moe_status_string(st));
    x[(size_t)(T / 2) * d + d / 3] = 0.5f, w[(size_t)(E - 1) * d] = 0.25f; /* finite again: the flag must clear */
    CHECK_OK(moe_gpu_upload(gpu, d_x, x, (size_t)T * d * sizeof(float)));
    CHECK_OK(moe_gpu_upload(gpu, d_w, w, (size_t)E * d * sizeof(float)));
    CHECK_OK(moe_router_logits_cuda(gpu, NULL, d_x, d_w, T, d, E, d_logits, flag));
    CHECK_OK(moe_gpu_synchronize(gpu));
    CHECK(*flag == 0, "logits %s, all finite: the asynchronous flag is %d", shape, *flag);
    moe_gpu_host_free(gpu, flag);

    test_gpu_free(gpu, d_x), test_gpu_free(gpu, d_w), test_gpu_free(gpu, d_logits);
    free(x), free(w), free(want), free(got[0]), free(got[1]);
}

/* Fixed row blocks (layout invariance, the layer's plan): a token's logits and its dx have the same bits whether the
 * call has 150 tokens or only a part of them (the first 37, or the 113 after them), and match the CPU. */
static void test_logits_row_blocks(moe_gpu *gpu, moe_rng *rng, int d, int E) {
    enum { T = 150, PART = 37 };
    char shape[64];
    snprintf(shape, sizeof shape, "row blocks, d=%d E=%d", d, E);
    const size_t te = (size_t)T * E, td = (size_t)T * d;
    float *x = test_alloc_uniform(rng, td, 1.0), *w = test_alloc_uniform(rng, (size_t)E * d, 1 / sqrt((double)d));
    float *dl = test_alloc_uniform(rng, te, 0.1), *dx0 = test_alloc_uniform(rng, td, 1.0);
    float *want = (float *)host_alloc(te * sizeof(float));
    moe_gemm_rows_plan cpu_plan;
    CHECK_OK(moe_gemm_rows_plan_init(&cpu_plan, 1, 0, d > E ? d : E));
    CHECK_OK(moe_router_logits_cpu(&cpu_plan, x, w, T, d, E, want));
    moe_gemm_rows_plan_free(&cpu_plan);
    moe_linear_plan plan;
    CHECK_OK(moe_linear_plan_init(gpu, MOE_LINEAR_SGEMM, 1, 0, d > E ? d : E, &plan));
    float *d_x = (float *)test_gpu_upload(gpu, x, td * sizeof(float));
    float *d_w = (float *)test_gpu_upload(gpu, w, (size_t)E * d * sizeof(float));
    float *d_dl = (float *)test_gpu_upload(gpu, dl, te * sizeof(float));
    float *d_logits = (float *)test_gpu_alloc(gpu, te * sizeof(float));
    float *d_dx = (float *)test_gpu_alloc(gpu, td * sizeof(float));
    float *logits[2], *dx[2]; /* [0]: one call of T tokens; [1]: a call of PART, then one of T - PART */
    for (int split = 0; split < 2; split++) {
        test_gpu_poison(gpu, d_logits, te * sizeof(float));
        CHECK_OK(moe_gpu_upload(gpu, d_dx, dx0, td * sizeof(float)));
        const int first[2] = {0, PART}, count[2] = {split ? PART : T, T - PART};
        for (int c = 0; c < 1 + split; c++) {
            const size_t t0 = (size_t)first[c];
            CHECK_OK(moe_router_logits_cuda(gpu, &plan, d_x + t0 * d, d_w, count[c], d, E, d_logits + t0 * E, NULL));
            CHECK_OK(moe_router_logits_backward_cuda(gpu, &plan, d_x + t0 * d, d_w, d_dl + t0 * E, count[c], d, E,
                                                     NULL, d_dx + t0 * d));
        }
        logits[split] = (float *)host_alloc(te * sizeof(float)), dx[split] = (float *)host_alloc(td * sizeof(float));
        test_gpu_download(gpu, logits[split], d_logits, te * sizeof(float));
        test_gpu_download(gpu, dx[split], d_dx, td * sizeof(float));
    }
    test_tolerance_check("router logits", "f32", logits[0], want, te, "logits %s", shape);
    CHECK(!memcmp(logits[0], logits[1], te * sizeof(float)), "logits %s: 37 + 113 tokens differ from 150 in one call",
          shape);
    CHECK(!memcmp(dx[0], dx[1], td * sizeof(float)), "dx %s: 37 + 113 tokens differ from 150 in one call", shape);
    moe_linear_plan_free(gpu, &plan);
    test_gpu_free(gpu, d_x), test_gpu_free(gpu, d_w), test_gpu_free(gpu, d_dl), test_gpu_free(gpu, d_logits);
    test_gpu_free(gpu, d_dx);
    for (int i = 0; i < 2; i++) free(logits[i]), free(dx[i]);
    free(x), free(w), free(dl), free(dx0), free(want);
}

/* dWr += dlogits^T x and dx += dlogits Wr against a double-precision loop */
static void test_logits_backward(moe_gpu *gpu, moe_rng *rng, int T, int d, int E, int with_dx) {
    char shape[64];
    snprintf(shape, sizeof shape, "T=%d d=%d E=%d%s", T, d, E, with_dx ? "" : " dx=NULL");
    size_t td = (size_t)T * d, ed = (size_t)E * d;
    float *x = test_alloc_uniform(rng, td, 1.0), *w = test_alloc_uniform(rng, ed, 1 / sqrt((double)d));
    float *dl = test_alloc_uniform(rng, (size_t)T * E, 0.1);
    float *dw0 = test_alloc_uniform(rng, ed, 1.0), *dx0 = test_alloc_uniform(rng, td, 1.0);
    float *want_dw = host_copy(dw0, ed), *want_dx = host_copy(dx0, td);
    for (int e = 0; e < E; e++)
        for (int i = 0; i < d; i++) {
            double sum = 0;
            for (int t = 0; t < T; t++) sum += (double)dl[(size_t)t * E + e] * x[(size_t)t * d + i];
            want_dw[(size_t)e * d + i] = (float)(dw0[(size_t)e * d + i] + sum);
        }
    for (int t = 0; t < T; t++)
        for (int i = 0; i < d; i++) {
            double sum = 0;
            for (int e = 0; e < E; e++) sum += (double)dl[(size_t)t * E + e] * w[(size_t)e * d + i];
            want_dx[(size_t)t * d + i] = (float)(dx0[(size_t)t * d + i] + sum);
        }
    float *d_x = (float *)test_gpu_upload(gpu, x, td * sizeof(float));
    float *d_w = (float *)test_gpu_upload(gpu, w, ed * sizeof(float));
    float *d_dl = (float *)test_gpu_upload(gpu, dl, (size_t)T * E * sizeof(float));
    float *d_dw = (float *)test_gpu_alloc(gpu, ed * sizeof(float));
    float *d_dx = (float *)test_gpu_alloc(gpu, td * sizeof(float));
    float *got_dw[2], *got_dx[2];
    for (int run = 0; run < 2; run++) {
        CHECK_OK(moe_gpu_upload(gpu, d_dw, dw0, ed * sizeof(float)));
        CHECK_OK(moe_gpu_upload(gpu, d_dx, dx0, td * sizeof(float)));
        CHECK_OK(moe_router_logits_backward_cuda(gpu, NULL, d_x, d_w, d_dl, T, d, E, d_dw, with_dx ? d_dx : NULL));
        got_dw[run] = (float *)host_alloc(ed * sizeof(float));
        got_dx[run] = (float *)host_alloc(td * sizeof(float));
        test_gpu_download(gpu, got_dw[run], d_dw, ed * sizeof(float));
        test_gpu_download(gpu, got_dx[run], d_dx, td * sizeof(float));
    }
    test_tolerance_check("router logits backward", "f32", got_dw[0], want_dw, ed, "drouter_w %s", shape);
    check_same_bits("drouter_w", shape, got_dw[0], got_dw[1], ed * sizeof(float));
    if (with_dx) {
        test_tolerance_check("router logits backward", "f32", got_dx[0], want_dx, td, "dx %s", shape);
        check_same_bits("dx", shape, got_dx[0], got_dx[1], td * sizeof(float));
    } else {
        CHECK(memcmp(got_dx[0], dx0, td * sizeof(float)) == 0, "dx %s: written although NULL was passed", shape);
    }
    test_gpu_free(gpu, d_x), test_gpu_free(gpu, d_w), test_gpu_free(gpu, d_dl);
    test_gpu_free(gpu, d_dw), test_gpu_free(gpu, d_dx);
    free(x), free(w), free(dl), free(dw0), free(dx0), free(want_dw), free(want_dx);
    for (int run = 0; run < 2; run++) free(got_dw[run]), free(got_dx[run]);
}

static void test_scores(moe_gpu *gpu, moe_rng *rng, moe_score_func func, int with_bias, int T, int E) {
    char shape[64];
    snprintf(shape, sizeof shape, "%s%s T=%d E=%d", func == MOE_SCORE_SIGMOID ? "sigmoid" : "softmax",
             with_bias ? "+bias" : "", T, E);
    size_t te = (size_t)T * E, nbytes = te * sizeof(float);
    float *logits = test_alloc_uniform(rng, te, 4.0), *bias = test_alloc_uniform(rng, E, 0.1);
    float *want = (float *)host_alloc(nbytes), *want_select = (float *)host_alloc(nbytes);
    moe_router_scores_cpu(func, logits, T, E, want);
    for (size_t i = 0; i < te; i++) want_select[i] = want[i] + bias[i % E]; /* as moe/layer.c */
    float *d_logits = (float *)test_gpu_upload(gpu, logits, nbytes);
    float *d_bias = (float *)test_gpu_upload(gpu, bias, E * sizeof(float));
    float *d_scores = (float *)test_gpu_alloc(gpu, nbytes), *d_select = (float *)test_gpu_alloc(gpu, nbytes);
    float *got[2], *got_select[2];
    for (int run = 0; run < 2; run++) {
        test_gpu_poison(gpu, d_scores, nbytes), test_gpu_poison(gpu, d_select, nbytes);
        CHECK_OK(moe_router_scores_cuda(gpu, func, d_logits, with_bias ? d_bias : NULL, T, E, d_scores,
                                    with_bias ? d_select : NULL));
        got[run] = (float *)host_alloc(nbytes), got_select[run] = (float *)host_alloc(nbytes);
        test_gpu_download(gpu, got[run], d_scores, nbytes);
        test_gpu_download(gpu, got_select[run], d_select, nbytes);
    }
    test_tolerance_check("router scores", "f32", got[0], want, te, "scores %s", shape);
    check_same_bits("scores", shape, got[0], got[1], nbytes);
    if (with_bias) {
        test_tolerance_check("router scores", "f32", got_select[0], want_select, te, "select_scores %s", shape);
        check_same_bits("select_scores", shape, got_select[0], got_select[1], nbytes);
    }

    /* backward from random dscores through these scores (the CPU's, the same input for both) */
    float *dscores = test_alloc_uniform(rng, te, 1.0), *want_dl = (float *)host_alloc(nbytes), *got_dl[2];
    moe_router_scores_backward_cpu(func, want, dscores, T, E, want_dl);
    CHECK_OK(moe_gpu_upload(gpu, d_scores, want, nbytes));
    float *d_dscores = (float *)test_gpu_upload(gpu, dscores, nbytes), *d_dl = (float *)test_gpu_alloc(gpu, nbytes);
    for (int run = 0; run < 2; run++) {
        test_gpu_poison(gpu, d_dl, nbytes);
        CHECK_OK(moe_router_scores_backward_cuda(gpu, func, d_scores, d_dscores, T, E, d_dl));
        got_dl[run] = (float *)host_alloc(nbytes);
        test_gpu_download(gpu, got_dl[run], d_dl, nbytes);
    }
    test_tolerance_check("router scores backward", "f32", got_dl[0], want_dl, te, "dlogits %s", shape);
    check_same_bits("scores backward", shape, got_dl[0], got_dl[1], nbytes);

    test_gpu_free(gpu, d_logits), test_gpu_free(gpu, d_bias), test_gpu_free(gpu, d_scores);
    test_gpu_free(gpu, d_select), test_gpu_free(gpu, d_dscores), test_gpu_free(gpu, d_dl);
    free(logits), free(bias), free(want), free(want_select), free(dscores), free(want_dl);
    for (int run = 0; run < 2; run++) free(got[run]), free(got_select[run]), free(got_dl[run]);
}

/* zeroed: every other token's scores all 0 (sigmoid scores underflowed, chosen by a selection bias): the gates' sum
 * + 1e-20 gives gates of 0 and finite gradients on both sides (router/gates_cpu.c's renormalizer) */
static void test_gates(moe_gpu *gpu, moe_rng *rng, int T, int E, int k, int renormalize, float scale, int zeroed) {
    char shape[96];
    snprintf(shape, sizeof shape, "T=%d E=%d k=%d renormalize=%d scale=%g zeroed=%d", T, E, k, renormalize, scale,
             zeroed);
    size_t te = (size_t)T * E, tk = (size_t)T * k;
    float *scores = random_scores(rng, MOE_SCORE_SOFTMAX, T, E, NULL);
    for (int t = 0; zeroed && t < T; t += 2) memset(scores + (size_t)t * E, 0, (size_t)E * sizeof(float));
    int *expert = (int *)host_alloc(tk * sizeof(int));
    moe_router_topk_cpu(scores, T, E, k, expert);
    float *want_es = (float *)host_alloc(tk * sizeof(float)), *want_gate = (float *)host_alloc(tk * sizeof(float));
    moe_router_gates_cpu(scores, expert, T, E, k, renormalize, scale, want_es, want_gate);
    float *d_scores = (float *)test_gpu_upload(gpu, scores, te * sizeof(float));
    int *d_expert = (int *)test_gpu_upload(gpu, expert, tk * sizeof(int));
    float *d_es = (float *)test_gpu_alloc(gpu, tk * sizeof(float));
    float *d_gate = (float *)test_gpu_alloc(gpu, tk * sizeof(float));
    float *got_es[2], *got_gate[2];
    for (int run = 0; run < 2; run++) {
        test_gpu_poison(gpu, d_es, tk * sizeof(float)), test_gpu_poison(gpu, d_gate, tk * sizeof(float));
        CHECK_OK(moe_router_gates_cuda(gpu, d_scores, d_expert, T, E, k, renormalize, scale, d_es, d_gate));
        got_es[run] = (float *)host_alloc(tk * sizeof(float)), got_gate[run] = (float *)host_alloc(tk * sizeof(float));
        test_gpu_download(gpu, got_es[run], d_es, tk * sizeof(float));
        test_gpu_download(gpu, got_gate[run], d_gate, tk * sizeof(float));
    }
    test_tolerance_check("router gates", "f32", got_es[0], want_es, tk, "expert_score %s", shape);
    test_tolerance_check("router gates", "f32", got_gate[0], want_gate, tk, "gate %s", shape);
    check_same_bits("expert_score", shape, got_es[0], got_es[1], tk * sizeof(float));
    check_same_bits("gate", shape, got_gate[0], got_gate[1], tk * sizeof(float));

    /* backward: accumulates into random dscores */
    float *dgate = test_alloc_uniform(rng, tk, 1.0), *ds0 = test_alloc_uniform(rng, te, 1.0);
    float *want_ds = host_copy(ds0, te), *got_ds[2];
    moe_router_gates_backward_cpu(scores, expert, dgate, T, E, k, renormalize, scale, want_ds);
    float *d_dgate = (float *)test_gpu_upload(gpu, dgate, tk * sizeof(float));
    float *d_ds = (float *)test_gpu_alloc(gpu, te * sizeof(float));
    for (int run = 0; run < 2; run++) {
        CHECK_OK(moe_gpu_upload(gpu, d_ds, ds0, te * sizeof(float)));
        CHECK_OK(moe_router_gates_backward_cuda(gpu, d_scores, d_expert, d_dgate, T, E, k, renormalize, scale, d_ds));
        got_ds[run] = (float *)host_alloc(te * sizeof(float));
        test_gpu_download(gpu, got_ds[run], d_ds, te * sizeof(float));
    }
    test_tolerance_check("router gates backward", "f32", got_ds[0], want_ds, te, "dscores %s", shape);
    for (size_t i = 0; i < tk; i++) CHECK(isfinite(got_gate[0][i]), "gate %zu is %g (%s)", i, got_gate[0][i], shape);
    for (size_t i = 0; i < te; i++) CHECK(isfinite(got_ds[0][i]), "dscores %zu is %g (%s)", i, got_ds[0][i], shape);
    check_same_bits("gates backward", shape, got_ds[0], got_ds[1], te * sizeof(float));

    test_gpu_free(gpu, d_scores), test_gpu_free(gpu, d_expert), test_gpu_free(gpu, d_es);
    test_gpu_free(gpu, d_gate), test_gpu_free(gpu, d_dgate), test_gpu_free(gpu, d_ds);
    free(scores), free(expert), free(want_es), free(want_gate), free(dgate), free(ds0), free(want_ds);
    for (int run = 0; run < 2; run++) free(got_es[run]), free(got_gate[run]), free(got_ds[run]);
}

/* This rank holds T of the T_global tokens; num_selected are global counts (here: this rank's times
 * T_global / T, any ints serve). */
static void test_losses(moe_gpu *gpu, moe_rng *rng, moe_score_func func, int T, int T_global, int E, int k) {
    char shape[80];
    snprintf(shape, sizeof shape, "%s T=%d T_global=%d E=%d k=%d", func == MOE_SCORE_SIGMOID ? "sigmoid" : "softmax",
             T, T_global, E, k);
    size_t te = (size_t)T * E, nbytes = te * sizeof(float);
    float *logits = NULL, *scores = random_scores(rng, func, T, E, &logits);
    int *expert = (int *)host_alloc((size_t)T * k * sizeof(int)), *num_selected = (int *)host_alloc(E * sizeof(int));
    moe_router_topk_cpu(scores, T, E, k, expert);
    memset(num_selected, 0, E * sizeof(int));
    for (size_t a = 0; a < (size_t)T * k; a++) num_selected[expert[a]] += T_global / T;
    double want[2] = {moe_router_load_balance_loss_cpu(func, scores, num_selected, T, T_global, E, k),
                      moe_router_z_loss_cpu(logits, T, T_global, E)};
    float *d_scores = (float *)test_gpu_upload(gpu, scores, nbytes);
    float *d_logits = (float *)test_gpu_upload(gpu, logits, nbytes);
    int *d_selected = (int *)test_gpu_upload(gpu, num_selected, E * sizeof(int));
    double got[2][2];
    for (int run = 0; run < 2; run++) {
        got[run][0] = got[run][1] = NAN;
        CHECK_OK(moe_router_losses_cuda(gpu, func, d_scores, d_logits, d_selected, T, T_global, E, k, got[run]));
    }
    test_tolerance_check_scalar("router load balance loss", "f32", got[0][0], want[0], "%s", shape);
    test_tolerance_check_scalar("router z loss", "f32", got[0][1], want[1], "%s", shape);
    check_same_bits("losses", shape, got[0], got[1], sizeof got[0]);

    /* backward: coef = T_global makes the gradients O(1); both accumulate into random arrays */
    float coef = (float)T_global;
    float *ds0 = test_alloc_uniform(rng, te, 1.0), *dl0 = test_alloc_uniform(rng, te, 1.0);
    float *want_ds = host_copy(ds0, te), *want_dl = host_copy(dl0, te), *got_ds[2], *got_dl[2];
    moe_router_load_balance_loss_backward_cpu(func, scores, num_selected, T, T_global, E, k, coef, want_ds);
    moe_router_z_loss_backward_cpu(logits, T, T_global, E, coef, want_dl);
    float *d_ds = (float *)test_gpu_alloc(gpu, nbytes), *d_dl = (float *)test_gpu_alloc(gpu, nbytes);
    for (int run = 0; run < 2; run++) {
        CHECK_OK(moe_gpu_upload(gpu, d_ds, ds0, nbytes));
        CHECK_OK(moe_gpu_upload(gpu, d_dl, dl0, nbytes));
        CHECK_OK(moe_router_load_balance_loss_backward_cuda(gpu, func, d_scores, d_selected, T, T_global, E, k, coef,
                                                        d_ds));
        CHECK_OK(moe_router_z_loss_backward_cuda(gpu, d_logits, T, T_global, E, coef, d_dl));
        got_ds[run] = (float *)host_alloc(nbytes), got_dl[run] = (float *)host_alloc(nbytes);
        test_gpu_download(gpu, got_ds[run], d_ds, nbytes);
        test_gpu_download(gpu, got_dl[run], d_dl, nbytes);
    }
    test_tolerance_check("router load balance backward", "f32", got_ds[0], want_ds, te, "dscores %s", shape);
    test_tolerance_check("router z-loss backward", "f32", got_dl[0], want_dl, te, "dlogits %s", shape);
    check_same_bits("load balance backward", shape, got_ds[0], got_ds[1], nbytes);
    check_same_bits("z-loss backward", shape, got_dl[0], got_dl[1], nbytes);

    test_gpu_free(gpu, d_scores), test_gpu_free(gpu, d_logits), test_gpu_free(gpu, d_selected);
    test_gpu_free(gpu, d_ds), test_gpu_free(gpu, d_dl);
    free(logits), free(scores), free(expert), free(num_selected), free(ds0), free(dl0), free(want_ds), free(want_dl);
    for (int run = 0; run < 2; run++) free(got_ds[run]), free(got_dl[run]);
}

/* Exact comparison of the layout. keep_fraction: each assignment kept with this probability (1 keeps all,
 * 0 drops all); expert `unused` (or -1) never chosen, so it receives zero rows. */
static void test_layout(moe_gpu *gpu, moe_rng *rng, int T, int E, int k, double keep_fraction, int unused) {
    char shape[80];
    snprintf(shape, sizeof shape, "T=%d E=%d k=%d keep=%.2f unused=%d", T, E, k, keep_fraction, unused);
    size_t tk = (size_t)T * k;
    float *scores = test_alloc_uniform(rng, (size_t)T * E, 1.0);
    if (unused >= 0)
        for (int t = 0; t < T; t++) scores[(size_t)t * E + unused] = -2.0f; /* below every other score */
    test_routing r;
    CHECK_OK(test_routing_alloc(&r, T, E, k, 1));
    r.num_tokens = T;
    moe_router_topk_cpu(scores, T, E, k, r.expert);
    for (size_t a = 0; a < tk; a++) r.kept[a] = (moe_rng_uniform(rng) + 1) / 2 < keep_fraction;
    test_routing_layout(&r);
    if (unused >= 0) CHECK(r.num_tokens_per_expert[unused] == 0, "%s: the unused expert received rows", shape);
    if (keep_fraction < 1) CHECK(r.num_dropped > 0, "%s: nothing was dropped", shape);

    int *d_expert = (int *)test_gpu_upload(gpu, r.expert, tk * sizeof(int));
    unsigned char *d_kept = (unsigned char *)test_gpu_upload(gpu, r.kept, tk);
    int *d_slot = (int *)test_gpu_alloc(gpu, tk * sizeof(int)), *d_perm = (int *)test_gpu_alloc(gpu, tk * sizeof(int));
    int *d_count = (int *)test_gpu_alloc(gpu, E * sizeof(int));
    int *d_offset = (int *)test_gpu_alloc(gpu, (E + 1) * sizeof(int));
    int *slot[2], *perm[2], *count[2], *offset[2], *count_host[2], *offset_host[2];
    for (int run = 0; run < 2; run++) {
        test_gpu_poison(gpu, d_slot, tk * sizeof(int)), test_gpu_poison(gpu, d_perm, tk * sizeof(int));
        test_gpu_poison(gpu, d_count, E * sizeof(int)), test_gpu_poison(gpu, d_offset, (E + 1) * sizeof(int));
        count_host[run] = (int *)host_alloc(E * sizeof(int));
        offset_host[run] = (int *)host_alloc((E + 1) * sizeof(int));
        memset(count_host[run], 0xFF, E * sizeof(int)), memset(offset_host[run], 0xFF, (E + 1) * sizeof(int));
        CHECK_OK(moe_router_dispatch_layout_cuda(gpu, d_expert, d_kept, T, E, k, d_slot, d_perm, d_count, d_offset,
                                                 count_host[run], offset_host[run]));
        CHECK_OK(moe_gpu_synchronize(gpu)); /* the host copies are queued */
        slot[run] = (int *)host_alloc(tk * sizeof(int)), perm[run] = (int *)host_alloc(tk * sizeof(int));
        count[run] = (int *)host_alloc(E * sizeof(int)), offset[run] = (int *)host_alloc((E + 1) * sizeof(int));
        test_gpu_download(gpu, slot[run], d_slot, tk * sizeof(int));
        test_gpu_download(gpu, perm[run], d_perm, tk * sizeof(int));
        test_gpu_download(gpu, count[run], d_count, E * sizeof(int));
        test_gpu_download(gpu, offset[run], d_offset, (E + 1) * sizeof(int));
    }
    size_t bad_slot = 0, bad_perm = 0, bad_count = 0, bad_offset = 0;
    for (size_t a = 0; a < tk; a++) bad_slot += slot[0][a] != r.slot[a];
    for (int row = 0; row < r.num_kept; row++) bad_perm += perm[0][row] != r.perm_token[row];
    for (int e = 0; e < E; e++)
        bad_count += (count[0][e] != r.num_tokens_per_expert[e]) + (count_host[0][e] != r.num_tokens_per_expert[e]);
    for (int e = 0; e <= E; e++)
        bad_offset += (offset[0][e] != r.expert_offset[e]) + (offset_host[0][e] != r.expert_offset[e]);
    printf("layout %-37s kept %d dropped %d: %zu slot, %zu perm_token, %zu count, %zu offset mismatches\n", shape,
           r.num_kept, r.num_dropped, bad_slot, bad_perm, bad_count, bad_offset);
    CHECK(bad_slot + bad_perm + bad_count + bad_offset == 0, "layout %s differs from the CPU", shape);
    check_same_bits("layout slot", shape, slot[0], slot[1], tk * sizeof(int));
    check_same_bits("layout perm_token", shape, perm[0], perm[1], (size_t)r.num_kept * sizeof(int));
    check_same_bits("layout counts", shape, count[0], count[1], E * sizeof(int));
    check_same_bits("layout offsets", shape, offset[0], offset[1], (E + 1) * sizeof(int));

    test_gpu_free(gpu, d_expert), test_gpu_free(gpu, d_kept), test_gpu_free(gpu, d_slot);
    test_gpu_free(gpu, d_perm), test_gpu_free(gpu, d_count), test_gpu_free(gpu, d_offset);
    for (int run = 0; run < 2; run++)
        free(slot[run]), free(perm[run]), free(count[run]), free(offset[run]), free(count_host[run]),
            free(offset_host[run]);
    test_routing_free(&r);
    free(scores);
}

/* No tokens: every op returns MOE_OK; the layout's host counts and offsets and the losses are zeros. */
static void test_empty(moe_gpu *gpu) {
    const int E = 8, k = 2;
    int *d_count = (int *)test_gpu_alloc(gpu, E * sizeof(int));
    int *d_offset = (int *)test_gpu_alloc(gpu, (E + 1) * sizeof(int));
    int count[E], offset[E + 1], zeros[E + 1] = {0};
    memset(count, 0xFF, sizeof count), memset(offset, 0xFF, sizeof offset);
    CHECK_OK(moe_router_dispatch_layout_cuda(gpu, NULL, NULL, 0, E, k, NULL, NULL, d_count, d_offset, count, offset));
    CHECK_OK(moe_gpu_synchronize(gpu));
    CHECK(memcmp(count, zeros, sizeof count) == 0 && memcmp(offset, zeros, sizeof offset) == 0,
          "empty layout: host counts or offsets not zero");
    double loss[2] = {NAN, NAN};
    CHECK_OK(moe_router_losses_cuda(gpu, MOE_SCORE_SOFTMAX, NULL, NULL, NULL, 0, 16, E, k, loss));
    CHECK(loss[0] == 0 && loss[1] == 0, "empty losses: %g %g", loss[0], loss[1]);
    CHECK_OK(moe_router_logits_cuda(gpu, NULL, NULL, NULL, 0, 16, E, NULL, NULL));
    CHECK_OK(moe_router_scores_cuda(gpu, MOE_SCORE_SOFTMAX, NULL, NULL, 0, E, NULL, NULL));
    CHECK_OK(moe_router_gates_cuda(gpu, NULL, NULL, 0, E, k, 1, 1.0f, NULL, NULL));
    CHECK_OK(moe_gpu_synchronize(gpu));
    test_gpu_free(gpu, d_count), test_gpu_free(gpu, d_offset);
}

int main(void) {
    moe_gpu *gpu = test_gpu_require("test_gpu_router");
    moe_rng rng = moe_rng_seeded(31);

    const int gemm_shapes[][3] = {{1, 16, 1}, {1000, 64, 8}, {333, 128, 64}, {257, 96, 256}};
    for (size_t s = 0; s < sizeof gemm_shapes / sizeof gemm_shapes[0]; s++) {
        test_logits(gpu, &rng, gemm_shapes[s][0], gemm_shapes[s][1], gemm_shapes[s][2]);
        for (int with_dx = 0; with_dx <= 1; with_dx++)
            test_logits_backward(gpu, &rng, gemm_shapes[s][0], gemm_shapes[s][1], gemm_shapes[s][2], with_dx);
    }
    test_logits_row_blocks(gpu, &rng, 64, 8);
    test_logits_row_blocks(gpu, &rng, 96, 256);

    const int score_shapes[][2] = {{1, 1}, {1000, 8}, {777, 64}, {500, 256}, {37, 1000}};
    for (size_t s = 0; s < sizeof score_shapes / sizeof score_shapes[0]; s++) {
        test_scores(gpu, &rng, MOE_SCORE_SOFTMAX, 0, score_shapes[s][0], score_shapes[s][1]);
        test_scores(gpu, &rng, MOE_SCORE_SIGMOID, 0, score_shapes[s][0], score_shapes[s][1]);
        test_scores(gpu, &rng, MOE_SCORE_SIGMOID, 1, score_shapes[s][0], score_shapes[s][1]);
    }

    const int topk_shapes[][3] = {{1, 1, 1}, {1000, 8, 2}, {777, 64, 8}, {500, 256, 8}};
    for (size_t s = 0; s < sizeof topk_shapes / sizeof topk_shapes[0]; s++)
        for (int renormalize = 0; renormalize <= 1; renormalize++)
            test_gates(gpu, &rng, topk_shapes[s][0], topk_shapes[s][1], topk_shapes[s][2], renormalize,
                       renormalize ? 2.5f : 1.0f, 0); /* DeepSeek's routed scaling, with and without renormalising */
    test_gates(gpu, &rng, 1000, 8, 2, 1, 2.5f, 1); /* underflowed scores: gates of 0, not 0 / 0 (a probe, 2026-12-07) */

    /* several blocks of partial sums (256 tokens each) and a partial last block */
    const int loss_shapes[][4] = {{1, 1, 1, 1}, {100, 300, 8, 2}, {3000, 9000, 64, 8}, {1000, 1000, 256, 8}};
    for (size_t s = 0; s < sizeof loss_shapes / sizeof loss_shapes[0]; s++)
        for (int f = 0; f <= 1; f++)
            test_losses(gpu, &rng, f ? MOE_SCORE_SIGMOID : MOE_SCORE_SOFTMAX, loss_shapes[s][0], loss_shapes[s][1],
                        loss_shapes[s][2], loss_shapes[s][3]);

    test_layout(gpu, &rng, 1, 1, 1, 1.0, -1);
    test_layout(gpu, &rng, 1000, 8, 2, 1.0, -1);
    test_layout(gpu, &rng, 2048, 64, 6, 1.0, 0);
    test_layout(gpu, &rng, 5000, 64, 8, 0.8, 5);
    test_layout(gpu, &rng, 12500, 256, 8, 0.9, 255); /* 100,000 assignments, 9-bit keys */
    test_layout(gpu, &rng, 300, 16, 4, 0.0, -1);     /* everything dropped */

    test_empty(gpu);
    moe_gpu_destroy(gpu);
    return test_finish("test_gpu_router");
}
