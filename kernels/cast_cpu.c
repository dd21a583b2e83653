/* cast_cpu.c — fp32 <-> bf16 on the bit pattern: bf16 is the top half of an IEEE float, rounded to nearest,
 * ties to even. The GPU kernels (kernels/cast.cu, kernels/cast_device.cuh) give the same bits.
 *   finite x:  bits + 0x7FFF + (bit 16 of bits), then the top 16 bits — a carry out of the mantissa moves
 *              into the exponent, so values that round past the largest bf16 become inf, as they should;
 *   NaN:       the top 16 bits with the quiet bit (0x0040) set: sign kept, never rounded into an inf;
 *   inf, zero: unchanged (the low half is zero), the sign kept.
 * f16 -> fp32: the exponent rebased from 15 to 127; a subnormal half (exponent 0) is normalised by shifting its
 * mantissa up until the leading 1 reaches the implicit bit, lowering the exponent once per shift.
 * Tested by tests/test_cast.c (suite unit) against a rounding written out in double. */
#include "kernels/cast.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/threads.h"

/* moe_bf16_bits (cast.h) is branchless, so that the bulk loops below vectorise. */

moe_bf16 moe_bf16_from_float(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return (moe_bf16)moe_bf16_bits(u);
}

void moe_bf16_from_float_n(const float *x, size_t n, moe_bf16 *out) {
    MOE__PARALLEL_FOR(n >= MOE__PAR_MIN_ELEMS,
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, x + i, sizeof u);
        out[i] = (moe_bf16)moe_bf16_bits(u);
    });
}

void moe_bf16_round_n(const float *x, size_t n, float *out) {
    MOE__PARALLEL_FOR(n >= MOE__PAR_MIN_ELEMS,
    for (size_t i = 0; i < n; i++) out[i] = moe_bf16_round_inline(x[i]));
}

float moe_bf16_to_float(moe_bf16 x) {
    uint32_t u = (uint32_t)x << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float moe_bf16_round(float x) { return moe_bf16_round_inline(x); }

float moe_fp8_e4m3_to_float(uint8_t b) {
    const int exp = (b >> 3) & 0xF, mant = b & 7;
    const float magnitude = exp == 15 && mant == 7 ? NAN : exp ? ldexpf((float)(8 + mant), exp - 10) /* 1.m 2^(e-7) */
                                                            : ldexpf((float)mant, -9);
    return b & 0x80 ? -magnitude : magnitude;
}

float moe_f16_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1Fu, mant = h & 0x3FFu, u;
    if (exp == 0x1F) { /* inf or NaN: the mantissa kept in the top bits */
        u = sign | 0x7F800000u | mant << 13;
    } else if (exp) {
        u = sign | (exp + 127 - 15) << 23 | mant << 13;
    } else if (!mant) {
        u = sign; /* signed zero */
    } else { /* subnormal: mant * 2^-24; normalise */
        exp = 127 - 15 + 1;
        while (!(mant & 0x400u)) mant <<= 1, exp--;
        u = sign | exp << 23 | (mant & 0x3FFu) << 13;
    }
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
