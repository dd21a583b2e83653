/* cast.h — fp32 <-> bf16 (round to nearest even, NaN kept a quiet NaN), on the CPU and the GPU; and IEEE half
 * (f16) -> fp32 on the CPU, for loading checkpoints stored in F16.
 * The CPU versions are the reference the GPU tests compare against, and let CPU code build bf16-rounded
 * inputs for tolerance tables. */
#ifndef MOE_KERNELS_CAST_H
#define MOE_KERNELS_CAST_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/gpu.h"

moe_bf16 moe_bf16_from_float(float x);
float moe_bf16_to_float(moe_bf16 x);
/* x rounded to bf16 and back: what a value keeps of itself when stored as bf16. */
float moe_bf16_round(float x);
/* The rounding on the bit pattern (why it is exact: cast_cpu.c), inline so that a loop that rounds its results as it
 * writes them vectorises: the bf16 bits of the float with bits u, and x rounded to bf16 and back (moe_bf16_round). */
static inline uint32_t moe_bf16_bits(uint32_t u) { /* branchless: both results formed, one selected */
    const uint32_t quiet_nan = (u >> 16) | 0x0040u, rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    return (u & 0x7FFFFFFFu) > 0x7F800000u ? quiet_nan : rounded;
}
static inline float moe_bf16_round_inline(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    u = moe_bf16_bits(u) << 16;
    memcpy(&x, &u, sizeof x);
    return x;
}
/* The same for n values at once (vectorised; the bits of the scalar forms). */
void moe_bf16_from_float_n(const float *x, size_t n, moe_bf16 *out);
void moe_bf16_round_n(const float *x, size_t n, float *out);
/* IEEE binary16 bits -> float, exactly (every half value, subnormals included, is a float): infinities stay
 * infinities, a NaN stays a NaN with its sign and its payload in the top mantissa bits. */
float moe_f16_to_float(uint16_t h);
/* OCP FP8 E4M3 ("e4m3fn", safetensors' F8_E4M3: DeepSeek-V3's released weights) bits -> float, exactly: sign, 4
 * exponent bits of bias 7, 3 mantissa bits; subnormals m 2^-9; no infinities; S.1111.111 is NaN (largest: 448). */
float moe_fp8_e4m3_to_float(uint8_t b);

/* CUDA: n values, device pointers, queued on gpu's stream (no host sync). */
moe_status moe_cast_f32_to_bf16_cuda(moe_gpu *gpu, const float *in, size_t n, moe_bf16 *out);
moe_status moe_cast_bf16_to_f32_cuda(moe_gpu *gpu, const moe_bf16 *in, size_t n, float *out);
/* out = in rounded to bf16 and kept as fp32 (moe_bf16_round_n's bits; out may be in). */
moe_status moe_bf16_round_cuda(moe_gpu *gpu, const float *in, size_t n, float *out);

#endif
