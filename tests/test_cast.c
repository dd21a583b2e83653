/* test_cast.c — moe_bf16_from_float / moe_bf16_to_float / moe_bf16_round (kernels/cast_cpu.c), exactly: hand-picked
 * bit patterns (ties to even, values near the largest bf16 and past it, subnormals, NaN payloads and
 * signaling NaNs, infinities, signed zeros), every one of the 65536 bf16 values decoded by formula, and
 * 2^24 random float bit patterns against a rounding written out independently: the two bf16 neighbours
 * of x compared by distance in double (the value past the largest bf16 counts as 2^128, which is how
 * IEEE rounds into infinity), ties to the even one. moe_f16_to_float (loading F16 checkpoints): every one of the
 * 65536 half values against the IEEE binary16 formula in double (subnormals m * 2^-24, signed zeros, infinities),
 * NaNs kept NaN with their sign and payload, and hand-picked values. moe_fp8_e4m3_to_float (DeepSeek-V3's FP8
 * weights): every one of the 256 values against the OCP E4M3 formula. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cast.h"
#include "tests/test_util.h"

static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t to_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* The value of bf16 bits b by the IEEE formula (sign, 8-bit exponent with bias 127, 7-bit mantissa);
 * inf as 2^128 when huge_inf (the rounding neighbour), else INFINITY. NaN patterns are not passed in. */
static double bf16_formula(uint16_t b, int huge_inf) {
    int sign = b >> 15, e = (b >> 7) & 0xFF, m = b & 0x7F;
    double v;
    if (e == 0xFF) v = huge_inf ? ldexp(1.0, 128) : INFINITY;
    else if (e == 0) v = ldexp(m / 128.0, -126);
    else v = ldexp(1.0 + m / 128.0, e - 127);
    return sign ? -v : v;
}

/* Round-to-nearest-even of a non-NaN float to bf16, by distances. */
static uint16_t reference_round(float x) {
    uint32_t u = to_bits(x);
    uint16_t t = (uint16_t)(u >> 16); /* truncation: the neighbour toward zero */
    if ((u & 0xFFFF) == 0) return t;  /* exact (zero, inf, and every bf16 value) */
    double lo = fabs(bf16_formula(t, 1)), hi = fabs(bf16_formula((uint16_t)(t + 1), 1)), ax = fabs((double)x);
    double dlo = ax - lo, dhi = hi - ax; /* exact: all are floats within one binade step */
    if (dlo < dhi) return t;
    if (dhi < dlo) return (uint16_t)(t + 1);
    return (t & 1) ? (uint16_t)(t + 1) : t;
}

static void expect(uint32_t in, uint16_t want, const char *what) {
    uint16_t got = moe_bf16_from_float(from_bits(in));
    CHECK(got == want, "%s: moe_bf16_from_float(0x%08X) = 0x%04X, want 0x%04X", what, (unsigned)in, got, want);
}

static void test_hand_picked(void) {
    /* ties to even and their neighbours around 1.0 (bf16 ulp there is 2^-7) */
    expect(0x3F808000u, 0x3F80, "1 + 2^-8: tie, down to even");
    expect(0x3F818000u, 0x3F82, "1 + 3*2^-8: tie, up to even");
    expect(0x3F808001u, 0x3F81, "just above a tie");
    expect(0x3F807FFFu, 0x3F80, "just below a tie");
    expect(0xBF818000u, 0xBF82, "negative tie, up in magnitude to even");
    expect(0x3F800000u, 0x3F80, "1 exactly");
    /* the largest bf16 is 0x7F7F (0x7F7F0000 as float); its half ulp above is the boundary to inf */
    expect(0x7F7F0000u, 0x7F7F, "largest bf16");
    expect(0x7F7F7FFFu, 0x7F7F, "just below the overflow tie");
    expect(0x7F7F8000u, 0x7F80, "overflow tie: odd 0x7F7F rounds to even, which is inf");
    expect(0x7F7FFFFFu, 0x7F80, "FLT_MAX -> inf");
    expect(0xFF7FFFFFu, 0xFF80, "-FLT_MAX -> -inf");
    expect(0x7F7E8000u, 0x7F7E, "tie below the largest, to even");
    /* subnormals: bf16 keeps the float exponent range, so they round like everything else */
    expect(0x00000001u, 0x0000, "smallest float subnormal -> +0");
    expect(0x80000001u, 0x8000, "smallest negative subnormal -> -0");
    expect(0x00008000u, 0x0000, "subnormal tie to even 0");
    expect(0x00008001u, 0x0001, "just above a subnormal tie");
    expect(0x00018000u, 0x0002, "subnormal tie to even 2");
    expect(0x007FFFFFu, 0x0080, "largest subnormal -> smallest normal");
    expect(0x00010000u, 0x0001, "smallest bf16 subnormal exactly");
    /* infinities and signed zeros */
    expect(0x7F800000u, 0x7F80, "+inf");
    expect(0xFF800000u, 0xFF80, "-inf");
    expect(0x00000000u, 0x0000, "+0");
    expect(0x80000000u, 0x8000, "-0");
    CHECK(signbit(moe_bf16_round(-0.0f)) && moe_bf16_round(-0.0f) == 0.0f, "moe_bf16_round(-0) keeps the sign");
    /* NaN: quiet, sign kept, payload's top bits kept, never inf */
    expect(0x7FC00000u, 0x7FC0, "quiet NaN");
    expect(0xFFC00000u, 0xFFC0, "negative quiet NaN");
    expect(0x7F800001u, 0x7FC0, "signaling NaN with a low payload: quieted, not inf");
    expect(0xFF800001u, 0xFFC0, "negative signaling NaN");
    expect(0x7FA12345u, 0x7FE1, "signaling NaN with a payload: quiet bit set, top payload kept");
    expect(0x7FFFFFFFu, 0x7FFF, "all-ones NaN: no carry into the sign");
    CHECK(isnan(moe_bf16_round(from_bits(0x7F800001u))), "moe_bf16_round(sNaN) is NaN");
}

static void test_all_bf16(void) {
    int bad_decode = 0, bad_trip = 0;
    for (uint32_t b = 0; b < 65536; b++) {
        float f = moe_bf16_to_float((moe_bf16)b);
        CHECK(to_bits(f) == b << 16, "moe_bf16_to_float(0x%04X) bits 0x%08X", (unsigned)b, (unsigned)to_bits(f));
        int is_nan = ((b >> 7) & 0xFF) == 0xFF && (b & 0x7F);
        if (is_nan) {
            bad_trip += moe_bf16_from_float(f) != (uint16_t)(b | 0x40);
            continue;
        }
        double want = bf16_formula((uint16_t)b, 0);
        bad_decode += !((double)f == want && !signbit(f) == !signbit(want));
        bad_trip += moe_bf16_from_float(f) != b;
    }
    CHECK(bad_decode == 0, "%d bf16 values decode differently from the formula", bad_decode);
    CHECK(bad_trip == 0, "%d bf16 values do not survive bf16 -> float -> bf16", bad_trip);
}

static void test_random_sweep(void) {
    moe_rng rng = moe_rng_seeded(20240607);
    long n = 1L << 24, bad = 0, nans = 0;
    for (long i = 0; i < n; i++) {
        uint32_t u = (uint32_t)(moe_rng_next(&rng) >> 32);
        float x = from_bits(u);
        uint16_t got = moe_bf16_from_float(x);
        if (isnan(x)) {
            nans++;
            int ok = (got & 0x7F80) == 0x7F80 && (got & 0x40) && (got >> 15) == (u >> 31) &&
                     (got & 0xFFBF) == ((u >> 16) & 0xFFBF);
            if (!ok && bad++ < 5) fprintf(stderr, "NaN 0x%08X -> 0x%04X\n", (unsigned)u, got);
            continue;
        }
        uint16_t want = reference_round(x);
        float r = moe_bf16_round(x);
        if ((got != want || to_bits(r) != (uint32_t)want << 16) && bad++ < 5)
            fprintf(stderr, "0x%08X -> 0x%04X, want 0x%04X\n", (unsigned)u, got, want);
    }
    CHECK(bad == 0, "%ld of %ld random patterns (%ld NaN) round differently from the reference", bad, n, nans);
    printf("random sweep: %ld patterns, %ld NaN, %ld mismatches\n", n, nans, bad);
}

/* The bulk forms give the scalar form's bits for every pattern, NaNs included (they are what the GEMMs use). */
static void test_bulk_forms(void) {
    enum { N = 1 << 20 };
    float *x = malloc(N * sizeof *x), *rounded = malloc(N * sizeof *rounded);
    moe_bf16 *bits = malloc(N * sizeof *bits);
    CHECK(x && rounded && bits, "out of memory");
    moe_rng rng = moe_rng_seeded(7);
    for (long i = 0; i < N; i++) x[i] = from_bits(i < 65536 ? (uint32_t)i << 16 | (uint32_t)(i & 0x8001)
                                                          : (uint32_t)(moe_rng_next(&rng) >> 32));
    moe_bf16_from_float_n(x, N, bits);
    moe_bf16_round_n(x, N, rounded);
    long bad = 0;
    for (long i = 0; i < N; i++)
        bad += bits[i] != moe_bf16_from_float(x[i]) || to_bits(rounded[i]) != (uint32_t)bits[i] << 16;
    CHECK(bad == 0, "%ld of %d values: the bulk forms differ from moe_bf16_from_float", bad, N);
    free(x), free(rounded), free(bits);
}

/* The value of half bits h by the IEEE formula (5-bit exponent, bias 15, 10-bit mantissa); NaNs not passed in. */
static double f16_formula(uint16_t h) {
    int sign = h >> 15, e = (h >> 10) & 0x1F, m = h & 0x3FF;
    double v = e == 0x1F ? INFINITY : e == 0 ? ldexp(m, -24) : ldexp(1.0 + m / 1024.0, e - 15);
    return sign ? -v : v;
}

static void test_all_f16(void) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = moe_f16_to_float((uint16_t)h);
        if (((h >> 10) & 0x1F) == 0x1F && (h & 0x3FF)) { /* NaN: sign and payload (top mantissa bits) kept */
            bad += !isnan(f) || (to_bits(f) >> 31) != (h >> 15) || ((to_bits(f) >> 13) & 0x3FF) != (h & 0x3FF);
            continue;
        }
        double want = f16_formula((uint16_t)h);
        bad += !((double)f == want && !signbit(f) == !signbit(want));
    }
    CHECK(bad == 0, "%d half values decode differently from the formula", bad);
    CHECK(moe_f16_to_float(0x0001) == ldexpf(1, -24), "smallest half subnormal is 2^-24");
    CHECK(moe_f16_to_float(0x03FF) == 1023 * ldexpf(1, -24), "largest half subnormal");
    CHECK(moe_f16_to_float(0x7BFF) == 65504.0f, "largest half is 65504");
    CHECK(moe_f16_to_float(0x3C00) == 1.0f && moe_f16_to_float(0xC000) == -2.0f, "1 and -2");
    CHECK(isinf(moe_f16_to_float(0xFC00)) && moe_f16_to_float(0xFC00) < 0, "-inf");
    CHECK(signbit(moe_f16_to_float(0x8000)) && moe_f16_to_float(0x8000) == 0, "-0");
}

/* Every FP8 E4M3 value against the OCP formula in double: (-1)^s 2^(e-7) (1 + m/8), subnormals 2^-6 m/8, the two
 * NaN patterns NaN; and the landmarks (1, the largest 448, the smallest subnormal 2^-9 and normal 2^-6, -0). */
static void test_all_fp8(void) {
    int bad = 0;
    for (int b = 0; b < 256; b++) {
        const int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
        const float got = moe_fp8_e4m3_to_float((uint8_t)b);
        if (e == 15 && m == 7) {
            bad += !isnan(got);
            continue;
        }
        const double want = (s ? -1 : 1) * (e ? ldexp(1 + m / 8.0, e - 7) : ldexp(m / 8.0, -6));
        bad += (double)got != want || !!signbit(got) != (s != 0);
    }
    CHECK(!bad, "%d of 256 fp8 e4m3 values decode wrong", bad);
    CHECK(moe_fp8_e4m3_to_float(0x38) == 1 && moe_fp8_e4m3_to_float(0x7E) == 448 &&
              moe_fp8_e4m3_to_float(0x01) == ldexpf(1, -9) && moe_fp8_e4m3_to_float(0x08) == ldexpf(1, -6) &&
              moe_fp8_e4m3_to_float(0xFE) == -448 && signbit(moe_fp8_e4m3_to_float(0x80)),
          "fp8 e4m3 landmarks");
}

int main(void) {
    test_all_fp8();
    test_all_f16();
    test_hand_picked();
    test_bulk_forms();
    test_all_bf16();
    test_random_sweep();
    return test_finish("test_cast");
}
