/* permute.cu — token rows (fp32) to expert-major rows (bf16) and back, the CUDA versions of
 * kernels/permute_cpu.c. One block per output row (permute) or per token (combine and its backward); each
 * thread walks the row in 16-byte vectors (8 bf16 / 2 x float4) when d % 8 == 0 and every row pointer is
 * 16-byte aligned, else one element at a time. No atomics: each output element is written by one thread,
 * and the k assignments of a token are summed in the order j = 0..k-1 in fp32 with separately rounded
 * multiplies and adds (no FMA contraction), the arithmetic of moe_combine_rows_cpu. dgate is a block
 * reduction in a fixed order (fixed for a given d), so it is the same run after run.
 * Checked against the CPU by tests/test_gpu_permute.cu (suite gpu). */
#include "core/gpu_cuda.h"

#include "kernels/cast_device.cuh"

extern "C" {
#include "kernels/permute.h"
}

namespace {

using moe_cuda::load_bf16;
using moe_cuda::load_f32;
using moe_cuda::store_bf16;
using moe_cuda::store_f32;

constexpr int kWarp = 32;

/* xp[r, :] = bf16(x[perm_token[r], :]); grid = num_rows blocks. */
template <int V>
__global__ void permute_rows_kernel(const float *x, const int *perm_token, int d, uint16_t *xp) {
    const float *src = x + (size_t)perm_token[blockIdx.x] * d;
    uint16_t *dst = xp + (size_t)blockIdx.x * d;
    for (int c = threadIdx.x * V; c < d; c += blockDim.x * V) {
        float v[V];
        load_f32<V>(src + c, v);
        store_bf16<V>(dst + c, v);
    }
}

/* out[t, :] = sum_j gate[t*k+j] * y[slot[t*k+j], :] over kept j, in j order; grid = num_tokens blocks. */
template <int V>
__global__ void combine_rows_kernel(const uint16_t *y, const int *slot, const float *gate, int top_k, int d,
                                    float *out) {
    const size_t a0 = (size_t)blockIdx.x * top_k;
    float *o = out + (size_t)blockIdx.x * d;
    for (int c = threadIdx.x * V; c < d; c += blockDim.x * V) {
        float acc[V];
        for (int i = 0; i < V; i++) acc[i] = 0.0f;
        for (int j = 0; j < top_k; j++) {
            int row = slot[a0 + j];
            if (row < 0) continue;
            float g = gate ? gate[a0 + j] : 1.0f, v[V];
            load_bf16<V>(y + (size_t)row * d + c, v);
            for (int i = 0; i < V; i++) acc[i] = __fadd_rn(acc[i], __fmul_rn(g, v[i]));
        }
        store_f32<V>(o + c, acc);
    }
}

/* Sum of v over the block (blockDim.x a multiple of 32), valid in thread 0. `shared` holds one float per
 * warp; the leading barrier lets a caller reuse it on its next call. */
__device__ float block_sum(float v, float *shared) {
    for (int off = kWarp / 2; off > 0; off /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, off);
    const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, warps = blockDim.x / kWarp;
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < warps ? shared[lane] : 0.0f;
        for (int off = kWarp / 2; off > 0; off /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, off);
    }
    return v;
}

/* For each kept j of token t: dy[slot] = bf16(gate * dout[t]) and dgate = <dout[t], y[slot]>; a dropped j
 * gets dgate 0 and writes no row. The branch on slot is uniform over the block (block_sum's barriers). */
template <int V>
__global__ void combine_backward_kernel(const float *dout, const uint16_t *y, const int *slot, const float *gate,
                                        int top_k, int d, uint16_t *dy, float *dgate) {
    __shared__ float shared[1024 / kWarp];
    const size_t a0 = (size_t)blockIdx.x * top_k;
    const float *dr = dout + (size_t)blockIdx.x * d;
    for (int j = 0; j < top_k; j++) {
        const int row = slot[a0 + j];
        if (row < 0) {
            if (dgate && threadIdx.x == 0) dgate[a0 + j] = 0.0f;
            continue;
        }
        const float g = gate ? gate[a0 + j] : 1.0f;
        const uint16_t *yr = y + (size_t)row * d;
        uint16_t *dyr = dy + (size_t)row * d;
        float dot = 0.0f;
        for (int c = threadIdx.x * V; c < d; c += blockDim.x * V) {
            float dv[V], yv[V], gv[V];
            load_f32<V>(dr + c, dv);
            load_bf16<V>(yr + c, yv);
            for (int i = 0; i < V; i++) {
                dot = fmaf(dv[i], yv[i], dot);
                gv[i] = __fmul_rn(g, dv[i]);
            }
            store_bf16<V>(dyr + c, gv);
        }
        dot = block_sum(dot, shared);
        if (dgate && threadIdx.x == 0) dgate[a0 + j] = dot;
    }
}

bool vector_ok(int d, const void *a, const void *b, const void *c = nullptr) {
    return d % 8 == 0 && moe_cuda::aligned16(a) && moe_cuda::aligned16(b) && (!c || moe_cuda::aligned16(c));
}

int threads_for(int d, bool vec) { return moe_cuda::row_block_threads(vec ? d / 8 : d); }

} // namespace

extern "C" moe_status moe_permute_rows_cuda(moe_gpu *gpu, const float *x, const int *perm_token, int num_rows, int d,
                                            moe_bf16 *xp) {
    if (num_rows < 0 || d < 1) return MOE_ERR_INVALID_ARG;
    if (num_rows == 0) return MOE_OK;
    const bool vec = vector_ok(d, x, xp);
    const int threads = threads_for(d, vec);
    if (vec) permute_rows_kernel<8><<<num_rows, threads, 0, gpu->stream>>>(x, perm_token, d, xp);
    else permute_rows_kernel<1><<<num_rows, threads, 0, gpu->stream>>>(x, perm_token, d, xp);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

extern "C" moe_status moe_combine_rows_cuda(moe_gpu *gpu, const moe_bf16 *y, const int *slot, const float *gate,
                                            int num_tokens, int top_k, int d, float *out) {
    if (num_tokens < 0 || top_k < 1 || d < 1) return MOE_ERR_INVALID_ARG;
    if (num_tokens == 0) return MOE_OK;
    const bool vec = vector_ok(d, y, out);
    const int threads = threads_for(d, vec);
    if (vec) combine_rows_kernel<8><<<num_tokens, threads, 0, gpu->stream>>>(y, slot, gate, top_k, d, out);
    else combine_rows_kernel<1><<<num_tokens, threads, 0, gpu->stream>>>(y, slot, gate, top_k, d, out);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

extern "C" moe_status moe_combine_rows_backward_cuda(moe_gpu *gpu, const float *dout, const moe_bf16 *y,
                                                     const int *slot, const float *gate, int num_tokens, int top_k,
                                                     int d, moe_bf16 *dy, float *dgate) {
    if (num_tokens < 0 || top_k < 1 || d < 1) return MOE_ERR_INVALID_ARG;
    if (num_tokens == 0) return MOE_OK;
    const bool vec = vector_ok(d, dout, y, dy);
    const int threads = threads_for(d, vec);
    if (vec)
        combine_backward_kernel<8><<<num_tokens, threads, 0, gpu->stream>>>(dout, y, slot, gate, top_k, d, dy, dgate);
    else
        combine_backward_kernel<1><<<num_tokens, threads, 0, gpu->stream>>>(dout, y, slot, gate, top_k, d, dy, dgate);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}
