/* rmsnorm.cu — RMSNorm forward and backward on the GPU (formulas: rmsnorm.h; the CPU twin: rmsnorm_cpu.c).
 * One block per token for y, rstd and dx: the row sums (sum x^2, sum dy w x) in double, as on the CPU, reduced
 * in a fixed order (block_reduce.cuh). dw[i] = sum_t dy[t,i] x[t,i] rstd[t] is a sum over tokens: each block
 * of dw_partial sums one fixed chunk of tokens in token order (in double) for 256 columns, and dw_finish adds
 * the chunks in chunk order: no atomics, so the bits depend only on num_tokens and d.
 * Element-wise products use __fmul_rn / __fadd_rn, which nvcc never contracts into an FMA: the CPU build
 * (x86-64 baseline) has no FMA, so y agrees bit for bit when rstd does.
 * Checked by tests/test_gpu_dense_ops_b.cu (build: ninja -C build; run: meson test -C build --suite gpu). */
#include "core/gpu_cuda.h"

#include "kernels/block_reduce.cuh"

extern "C" {
#include "kernels/rmsnorm.h"
}

namespace {

constexpr int kRowThreads = 256;       /* one block per token */
constexpr int kColThreads = 256;       /* dw: columns per block */
constexpr int kMinTokensPerChunk = 64; /* dw: tokens per partial sum (more when there are > kMaxChunks) */
constexpr int kMaxChunks = 4096;       /* bounds the scratch to kMaxChunks * d doubles */

__global__ void rmsnorm_forward_kernel(const float *x, const float *w, int d, float eps, float *y, float *rstd) {
    __shared__ double shared[kRowThreads / kWarpSize];
    const size_t t = blockIdx.x;
    const float *xr = x + t * d;
    float *yr = y + t * d;
    double ss = 0;
    for (int i = threadIdx.x; i < d; i += blockDim.x) ss += (double)xr[i] * xr[i];
    ss = block_sum(ss, shared);
    const float r = (float)(1 / sqrt(ss / d + (double)eps));
    if (threadIdx.x == 0) rstd[t] = r;
    for (int i = threadIdx.x; i < d; i += blockDim.x) yr[i] = __fmul_rn(__fmul_rn(xr[i], r), w[i]);
}

/* dx[t, i] += r (dy_i w_i - x_i c),  c = (float)(sum_i dy_i w_i x_i / d) r^2 */
__global__ void rmsnorm_backward_dx(const float *x, const float *w, const float *rstd, const float *dy, int d,
                                    float *dx) {
    __shared__ double shared[kRowThreads / kWarpSize];
    const size_t t = blockIdx.x;
    const float *xr = x + t * d, *dyr = dy + t * d;
    float *dxr = dx + t * d;
    const float r = rstd[t];
    double dot = 0;
    for (int i = threadIdx.x; i < d; i += blockDim.x) dot += (double)dyr[i] * w[i] * xr[i];
    dot = block_sum(dot, shared);
    const float c = __fmul_rn(__fmul_rn((float)(dot / d), r), r);
    for (int i = threadIdx.x; i < d; i += blockDim.x)
        dxr[i] = __fadd_rn(dxr[i], __fmul_rn(r, __fsub_rn(__fmul_rn(dyr[i], w[i]), __fmul_rn(xr[i], c))));
}

/* partial[chunk, i] = sum over the chunk's tokens, in order, of dy[t, i] x[t, i] rstd[t] (each term the
 * CPU's float product) */
__global__ void rmsnorm_dw_partial(const float *x, const float *rstd, const float *dy, int num_tokens, int d,
                                   int tokens_per_chunk, double *partial) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= d) return;
    const int t0 = blockIdx.y * tokens_per_chunk;
    const int t1 = t0 + tokens_per_chunk < num_tokens ? t0 + tokens_per_chunk : num_tokens;
    double sum = 0;
    for (int t = t0; t < t1; t++) {
        const size_t at = (size_t)t * d + i;
        sum += (double)__fmul_rn(__fmul_rn(dy[at], x[at]), rstd[t]);
    }
    partial[(size_t)blockIdx.y * d + i] = sum;
}

/* dw[i] += the chunks' sums, added in chunk order */
__global__ void rmsnorm_dw_finish(const double *partial, int num_chunks, int d, float *dw) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= d) return;
    double sum = 0;
    for (int c = 0; c < num_chunks; c++) sum += partial[(size_t)c * d + i];
    dw[i] = (float)((double)dw[i] + sum);
}

} // namespace

extern "C" moe_status moe_rmsnorm_forward_cuda(moe_gpu *gpu, const float *x, const float *w, int num_tokens, int d,
                                               float eps, float *y, float *rstd) {
    if (num_tokens < 0 || d < 1 || !x || !w || !y || !rstd) return MOE_ERR_INVALID_ARG;
    if (num_tokens == 0) return MOE_OK;
    rmsnorm_forward_kernel<<<num_tokens, kRowThreads, 0, gpu->stream>>>(x, w, d, eps, y, rstd);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

extern "C" moe_status moe_rmsnorm_backward_cuda(moe_gpu *gpu, const float *x, const float *w, const float *rstd,
                                                const float *dy, int num_tokens, int d, float *dx, float *dw) {
    if (num_tokens < 0 || d < 1 || !x || !w || !rstd || !dy || !dx || !dw) return MOE_ERR_INVALID_ARG;
    if (num_tokens == 0) return MOE_OK; /* += of an empty sum */
    rmsnorm_backward_dx<<<num_tokens, kRowThreads, 0, gpu->stream>>>(x, w, rstd, dy, d, dx);
    MOE_CUDA_LAUNCHED();
    int tokens_per_chunk = (num_tokens + kMaxChunks - 1) / kMaxChunks;
    if (tokens_per_chunk < kMinTokensPerChunk) tokens_per_chunk = kMinTokensPerChunk;
    const int num_chunks = (num_tokens + tokens_per_chunk - 1) / tokens_per_chunk;
    void *scratch = NULL; /* partial: [num_chunks, d] doubles */
    moe_status st = moe_gpu_scratch(gpu, (size_t)num_chunks * d * sizeof(double), &scratch);
    if (st != MOE_OK) return st;
    double *partial = (double *)scratch;
    const unsigned col_blocks = (unsigned)((d + kColThreads - 1) / kColThreads);
    rmsnorm_dw_partial<<<dim3(col_blocks, (unsigned)num_chunks), kColThreads, 0, gpu->stream>>>(
        x, rstd, dy, num_tokens, d, tokens_per_chunk, partial);
    MOE_CUDA_LAUNCHED();
    rmsnorm_dw_finish<<<col_blocks, kColThreads, 0, gpu->stream>>>(partial, num_chunks, d, dw);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}
