/* tree_add.cu — y = lower + higher on the device (tree_add_cuda.h), the bits of moe_tree_add_f32_cpu: each sum is
 * written as __fadd_rn, one IEEE round-to-nearest addition, as the CPU's (built with -ffp-contract=off) is.
 * Checked against the CPU twin by tests/test_gpu_tree_allreduce.c (meson test --suite gpu; 77 without a GPU). */
#include "core/gpu_cuda.h"

#include "alltoall/tree_add_cuda.h"

namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 65535;

__global__ void tree_add_kernel(float *y, const float *lower, const float *higher, size_t count) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x)
        y[i] = __fadd_rn(lower[i], higher[i]);
}

} // namespace

extern "C" moe_status moe__tree_add_f32_cuda(cudaStream_t stream, float *y, const float *lower, const float *higher,
                                             size_t count) {
    if (count == 0) return MOE_OK;
    if (!y || !lower || !higher) return MOE_ERR_INVALID_ARG;
    const size_t blocks = (count + kThreads - 1) / kThreads;
    tree_add_kernel<<<blocks > (size_t)kMaxBlocks ? kMaxBlocks : (int)blocks, kThreads, 0, stream>>>(y, lower, higher,
                                                                                                      count);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}
