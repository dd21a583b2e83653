/* test_gemm_engine.c — the weight-gradient calls of the CPU GEMM engine (kernels/gemm_engine.h), C[m, n] (+)= A^T B
 * summed over k rows, at every k an expert's segment may have, in fp32 and bf16 (where the engine has bf16
 * kernels, and as fp32 products of the bf16 values: both MOE_BF16_GEMM modes): short sums share one run-time-k
 * primitive, longer ones get their own (kernels/gemm_engine_onednn.c).
 *  - each product equals the double-precision sum of the same inputs up to fp32 rounding of the sum;
 *  - accumulating (C += product) gives exactly C + the product alone: one fp32 addition per value;
 *  - a call's bits do not depend on the calls before it (the primitive it finds built for another k, or built now). */
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

int main(void) {
    moe_rng rng = moe_rng_seeded(29);
    inputs in = make_inputs(&rng);
    static const int shapes[][2] = {{256, 128}, {128, 256}, {8, 128}};
    static const moe_bf16_gemm_mode modes[] = {MOE_BF16_GEMM_NATIVE, MOE_BF16_GEMM_FP32}; /* both, whatever auto is */
    for (int mode = 0; mode < 2; mode++) {
        moe_gemm_set_bf16_mode(modes[mode]);
        for (int bf16 = 0; bf16 <= 1; bf16++)
            for (int s = 0; s < 3; s++) check_shape(&in, bf16, shapes[s][0], shapes[s][1], &rng);
    }
    free(in.a), free(in.b), free(in.a16), free(in.b16);
    return test_finish("test_gemm_engine");
}
