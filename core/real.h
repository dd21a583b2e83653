/* real.h — internal: the math and BLAS entry points for moe_real (float, or double in the f64 build). */
#ifndef MOE_REAL_H
#define MOE_REAL_H

#include <cblas.h>
#include <math.h>

#include "core/types.h"

#ifdef MOE_REAL_IS_DOUBLE
#define moe__gemm cblas_dgemm
#define moe__exp exp
#define moe__log log
#else
#define moe__gemm cblas_sgemm
#define moe__exp moe__exp_poly
#define moe__log logf
#endif

#ifndef MOE_REAL_IS_DOUBLE
#include <stdint.h>
#include <string.h>

/* e^x in float, within 2 ulp of the correctly rounded value (tests/test_exp.c measures it), in plain IEEE float
 * operations only: a loop of them vectorises (glibc's expf is a call that stops the vectoriser; its vector
 * variants round differently from the scalar one), and every element gets the same bits whether the vector body
 * or a scalar remainder computes it — a row's values must not depend on where it sits in a buffer
 * (docs/DETERMINISM.md). The build turns FMA contraction off (meson.build) so this holds on any -march too.
 *   n = round(x log2 e) (adding 1.5 * 2^23 rounds),  r = x - n ln2 (Cody-Waite: ln2_hi has 9 significant bits,
 *   so n ln2_hi is exact),  e^r by its Taylor polynomial of degree 7 (|r| <= ln2 / 2: truncation < 2^-27),
 *   e^x = e^r 2^(n - n/2) 2^(n/2) (two scalings keep both exponents in range). Outside [-87.34, 88.72]: 0 (below
 *   FLT_MIN) or inf; NaN stays NaN. */
static inline float moe__exp_poly(float x) {
    const float shifter = 12582912.0f; /* 1.5 * 2^23, bits 0x4B400000 */
    const float xc = x < -87.33654f ? -87.33654f : x > 88.72283f ? 88.72283f : x;
    const float t = xc * 1.44269504f + shifter, n = t - shifter;
    const float r = (xc - n * 0.693359375f) - n * -2.12194440e-4f;
    float p = 1.0f / 5040;
    p = p * r + 1.0f / 720;
    p = p * r + 1.0f / 120;
    p = p * r + 1.0f / 24;
    p = p * r + 1.0f / 6;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    uint32_t bits;
    memcpy(&bits, &t, sizeof bits);
    const int32_t k = (int32_t)(bits - 0x4B400000u), k1 = k / 2, k2 = k - k1;
    const uint32_t b1 = (uint32_t)(k1 + 127) << 23, b2 = (uint32_t)(k2 + 127) << 23;
    float s1, s2;
    memcpy(&s1, &b1, sizeof s1);
    memcpy(&s2, &b2, sizeof s2);
    const float y = p * s1 * s2;
    return x > 88.72283f ? INFINITY : x < -87.33654f ? 0.0f : y;
}
#endif

#endif
