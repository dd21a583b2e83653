/* nonfinite.cu — the index of the first NaN or Inf of a device array (nonfinite.h), or -1. Each thread scans
 * its grid-stride slice in index order and stops at its first hit; the slices' firsts meet in a warp minimum
 * and one 64-bit integer atomicMin per warp (a minimum of integers: the same whatever the order). The answer
 * starts as ULLONG_MAX (no hit) and is copied to the host. Checked against moe_find_nonfinite_cpu by
 * tests/test_gpu_dense_ops_a.cu (suite gpu). */
#include "core/gpu_cuda.h"

extern "C" {
#include "kernels/nonfinite.h"
}

namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 65535;
constexpr unsigned long long kNone = ~0ull;

/* exponent all ones: Inf or NaN */
__device__ __forceinline__ bool nonfinite(float x) { return (__float_as_uint(x) & 0x7F800000u) == 0x7F800000u; }

__global__ void first_nonfinite(const float *a, size_t n, unsigned long long *first) {
    unsigned long long mine = kNone;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        if (nonfinite(a[i])) {
            mine = i;
            break;
        }
    /* every lane reaches here (the loop has no barrier), so the full-mask shuffles are safe */
    for (int off = 16; off > 0; off /= 2) {
        unsigned long long other = __shfl_xor_sync(0xFFFFFFFFu, mine, off);
        mine = other < mine ? other : mine;
    }
    if (threadIdx.x % 32 == 0 && mine != kNone) atomicMin(first, mine);
}

} // namespace

extern "C" moe_status moe_find_nonfinite_cuda(moe_gpu *gpu, const float *a, size_t count, long long *first) {
    if (!first || (count > 0 && !a)) return MOE_ERR_INVALID_ARG;
    *first = -1;
    if (count == 0) return MOE_OK;
    void *scratch = NULL;
    MOE_TRY(moe_gpu_scratch(gpu, sizeof(unsigned long long), &scratch));
    unsigned long long *d_first = (unsigned long long *)scratch, host = kNone;
    MOE_CUDA_TRY(cudaMemsetAsync(d_first, 0xFF, sizeof *d_first, gpu->stream)); /* kNone */
    size_t blocks = (count + kThreads - 1) / kThreads;
    first_nonfinite<<<blocks > (size_t)kMaxBlocks ? kMaxBlocks : (int)blocks, kThreads, 0, gpu->stream>>>(a, count,
                                                                                                       d_first);
    MOE_CUDA_LAUNCHED();
    MOE_CUDA_TRY(cudaMemcpyAsync(&host, d_first, sizeof host, cudaMemcpyDeviceToHost, gpu->stream));
    MOE_TRY(moe_gpu_wait(gpu, "non-finite check"));
    *first = host == kNone ? -1 : (long long)host;
    return MOE_OK;
}
