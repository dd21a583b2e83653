/* block_reduce.cuh — sums and maxima over a whole thread block (blockDim.x a multiple of 32, every thread
 * calling): an xor-butterfly per warp (warp_reduce.cuh), then the warps' results added in warp order by
 * every thread. The order depends only on blockDim.x, so a kernel launched with a fixed block size gives
 * the same bits run after run, and every thread returns the same value. */
#ifndef MOE_KERNELS_BLOCK_REDUCE_CUH
#define MOE_KERNELS_BLOCK_REDUCE_CUH

#include "kernels/warp_reduce.cuh"

struct SumOp {
    template <typename T> __device__ T operator()(T a, T b) const { return a + b; }
};
struct MaxOp {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

/* Combines the warps' results (each already reduced over its warp) in warp order. shared: blockDim.x / 32
 * slots. The leading barrier lets a kernel reuse `shared` for consecutive reductions: no warp overwrites a
 * slot another warp may still be reading from the previous call. */
template <typename T, typename Op> __device__ inline T combine_warps(T warp_value, T *shared, Op op) {
    const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize, num_warps = blockDim.x / kWarpSize;
    __syncthreads();
    if (lane == 0) shared[warp] = warp_value;
    __syncthreads();
    T total = shared[0];
    for (int w = 1; w < num_warps; w++) total = op(total, shared[w]);
    return total;
}

template <typename T> __device__ inline T block_sum(T v, T *shared) { return combine_warps(warp_sum(v), shared, SumOp()); }

__device__ inline float block_max(float v, float *shared) { return combine_warps(warp_max(v), shared, MaxOp()); }

#endif
