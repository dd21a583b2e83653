/* cast_device.cuh — what the CUDA kernels of kernels/ and experts/ share to read and write bf16 rows:
 * the rounding of kernels/cast_cpu.c bit for bit (round to nearest even; NaN -> quiet NaN with its sign,
 * where the hardware conversion would give the canonical 0x7FFF), and loads and stores of V consecutive
 * elements: V = 8 is one 16-byte access (uint4 of 8 bf16, two float4 of 4 floats; the pointer must be
 * 16-byte aligned), V = 1 the scalar path for rows whose width or alignment does not allow it.
 * CUDA C++ only; include it outside any extern "C" block. */
#ifndef MOE_KERNELS_CAST_DEVICE_CUH
#define MOE_KERNELS_CAST_DEVICE_CUH

#include <cuda_bf16.h>
#include <stdint.h>

namespace moe_cuda {

/* bf16 bits of x: __float2bfloat16_rn (cvt.rn.bf16.f32) for everything but NaN. */
__device__ __forceinline__ uint16_t bf16_bits(float x) {
    uint32_t u = __float_as_uint(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x0040u);
    return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}

__device__ __forceinline__ float bf16_value(uint16_t b) { return __uint_as_float((uint32_t)b << 16); }

/* Two bf16 in one 32-bit word, the lower address in the low half (little endian). */
__device__ __forceinline__ uint32_t bf16_pack2(float lo, float hi) {
    return (uint32_t)bf16_bits(lo) | ((uint32_t)bf16_bits(hi) << 16);
}
__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xFFFF0000u); }

/* True when p may be accessed 16 bytes at a time. */
__host__ __device__ __forceinline__ bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

template <int V>
__device__ __forceinline__ void load_f32(const float *p, float *v) {
    static_assert(V == 1 || V == 8, "V is 1 or 8");
    if constexpr (V == 8) {
        float4 a = reinterpret_cast<const float4 *>(p)[0], b = reinterpret_cast<const float4 *>(p)[1];
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    } else {
        v[0] = p[0];
    }
}

template <int V>
__device__ __forceinline__ void store_f32(float *p, const float *v) {
    static_assert(V == 1 || V == 8, "V is 1 or 8");
    if constexpr (V == 8) {
        reinterpret_cast<float4 *>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
        reinterpret_cast<float4 *>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
    } else {
        p[0] = v[0];
    }
}

template <int V>
__device__ __forceinline__ void load_bf16(const uint16_t *p, float *v) {
    static_assert(V == 1 || V == 8, "V is 1 or 8");
    if constexpr (V == 8) {
        uint4 u = *reinterpret_cast<const uint4 *>(p);
        v[0] = bf16_lo(u.x), v[1] = bf16_hi(u.x), v[2] = bf16_lo(u.y), v[3] = bf16_hi(u.y);
        v[4] = bf16_lo(u.z), v[5] = bf16_hi(u.z), v[6] = bf16_lo(u.w), v[7] = bf16_hi(u.w);
    } else {
        v[0] = bf16_value(p[0]);
    }
}

template <int V>
__device__ __forceinline__ void store_bf16(uint16_t *p, const float *v) {
    static_assert(V == 1 || V == 8, "V is 1 or 8");
    if constexpr (V == 8) {
        uint4 u;
        u.x = bf16_pack2(v[0], v[1]), u.y = bf16_pack2(v[2], v[3]);
        u.z = bf16_pack2(v[4], v[5]), u.w = bf16_pack2(v[6], v[7]);
        *reinterpret_cast<uint4 *>(p) = u;
    } else {
        p[0] = bf16_bits(v[0]);
    }
}

/* Threads for a block that walks one row of `count` V-vectors: a whole number of warps, at most 256. */
__host__ __forceinline__ int row_block_threads(int count) {
    int t = (count + 31) / 32 * 32;
    return t < 32 ? 32 : t > 256 ? 256 : t;
}

} // namespace moe_cuda

#endif
