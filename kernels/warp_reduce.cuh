/* warp_reduce.cuh — butterfly reductions over a full warp (all 32 lanes active): every lane ends with the
 * same result, combined in the same fixed order, so the bits do not depend on the launch. */
#ifndef MOE_KERNELS_WARP_REDUCE_CUH
#define MOE_KERNELS_WARP_REDUCE_CUH

constexpr int kWarpSize = 32;

template <typename T> __device__ inline T warp_sum(T v) {
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

__device__ inline float warp_max(float v) {
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}

#endif
