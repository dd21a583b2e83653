/* test_gemm_rows_position.c — what layout invariance stands on, checked on the GEMM library and kernels this process
 * runs (MOE_CPU_GEMM, ONEDNN_MAX_CPU_ISA and OPENBLAS_CORETYPE choose them; tests/meson.build runs this test under
 * each), through kernels/gemm_rows.h as the layer calls it:
 *  - position: with fixed 64-row blocks a row's product is bitwise the same wherever the row sits. A reference run
 *    over all rows (blocks aligned at row 0) against runs starting at every offset 1..63, so that each row sits at
 *    every position of a block, the last block padded too (bench/gemm_row_consistency's check, on the engine);
 *  - threads: the row products, and weight gradients large enough to be cut into several tiles, bitwise the same at
 *    1, 2 and 3 threads (the plan spreads its calls; the library's own threads never run);
 *  - accumulation: beta 1 gives exactly C + the beta-0 product (one addition per value), at k past every library's
 *    k blocking (257 .. 1030).
 * In fp32 and with bf16 inputs (both MOE_BF16_GEMM modes where the CPU has bf16 kernels), both orientations of B.
 * For the record it prints how often OpenBLAS's own 64-row calls give a row other bits by its position (the reason
 * the OpenBLAS engine calls 16 rows at a time: gemm_engine_openblas.c); that count is not checked. */
#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#include "core/threads.h"
#include "kernels/gemm_engine.h"
#include "kernels/gemm_rows.h"
#include "tests/test_util.h"

enum { ROWS = 64 * 4, SPAN = 2 * 64 + 37 /* two whole blocks and a padded one */ };

typedef struct {
    int k, n;
} shape;

/* the shapes of bench/gemm_row_consistency (the small ones: router, d-32/48/64/128 dense) and an odd one */
static const shape shapes[] = {{32, 8}, {32, 48}, {48, 32}, {64, 128}, {128, 64}, {512, 8}, {300, 200}, {8, 512}};

static float *alloc_floats(size_t n) {
    float *p = calloc(n ? n : 1, sizeof *p);
    if (!p) abort();
    return p;
}

/* rows [first, first + count) of A op(B) through a fresh layout-invariant plan, into C's rows of the same index */
static void rows_product(int bf16, CBLAS_TRANSPOSE tb, const shape *s, const float *A, const float *B, int first,
                         int count, float beta, float *C) {
    moe_gemm_rows_plan plan;
    CHECK_OK(moe_gemm_rows_plan_init(&plan, 1, bf16, s->k > s->n ? s->k : s->n));
    CHECK_OK(moe_gemm_rows_cpu(&plan, tb, count, s->n, s->k, A + (size_t)first * s->k, B, beta,
                               C + (size_t)first * s->n));
    moe_gemm_rows_plan_free(&plan);
}

/* rows that differ between a and b among rows [first, first + count) of width n */
static int rows_differing(const float *a, const float *b, int first, int count, int n) {
    int differ = 0;
    for (int r = first; r < first + count; r++)
        differ += memcmp(a + (size_t)r * n, b + (size_t)r * n, sizeof(float) * n) != 0;
    return differ;
}

static void positions(int bf16, CBLAS_TRANSPOSE tb, const shape *s, const float *A, const float *B) {
    const size_t out = (size_t)ROWS * s->n;
    float *ref = alloc_floats(out), *got = alloc_floats(out);
    rows_product(bf16, tb, s, A, B, 0, ROWS, 0, ref);
    int differ = 0, checked = 0;
    for (int off = 1; off < 64; off++) {
        memset(got, 0, sizeof(float) * out);
        rows_product(bf16, tb, s, A, B, off, SPAN, 0, got);
        differ += rows_differing(got, ref, off, SPAN, s->n), checked += SPAN;
    }
    CHECK(differ == 0, "%s k %d n %d B%s: %d of %d rows differ by their position in the 64-row blocks (%s)",
          bf16 ? "bf16" : "fp32", s->k, s->n, tb == CblasTrans ? "^T" : "", differ, checked, moe_gemm_library());
    free(ref), free(got);
}

/* C + the beta-0 product, against beta 1 on C, bitwise */
static void accumulation(int bf16, int k, int n, moe_rng *rng) {
    const int rows = 64 + 37;
    float *A = test_alloc_uniform(rng, (size_t)rows * k, 1), *B = test_alloc_uniform(rng, (size_t)n * k, 1);
    float *C = test_alloc_uniform(rng, (size_t)rows * n, 1), *acc = alloc_floats((size_t)rows * n),
          *alone = alloc_floats((size_t)rows * n);
    const shape s = {k, n};
    memcpy(acc, C, sizeof(float) * rows * n);
    rows_product(bf16, CblasTrans, &s, A, B, 0, rows, 0, alone);
    rows_product(bf16, CblasTrans, &s, A, B, 0, rows, 1, acc);
    int differ = 0;
    for (size_t i = 0; i < (size_t)rows * n; i++) differ += acc[i] != C[i] + alone[i];
    CHECK(differ == 0, "%s rows x [%d x %d]^T: C += A B^T differs from C + A B^T at %d of %d values",
          bf16 ? "bf16" : "fp32", n, k, differ, rows * n);
    /* the weight gradient's too, over more rows than a run-time k takes: X [GR, k], Y [GR, n]. With bf16 inputs the
     * rows are summed in chunks of MOE_GEMM_ROUND_ROWS, each chunk's product added in order (gemm_rows.h): beta 1
     * gives (C + P0) + P1, each P a chunk's beta-0 product; in fp32 C + the whole product. */
    enum { GR = 300 };
    float *X = test_alloc_uniform(rng, (size_t)GR * k, 1), *Y = test_alloc_uniform(rng, (size_t)GR * n, 1);
    float *G = test_alloc_uniform(rng, (size_t)k * n, 1), *gacc = alloc_floats((size_t)k * n),
          *part = alloc_floats((size_t)k * n), *want = alloc_floats((size_t)k * n);
    moe_gemm_rows_plan plan;
    CHECK_OK(moe_gemm_rows_plan_init(&plan, 1, bf16, k > n ? k : n));
    memcpy(gacc, G, sizeof(float) * k * n);
    memcpy(want, G, sizeof(float) * k * n);
    CHECK_OK(moe_gemm_rows_at_b_cpu(&plan, GR, k, n, X, Y, 1, gacc));
    const int chunk = bf16 ? MOE_GEMM_ROUND_ROWS : GR;
    for (int r = 0; r < GR; r += chunk) {
        const int rows_here = GR - r < chunk ? GR - r : chunk;
        CHECK_OK(moe_gemm_rows_at_b_cpu(&plan, rows_here, k, n, X + (size_t)r * k, Y + (size_t)r * n, 0, part));
        for (size_t i = 0; i < (size_t)k * n; i++) want[i] += part[i];
    }
    CHECK(!memcmp(gacc, want, sizeof(float) * k * n), "%s A^T B [%d x %d] over %d rows: C += A^T B is not C + the "
          "product%s", bf16 ? "bf16" : "fp32", k, n, GR, bf16 ? "s of its chunks, in order" : "");
    moe_gemm_rows_plan_free(&plan);
    free(A), free(B), free(C), free(acc), free(alone), free(X), free(Y), free(G), free(gacc), free(part), free(want);
}

/* Row products and tiled weight gradients at 1, 2 and 3 threads: every output bitwise the 1-thread one. */
static void thread_counts(int bf16, moe_rng *rng) {
    enum { T = 1000, D = 96, F = 520, GR = 700 }; /* 16 row blocks; a [520 x 600] gradient is 3 x 3 tiles */
    float *x = test_alloc_uniform(rng, (size_t)T * D, 1), *w = test_alloc_uniform(rng, (size_t)F * D, 1);
    float *dy = test_alloc_uniform(rng, (size_t)GR * F, 1), *x2 = test_alloc_uniform(rng, (size_t)GR * 600, 1);
    float *out[3], *grad[3];
    for (int t = 0; t < 3; t++) {
        moe_threads_set(t + 1);
        out[t] = alloc_floats((size_t)T * F), grad[t] = alloc_floats((size_t)F * 600);
        for (int invariant = 0; invariant < 2; invariant++) {
            moe_gemm_rows_plan plan;
            CHECK_OK(moe_gemm_rows_plan_init(&plan, invariant, bf16, F));
            /* invariant 1 into out, then 0 added on top: both calling modes' bits in one buffer */
            CHECK_OK(moe_gemm_rows_cpu(&plan, CblasTrans, T, F, D, x, w, invariant ? 0 : 1, out[t]));
            moe_gemm_rows_plan_free(&plan);
        }
        moe_gemm_rows_plan plan;
        CHECK_OK(moe_gemm_rows_plan_init(&plan, 1, bf16, 600));
        CHECK_OK(moe_gemm_rows_at_b_cpu(&plan, GR, F, 600, dy, x2, 0, grad[t]));
        moe_gemm_rows_plan_free(&plan);
    }
    moe_threads_set(1);
    for (int t = 1; t < 3; t++) {
        CHECK(!memcmp(out[t], out[0], sizeof(float) * T * F), "%s: %d threads' row products differ from 1 thread's",
              bf16 ? "bf16" : "fp32", t + 1);
        CHECK(!memcmp(grad[t], grad[0], sizeof(float) * F * 600),
              "%s: %d threads' tiled weight gradient differs from 1 thread's", bf16 ? "bf16" : "fp32", t + 1);
    }
    for (int t = 0; t < 3; t++) free(out[t]), free(grad[t]);
    free(x), free(w), free(dy), free(x2);
}

/* OpenBLAS's own 64-row calls, rows in its N dimension: rows whose bits depend on their position (printed only). */
static void openblas_own_blocks(const shape *s, const float *A, const float *B) {
    float *ref = alloc_floats((size_t)ROWS * s->n), *got = alloc_floats((size_t)64 * s->n);
    for (int b = 0; b < ROWS; b += 64)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, 64, s->n, s->k, 1, A + (size_t)b * s->k, s->k, B, s->k, 0,
                    ref + (size_t)b * s->n, s->n);
    int differ = 0;
    for (int off = 1; off < 64; off++) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, 64, s->n, s->k, 1, A + (size_t)off * s->k, s->k, B, s->k,
                    0, got, s->n);
        for (int r = 0; r < 64; r++)
            differ += memcmp(got + (size_t)r * s->n, ref + (size_t)(off + r) * s->n, sizeof(float) * s->n) != 0;
    }
    printf("  OpenBLAS's own 64-row calls (core %s), k %d n %d: %d of %d rows differ by position\n",
           openblas_get_corename(), s->k, s->n, differ, 63 * 64);
    free(ref), free(got);
}

int main(void) {
    moe_threads_set(1);
    printf("GEMM library: %s\n", moe_gemm_library());
    moe_rng rng = moe_rng_seeded(48);
    const int modes = moe_gemm_native_bf16() ? 2 : 1; /* bf16 on its kernels and on fp32 units, where both exist */
    for (int mode = 0; mode < modes; mode++) {
        if (modes == 2) moe_gemm_set_bf16_mode(mode == 0 ? MOE_BF16_GEMM_NATIVE : MOE_BF16_GEMM_FP32);
        for (int bf16 = mode; bf16 <= 1; bf16++) /* fp32 once */
            for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
                const shape *s = &shapes[i];
                float *A = test_alloc_uniform(&rng, (size_t)ROWS * s->k, 1);
                float *B = test_alloc_uniform(&rng, (size_t)s->n * s->k, 1); /* [n, k], or [k, n] untransposed */
                positions(bf16, CblasTrans, s, A, B);
                const shape t = {s->n, s->k}; /* the input gradient's orientation: k and n swapped */
                float *At = test_alloc_uniform(&rng, (size_t)ROWS * t.k, 1);
                positions(bf16, CblasNoTrans, &t, At, B);
                if (bf16 == 0 && mode == 0) openblas_own_blocks(s, A, B);
                free(A), free(B), free(At);
            }
        for (int bf16 = mode; bf16 <= 1; bf16++) {
            static const int ks[] = {64, 257, 300, 1030};
            for (size_t i = 0; i < sizeof ks / sizeof *ks; i++) accumulation(bf16, ks[i], i % 2 ? 64 : 8, &rng);
            thread_counts(bf16, &rng);
        }
    }
    return test_finish("test_gemm_rows_position");
}
