/* test_gemm_engine.c — the calls of the CPU GEMM engine (kernels/gemm_engine.h) on the library this process runs
 * (MOE_CPU_GEMM, ONEDNN_MAX_CPU_ISA, OPENBLAS_CORETYPE: tests/meson.build runs it under each). Weight gradients,
 * C[m, n] (+)= A^T B summed over k rows, at every k an expert's segment may have, output widths from 8 to 256, in fp32
 * and bf16 (where the engine has bf16 kernels, and as fp32 products of the bf16 values: both MOE_BF16_GEMM modes):
 * short sums share one run-time-k primitive, longer ones get their own (kernels/gemm_engine_onednn.c).
 *  - each product equals the double-precision sum of the same inputs up to fp32 rounding of the sum;
 *  - accumulating (C += product) gives exactly C + the product alone: one fp32 addition per value (the libraries'
 *    own accumulation adds C after their first k block on some ISAs: issue 48), for row products too, at k past
 *    every library's k blocking;
 *  - a call's bits do not depend on the calls before it (the primitive it finds built for another k, or built now);
 *  - a call on a part of larger arrays (leading dimensions) writes exactly its part: C's other values untouched. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "kernels/cast.h"
#include "kernels/gemm_engine.h"
#include "tests/test_util.h"

enum { MAX_K = 300, MAX_M = 256, MAX_N = 256 };

typedef struct {
    float *a, *b;        /* A [k, m], B [k, n] as fp32 values (bf16-exact for bf16 calls) */
    moe_bf16 *a16, *b16; /* the same as moe_bf16, for a native bf16 engine */
} inputs;

static inputs make_inputs(moe_rng *rng) {
    inputs in = {test_alloc_uniform(rng, (size_t)MAX_K * MAX_M, 1.0), test_alloc_uniform(rng, (size_t)MAX_K * MAX_N, 1.0),
                 malloc(sizeof(moe_bf16) * MAX_K * MAX_M), malloc(sizeof(moe_bf16) * MAX_K * MAX_N)};
    if (!in.a16 || !in.b16) abort();
    for (size_t i = 0; i < (size_t)MAX_K * MAX_M; i++) in.a[i] = moe_bf16_round(in.a[i]);
    for (size_t i = 0; i < (size_t)MAX_K * MAX_N; i++) in.b[i] = moe_bf16_round(in.b[i]);
    moe_bf16_from_float_n(in.a, (size_t)MAX_K * MAX_M, in.a16);
    moe_bf16_from_float_n(in.b, (size_t)MAX_K * MAX_N, in.b16);
    return in;
}

static moe_status at_b(moe_gemm_engine *e, const inputs *in, int bf16, int m, int n, int k, int accumulate, float *C) {
    const int native = bf16 && moe_gemm_native_bf16(); /* else bf16 values in an fp32 call (gemm_engine.h) */
    const moe_gemm_call call = {.trans_a = 1, .m = m, .n = n, .k = k, .bf16 = native, .accumulate = accumulate};
    return moe_gemm_engine_run(e, &call, native ? (const void *)in->a16 : in->a, native ? (const void *)in->b16 : in->b,
                               C);
}

/* the largest |got - exact| / (sum of |terms|) over C: fp32 summation of k terms is within ~k ulp of that */
static double worst_error(const inputs *in, int m, int n, int k, const float *C) {
    double worst = 0;
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double exact = 0, magnitude = 0;
            for (int r = 0; r < k; r++) {
                const double t = (double)in->a[(size_t)r * m + i] * in->b[(size_t)r * n + j];
                exact += t, magnitude += fabs(t);
            }
            const double err = fabs(C[(size_t)i * n + j] - exact) / (magnitude > 0 ? magnitude : 1);
            if (err > worst) worst = err;
        }
    return worst;
}

static void check_shape(const inputs *in, int bf16, int m, int n, moe_rng *rng) {
    static const int ks[] = {1, 7, 31, 64, 100, 255, 256, 257, 300};
    const int count = (int)(sizeof ks / sizeof ks[0]);
    const size_t mn = (size_t)m * n;
    float *alone = malloc(sizeof(float) * mn), *acc = malloc(sizeof(float) * mn), *c0 = malloc(sizeof(float) * mn),
          *fresh = malloc(sizeof(float) * mn);
    if (!alone || !acc || !c0 || !fresh) abort();
    moe_gemm_engine *warm;
    CHECK_OK(moe_gemm_engine_create(&warm));
    for (int i = 0; i < count; i++) {
        const int k = ks[i];
        CHECK_OK(at_b(warm, in, bf16, m, n, k, 0, alone));
        const double err = worst_error(in, m, n, k, alone);
        CHECK(err <= 1e-6 * k, "%s A^T B [%d x %d] over %d rows: relative error %.3g", bf16 ? "bf16" : "fp32", m, n, k,
              err);
        moe_rng_fill_uniform(rng, c0, mn, 1.0);
        memcpy(acc, c0, sizeof(float) * mn);
        CHECK_OK(at_b(warm, in, bf16, m, n, k, 1, acc));
        size_t differ = 0;
        for (size_t j = 0; j < mn; j++) differ += acc[j] != c0[j] + alone[j];
        CHECK(differ == 0, "%s [%d x %d] k %d: C += A^T B differs from C + A^T B at %zu of %zu values",
              bf16 ? "bf16" : "fp32", m, n, k, differ, mn);
        moe_gemm_engine *cold; /* the same call as the first of an engine */
        CHECK_OK(moe_gemm_engine_create(&cold));
        CHECK_OK(at_b(cold, in, bf16, m, n, k, 0, fresh));
        moe_gemm_engine_free(cold);
        CHECK(!memcmp(fresh, alone, sizeof(float) * mn), "%s [%d x %d] k %d: a fresh engine gives other bits than one "
              "that ran other k first", bf16 ? "bf16" : "fp32", m, n, k);
    }
    moe_gemm_engine_free(warm);
    free(alone), free(acc), free(c0), free(fresh);
}

/* Row products, C[64, n] (+)= A[64, k] B^T (B [n, k], as the 64-row blocks call it): beta 1 is C + the beta-0
 * product, at k past every library's k blocking. */
static void check_row_accumulation(int bf16, moe_rng *rng) {
    static const int ks[] = {8, 64, 257, 300, 1030}, ns[] = {8, 64, 200};
    moe_gemm_engine *e;
    CHECK_OK(moe_gemm_engine_create(&e));
    for (size_t a = 0; a < sizeof ks / sizeof *ks; a++)
        for (size_t b = 0; b < sizeof ns / sizeof *ns; b++) {
            const int k = ks[a], n = ns[b], m = 64, native = bf16 && moe_gemm_native_bf16();
            float *A = test_alloc_uniform(rng, (size_t)m * k, 1), *B = test_alloc_uniform(rng, (size_t)n * k, 1);
            float *C = test_alloc_uniform(rng, (size_t)m * n, 1), *acc = malloc(sizeof(float) * m * n),
                  *alone = malloc(sizeof(float) * m * n);
            moe_bf16 *A16 = malloc(sizeof(moe_bf16) * m * k), *B16 = malloc(sizeof(moe_bf16) * n * k);
            if (!acc || !alone || !A16 || !B16) abort();
            if (bf16) {
                for (size_t i = 0; i < (size_t)m * k; i++) A[i] = moe_bf16_round(A[i]);
                for (size_t i = 0; i < (size_t)n * k; i++) B[i] = moe_bf16_round(B[i]);
                moe_bf16_from_float_n(A, (size_t)m * k, A16), moe_bf16_from_float_n(B, (size_t)n * k, B16);
            }
            const void *a_in = native ? (const void *)A16 : A, *b_in = native ? (const void *)B16 : B;
            moe_gemm_call call = {.trans_b = 1, .m = m, .n = n, .k = k, .bf16 = native};
            CHECK_OK(moe_gemm_engine_run(e, &call, a_in, b_in, alone));
            memcpy(acc, C, sizeof(float) * m * n);
            call.accumulate = 1;
            CHECK_OK(moe_gemm_engine_run(e, &call, a_in, b_in, acc));
            size_t differ = 0;
            for (size_t i = 0; i < (size_t)m * n; i++) differ += acc[i] != C[i] + alone[i];
            CHECK(differ == 0, "%s rows [64 x %d] x [%d x %d]: C += A B^T differs from C + A B^T at %zu values",
                  bf16 ? "bf16" : "fp32", k, k, n, differ);
            free(A), free(B), free(C), free(acc), free(alone), free(A16), free(B16);
        }
    moe_gemm_engine_free(e);
}

/* A weight gradient on rows [8, 8 + 40) x columns [16, 16 + 24) of a [64 x 48] C, from the matching columns of A
 * [k, 64] and B [k, 48] (pitches 64, 48, 48): the same values as the call on dense copies up to rounding order, and
 * nothing outside the part written. */
static void check_pitched(moe_rng *rng) {
    enum { K = 50, M = 64, N = 48, I0 = 8, J0 = 16, MM = 40, NN = 24 };
    float *A = test_alloc_uniform(rng, (size_t)K * M, 1), *B = test_alloc_uniform(rng, (size_t)K * N, 1);
    float *C = test_alloc_uniform(rng, (size_t)M * N, 1), *before = malloc(sizeof(float) * M * N);
    if (!before) abort();
    memcpy(before, C, sizeof(float) * M * N);
    moe_gemm_engine *e;
    CHECK_OK(moe_gemm_engine_create(&e));
    const moe_gemm_call call = {.trans_a = 1, .m = MM, .n = NN, .k = K, .lda = M, .ldb = N, .ldc = N};
    CHECK_OK(moe_gemm_engine_run(e, &call, A + I0, B + J0, C + (size_t)I0 * N + J0));
    moe_gemm_engine_free(e);
    int outside = 0;
    double worst = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            const size_t at = (size_t)i * N + j;
            if (i < I0 || i >= I0 + MM || j < J0 || j >= J0 + NN) {
                outside += memcmp(&C[at], &before[at], sizeof(float)) != 0;
                continue;
            }
            double exact = 0, magnitude = 0;
            for (int r = 0; r < K; r++) {
                const double t = (double)A[(size_t)r * M + i] * B[(size_t)r * N + j];
                exact += t, magnitude += fabs(t);
            }
            const double err = fabs(C[at] - exact) / magnitude;
            if (err > worst) worst = err;
        }
    CHECK(outside == 0, "a pitched call wrote %d values outside its part of C", outside);
    CHECK(worst <= 1e-6 * K, "a pitched call: relative error %.3g", worst);
    free(A), free(B), free(C), free(before);
}

int main(void) {
    moe_rng rng = moe_rng_seeded(29);
    inputs in = make_inputs(&rng);
    static const int shapes[][2] = {{256, 128}, {128, 256}, {8, 128}, {64, 64}, {64, 8}, {16, 48}, {8, 8}};
    const int nshapes = (int)(sizeof shapes / sizeof *shapes);
    static const moe_bf16_gemm_mode modes[] = {MOE_BF16_GEMM_NATIVE, MOE_BF16_GEMM_FP32}; /* both, whatever auto is */
    for (int mode = 0; mode < 2; mode++) {
        moe_gemm_set_bf16_mode(modes[mode]);
        for (int bf16 = 0; bf16 <= 1; bf16++)
            for (int s = 0; s < nshapes; s++) check_shape(&in, bf16, shapes[s][0], shapes[s][1], &rng);
        for (int bf16 = 0; bf16 <= 1; bf16++) check_row_accumulation(bf16, &rng);
    }
    check_pitched(&rng);
    printf("GEMM library: %s\n", moe_gemm_library());
    free(in.a), free(in.b), free(in.a16), free(in.b16);
    return test_finish("test_gemm_engine");
}
