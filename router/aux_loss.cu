/* aux_loss.cu — the router's load-balancing loss and z-loss (formulas in aux_loss.h, as aux_loss_cpu.c)
 * on the GPU, forward and backward, one warp per token. Checked against the CPU by
 * tests/test_gpu_router.cu (build: ninja -C build; run: meson test -C build --suite gpu).
 *
 * The forward sums in double in a fixed order, without atomics, so its bits repeat run after run:
 *   block b takes tokens [b*kTokensPerBlock, (b+1)*kTokensPerBlock), warp w of it the tokens w, w+8, ...
 *   of that chunk; lanes keep their own partial sums, the warp adds them by a butterfly, the block its
 *   warps in order, into partial[b]; one block then adds the partials, each thread a fixed strided subset,
 *   then a fixed tree. The number of blocks depends on num_tokens only, not on the device. */
#include <math.h>

#include "kernels/warp_reduce.cuh"
#include "core/gpu_cuda.h"

extern "C" {
#include "router/aux_loss.h"
}

namespace {

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 8;
constexpr int kThreads = kWarpsPerBlock * kWarp;
constexpr int kTokensPerBlock = 256;
constexpr int kBackwardWarpsPerBlock = 4;

/* logsumexp of one row, the same bits in every lane */
__device__ float warp_logsumexp(const float *l, int num_experts, int lane) {
    float max = -INFINITY, sum = 0.0f;
    for (int e = lane; e < num_experts; e += kWarp) max = fmaxf(max, l[e]);
    max = warp_max(max);
    for (int e = lane; e < num_experts; e += kWarp) sum += expf(l[e] - max);
    return max + logf(warp_sum(sum));
}

/* The normaliser of q: 1 for softmax, sum_e s_e for sigmoid (every lane the same bits). */
__device__ float warp_score_normaliser(moe_score_func func, const float *s, int num_experts, int lane) {
    if (func == MOE_SCORE_SOFTMAX) return 1.0f;
    float sum = 0.0f;
    for (int e = lane; e < num_experts; e += kWarp) sum += s[e];
    return warp_sum(sum);
}

/* partial[2b] = sum over block b's tokens of sum_e n_e q[t,e];  partial[2b+1] = the same of lse_t^2 */
__global__ void losses_partial(moe_score_func func, const float *scores, const float *logits, const int *num_selected,
                               int num_tokens, int num_experts, double *partial) {
    __shared__ double warp_balance[kWarpsPerBlock], warp_z[kWarpsPerBlock];
    int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
    int begin = blockIdx.x * kTokensPerBlock;
    int end = min(num_tokens, begin + kTokensPerBlock);
    double balance = 0.0, z = 0.0;
    for (int t = begin + warp; t < end; t += kWarpsPerBlock) {
        const float *s = scores + (size_t)t * num_experts;
        float norm = warp_score_normaliser(func, s, num_experts, lane);
        for (int e = lane; e < num_experts; e += kWarp) balance += (double)num_selected[e] * (double)(s[e] / norm);
        double lse = warp_logsumexp(logits + (size_t)t * num_experts, num_experts, lane);
        if (lane == 0) z += lse * lse;
    }
    balance = warp_sum(balance);
    if (lane == 0) warp_balance[warp] = balance, warp_z[warp] = z;
    __syncthreads();
    if (threadIdx.x == 0) {
        double b = 0.0, zz = 0.0;
        for (int w = 0; w < kWarpsPerBlock; w++) b += warp_balance[w], zz += warp_z[w];
        partial[2 * blockIdx.x] = b;
        partial[2 * blockIdx.x + 1] = zz;
    }
}

/* One block: the sums of partial[2b], partial[2b+1] over b, then the shares (the CPU's order of operations: E * sum_e
 * (n_e / (T k)) * (sum_t q_te / T), and the z-loss's mean) into total[0..1]. */
__global__ void losses_final(const double *partial, int num_partials, int num_tokens_global, int num_experts,
                             int top_k, double *total) {
    __shared__ double balance[kThreads], z[kThreads];
    double b = 0.0, zz = 0.0;
    for (int i = threadIdx.x; i < num_partials; i += kThreads) b += partial[2 * i], zz += partial[2 * i + 1];
    balance[threadIdx.x] = b, z[threadIdx.x] = zz;
    __syncthreads();
    for (int half = kThreads / 2; half > 0; half /= 2) {
        if (threadIdx.x < half) {
            balance[threadIdx.x] += balance[threadIdx.x + half];
            z[threadIdx.x] += z[threadIdx.x + half];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        total[0] = balance[0] * num_experts / ((double)num_tokens_global * top_k * num_tokens_global);
        total[1] = z[0] / num_tokens_global;
    }
}

/* ds += scale * n_e (softmax);  ds_e += (scale n_e - sum_i scale n_i s_i / S) / S (sigmoid, S = sum_i s_i) */
__global__ void load_balance_backward(moe_score_func func, const float *scores, const int *num_selected,
                                      int num_tokens, int num_experts, float scale, float *dscores) {
    int token = blockIdx.x * kBackwardWarpsPerBlock + threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
    if (token >= num_tokens) return; /* the whole warp */
    const float *s = scores + (size_t)token * num_experts;
    float *ds = dscores + (size_t)token * num_experts;
    if (func == MOE_SCORE_SOFTMAX) {
        for (int e = lane; e < num_experts; e += kWarp) ds[e] += scale * num_selected[e];
        return;
    }
    float sum = warp_score_normaliser(func, s, num_experts, lane), dot = 0.0f;
    for (int e = lane; e < num_experts; e += kWarp) dot += scale * num_selected[e] * s[e] / sum;
    dot = warp_sum(dot);
    for (int e = lane; e < num_experts; e += kWarp) ds[e] += (scale * num_selected[e] - dot) / sum;
}

/* dl += coef * (2/T) * lse * softmax(l) */
__global__ void z_loss_backward(const float *logits, int num_tokens, int num_tokens_global, int num_experts,
                                float coef, float *dlogits) {
    int token = blockIdx.x * kBackwardWarpsPerBlock + threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
    if (token >= num_tokens) return;
    const float *l = logits + (size_t)token * num_experts;
    float *dl = dlogits + (size_t)token * num_experts;
    float lse = warp_logsumexp(l, num_experts, lane), scale = coef * 2 * lse / num_tokens_global;
    for (int e = lane; e < num_experts; e += kWarp) dl[e] += scale * expf(l[e] - lse);
}

bool bad_shape(int num_tokens, int num_tokens_global, int num_experts) {
    return num_tokens < 0 || num_tokens_global < num_tokens || num_experts < 1;
}

int backward_blocks(int num_tokens) { return (num_tokens + kBackwardWarpsPerBlock - 1) / kBackwardWarpsPerBlock; }

} // namespace

extern "C" moe_status moe_router_losses_queue_cuda(moe_gpu *gpu, moe_score_func func, const float *scores,
                                                   const float *logits, const int *num_selected, int num_tokens,
                                                   int num_tokens_global, int num_experts, int top_k, double *loss) {
    if (bad_shape(num_tokens, num_tokens_global, num_experts) || top_k < 1) return MOE_ERR_INVALID_ARG;
    if (num_tokens == 0) return loss[0] = loss[1] = 0.0, MOE_OK;
    /* scratch: partial [2 * blocks] doubles, then total [2] doubles (a later call's kernels, queued after this
     * call's copy, overwrite them only once it is done) */
    int blocks = (num_tokens + kTokensPerBlock - 1) / kTokensPerBlock;
    void *scratch = NULL;
    MOE_TRY(moe_gpu_scratch(gpu, (size_t)(2 * blocks + 2) * sizeof(double), &scratch));
    double *partial = (double *)scratch, *total = partial + 2 * (size_t)blocks;
    losses_partial<<<blocks, kThreads, 0, gpu->stream>>>(func, scores, logits, num_selected, num_tokens, num_experts,
                                                         partial);
    MOE_CUDA_LAUNCHED();
    losses_final<<<1, kThreads, 0, gpu->stream>>>(partial, blocks, num_tokens_global, num_experts, top_k, total);
    MOE_CUDA_LAUNCHED();
    MOE_CUDA_TRY(cudaMemcpyAsync(loss, total, 2 * sizeof(double), cudaMemcpyDeviceToHost, gpu->stream));
    return MOE_OK;
}

extern "C" moe_status moe_router_losses_cuda(moe_gpu *gpu, moe_score_func func, const float *scores,
                                             const float *logits, const int *num_selected, int num_tokens,
                                             int num_tokens_global, int num_experts, int top_k, double loss[2]) {
    MOE_TRY(moe_router_losses_queue_cuda(gpu, func, scores, logits, num_selected, num_tokens, num_tokens_global,
                                         num_experts, top_k, loss));
    return num_tokens > 0 ? moe_gpu_wait(gpu, "router: aux and z losses") : MOE_OK;
}

extern "C" moe_status moe_router_load_balance_loss_backward_cuda(moe_gpu *gpu, moe_score_func func, const float *scores,
                                                                 const int *num_selected, int num_tokens,
                                                                 int num_tokens_global, int num_experts, int top_k,
                                                                 float coef, float *dscores) {
    if (bad_shape(num_tokens, num_tokens_global, num_experts) || top_k < 1) return MOE_ERR_INVALID_ARG;
    if (num_tokens == 0) return MOE_OK;
    /* dL/dq[t,e] = scale * n_e = coef * E * f_e / T, in float as the CPU computes it */
    float scale = coef * (float)num_experts / ((float)num_tokens_global * top_k * num_tokens_global);
    load_balance_backward<<<backward_blocks(num_tokens), kBackwardWarpsPerBlock * kWarp, 0, gpu->stream>>>(
        func, scores, num_selected, num_tokens, num_experts, scale, dscores);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

extern "C" moe_status moe_router_z_loss_backward_cuda(moe_gpu *gpu, const float *logits, int num_tokens,
                                                      int num_tokens_global, int num_experts, float coef,
                                                      float *dlogits) {
    if (bad_shape(num_tokens, num_tokens_global, num_experts)) return MOE_ERR_INVALID_ARG;
    if (num_tokens == 0) return MOE_OK;
    z_loss_backward<<<backward_blocks(num_tokens), kBackwardWarpsPerBlock * kWarp, 0, gpu->stream>>>(
        logits, num_tokens, num_tokens_global, num_experts, coef, dlogits);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}
