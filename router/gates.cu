/* gates.cu — gate weights from the scores of the chosen experts, and their backward, one thread per token:
 * the sums over the k choices run in j order as in gates_cpu.c. Checked against it by
 * tests/test_gpu_router.cu (build: ninja -C build; run: meson test -C build --suite gpu). */
#include "core/gpu_cuda.h"

extern "C" {
#include "router/gates.h"
}

namespace {

constexpr int kThreads = 128;

__global__ void gates_forward(const float *scores, const int *expert, int num_tokens, int num_experts, int top_k,
                              int renormalize, float scale, float *expert_score, float *gate) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= num_tokens) return;
    const float *s = scores + (size_t)t * num_experts;
    const int *e = expert + (size_t)t * top_k;
    float *es = expert_score + (size_t)t * top_k, *g = gate + (size_t)t * top_k, sum = 0.0f;
    for (int j = 0; j < top_k; j++) {
        float v = s[e[j]];
        es[j] = v;
        g[j] = v;
        sum += v;
    }
    if (renormalize) { /* sum + 1e-20, as gates_cpu.c's renormalizer: sigmoid scores all 0 give gates of 0 */
        const float denominator = __fadd_rn(sum, 1e-20f);
        for (int j = 0; j < top_k; j++) g[j] /= denominator;
    }
    for (int j = 0; j < top_k; j++) g[j] = __fmul_rn(g[j], scale);
}

/* with dg_j = scale dL/dgate_j: plain: ds[e_j] += dg_j;  renormalised: ds[e_j] += (dg_j - sum_i dg_i g_i) / sum_i
 * s[e_i], g_i = s[e_i] / sum formed again from the scores */
__global__ void gates_backward(const float *scores, const int *expert, const float *dgate, int num_tokens,
                               int num_experts, int top_k, int renormalize, float scale, float *dscores) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= num_tokens) return;
    const float *s = scores + (size_t)t * num_experts;
    const int *e = expert + (size_t)t * top_k;
    const float *dg = dgate + (size_t)t * top_k;
    float *ds = dscores + (size_t)t * num_experts;
    if (!renormalize) {
        for (int j = 0; j < top_k; j++) ds[e[j]] += __fmul_rn(dg[j], scale);
        return;
    }
    float sum = 0.0f, dot = 0.0f;
    for (int j = 0; j < top_k; j++) sum += s[e[j]];
    sum = __fadd_rn(sum, 1e-20f); /* the forward's denominator */
    for (int j = 0; j < top_k; j++) dot += __fmul_rn(__fmul_rn(dg[j], scale), s[e[j]] / sum);
    for (int j = 0; j < top_k; j++) ds[e[j]] += (__fmul_rn(dg[j], scale) - dot) / sum;
}

bool bad_shape(int num_tokens, int num_experts, int top_k) {
    return num_tokens < 0 || num_experts < 1 || top_k < 1 || top_k > num_experts;
}

} // namespace

extern "C" moe_status moe_router_gates_cuda(moe_gpu *gpu, const float *scores, const int *expert, int num_tokens,
                                            int num_experts, int top_k, int renormalize, float scale,
                                            float *expert_score, float *gate) {
    if (bad_shape(num_tokens, num_experts, top_k)) return MOE_ERR_INVALID_ARG;
    if (num_tokens == 0) return MOE_OK;
    gates_forward<<<(num_tokens + kThreads - 1) / kThreads, kThreads, 0, gpu->stream>>>(
        scores, expert, num_tokens, num_experts, top_k, renormalize, scale, expert_score, gate);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

extern "C" moe_status moe_router_gates_backward_cuda(moe_gpu *gpu, const float *scores, const int *expert,
                                                     const float *dgate, int num_tokens, int num_experts, int top_k,
                                                     int renormalize, float scale, float *dscores) {
    if (bad_shape(num_tokens, num_experts, top_k)) return MOE_ERR_INVALID_ARG;
    if (num_tokens == 0) return MOE_OK;
    gates_backward<<<(num_tokens + kThreads - 1) / kThreads, kThreads, 0, gpu->stream>>>(
        scores, expert, dgate, num_tokens, num_experts, top_k, renormalize, scale, dscores);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}
