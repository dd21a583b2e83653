/* cast.cu — fp32 <-> bf16 over n elements on the GPU, and fp32 rounded to bf16 kept as fp32, the bits of
 * kernels/cast_cpu.c (round to nearest even, NaN kept a quiet NaN with its sign). A grid-stride loop; n may
 * exceed 2^31. Checked by tests/test_gpu_cast.cu (suite gpu): every element bitwise against the CPU cast;
 * the rounding by tests/test_gpu_dense_ops_a.cu against moe_round_bf16_cpu. */
#include "core/gpu_cuda.h"

#include "kernels/cast_device.cuh"

extern "C" {
#include "kernels/cast.h"
}

namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 65535;

__global__ void f32_to_bf16(const float *in, size_t n, uint16_t *out) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = moe_cuda::bf16_bits(in[i]);
}

__global__ void bf16_to_f32(const uint16_t *in, size_t n, float *out) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = moe_cuda::bf16_value(in[i]);
}

__global__ void round_bf16(const float *in, size_t n, float *out) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = moe_cuda::bf16_value(moe_cuda::bf16_bits(in[i]));
}

int blocks_for(size_t n) {
    size_t b = (n + kThreads - 1) / kThreads;
    return b > (size_t)kMaxBlocks ? kMaxBlocks : (int)b;
}

} // namespace

extern "C" moe_status moe_cast_f32_to_bf16_cuda(moe_gpu *gpu, const float *in, size_t n, moe_bf16 *out) {
    if (n == 0) return MOE_OK;
    if (!in || !out) return MOE_ERR_INVALID_ARG;
    f32_to_bf16<<<blocks_for(n), kThreads, 0, gpu->stream>>>(in, n, out);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

extern "C" moe_status moe_cast_bf16_to_f32_cuda(moe_gpu *gpu, const moe_bf16 *in, size_t n, float *out) {
    if (n == 0) return MOE_OK;
    if (!in || !out) return MOE_ERR_INVALID_ARG;
    bf16_to_f32<<<blocks_for(n), kThreads, 0, gpu->stream>>>(in, n, out);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

extern "C" moe_status moe_bf16_round_cuda(moe_gpu *gpu, const float *in, size_t n, float *out) {
    if (n == 0) return MOE_OK;
    if (!in || !out) return MOE_ERR_INVALID_ARG;
    round_bf16<<<blocks_for(n), kThreads, 0, gpu->stream>>>(in, n, out);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}
