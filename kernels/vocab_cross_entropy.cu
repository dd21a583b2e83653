/* vocab_cross_entropy.cu — the vocabulary-parallel cross-entropy's per-row parts on the GPU (vocab_cross_entropy.h;
 * the CPU twin: vocab_cross_entropy_cpu.c), with kernels/cross_entropy.cu's formulas and block shape: one block of 256
 * threads per row (max, backward) or per (row, piece) (sums), reduced in block_reduce.cuh's fixed order, so a piece's
 * sum depends on its width alone. Checked by tests/test_gpu_tp_pieces.c (suite gpu). */
#include <math.h>

#include "core/gpu_cuda.h"

#include "kernels/block_reduce.cuh"

extern "C" {
#include "kernels/vocab_cross_entropy.h"
}

namespace {

constexpr int kRowThreads = 256;

__global__ void row_max_kernel(const float *logits, int width, float *max) {
    __shared__ float shared[kRowThreads / kWarpSize];
    const float *l = logits + (size_t)blockIdx.x * width;
    float m = -INFINITY;
    for (int i = threadIdx.x; i < width; i += blockDim.x) m = fmaxf(m, l[i]);
    m = block_max(m, shared);
    if (threadIdx.x == 0) max[blockIdx.x] = m;
}

/* block (t, j): piece j of row t; the target's logit by the piece that holds its column (0 from the rest of piece 0) */
__global__ void piece_sums_kernel(const float *logits, const float *max, const int *targets, int T, int width,
                                  int piece, int first, double *sums, double *target) {
    __shared__ double shared[kRowThreads / kWarpSize];
    const int t = blockIdx.x, j = blockIdx.y;
    const float *l = logits + (size_t)t * width + (size_t)j * piece;
    const float m = max[t];
    double sum = 0;
    for (int i = threadIdx.x; i < piece; i += blockDim.x) sum += (double)expf(l[i] - m);
    sum = block_sum(sum, shared);
    if (threadIdx.x != 0) return;
    sums[(size_t)j * T + t] = sum;
    const int c = targets[t] - first;
    const int held = c >= 0 && c < width;
    if (held && c / piece == j) target[t] = (double)logits[(size_t)t * width + c];
    else if (!held && j == 0) target[t] = 0.0;
}

__global__ void backward_kernel(float *logits, const float *max, const double *z, const int *targets, int width,
                                int first, float scale) {
    const size_t t = blockIdx.x;
    float *l = logits + t * width;
    const float m = max[t], k = (float)(scale / z[t]);
    for (int i = threadIdx.x; i < width; i += blockDim.x) l[i] = __fmul_rn(expf(l[i] - m), k);
    __syncthreads(); /* the target's scaled value is written before thread 0 subtracts from it */
    const int c = targets[t] - first;
    if (threadIdx.x == 0 && c >= 0 && c < width) l[c] = __fsub_rn(l[c], scale);
}

bool bad_shape(int T, int width, int piece) { return T < 0 || width < 1 || piece < 1 || width % piece; }

} // namespace

extern "C" moe_status moe_vocab_row_max_cuda(moe_gpu *gpu, const float *logits, int num_tokens, int width,
                                             float *max) {
    if (bad_shape(num_tokens, width, 1) || (num_tokens && (!logits || !max))) return MOE_ERR_INVALID_ARG;
    if (num_tokens == 0) return MOE_OK;
    row_max_kernel<<<num_tokens, kRowThreads, 0, gpu->stream>>>(logits, width, max);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

extern "C" moe_status moe_vocab_piece_sums_cuda(moe_gpu *gpu, const float *logits, const float *max,
                                                const int *targets, int num_tokens, int width, int piece, int first,
                                                double *sums, double *target) {
    if (bad_shape(num_tokens, width, piece) || (num_tokens && (!logits || !max || !targets || !sums || !target)))
        return MOE_ERR_INVALID_ARG;
    if (num_tokens == 0) return MOE_OK;
    const dim3 grid((unsigned)num_tokens, (unsigned)(width / piece));
    piece_sums_kernel<<<grid, kRowThreads, 0, gpu->stream>>>(logits, max, targets, num_tokens, width, piece, first,
                                                              sums, target);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

extern "C" moe_status moe_vocab_backward_cuda(moe_gpu *gpu, float *logits, const float *max, const double *z,
                                              const int *targets, int num_tokens, int width, int first, float scale) {
    if (bad_shape(num_tokens, width, 1) || (num_tokens && (!logits || !max || !z || !targets)))
        return MOE_ERR_INVALID_ARG;
    if (num_tokens == 0) return MOE_OK;
    backward_kernel<<<num_tokens, kRowThreads, 0, gpu->stream>>>(logits, max, z, targets, width, first, scale);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}
