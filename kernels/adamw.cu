/* adamw.cu — one AdamW step on the GPU (formula: adamw.h), the operations of kernels/adamw_cpu.c in its
 * order: the per-step factors in double on the host (the CPU's pow and sqrt) rounded to float, the rest in
 * fp32 with each product, quotient, sum and square root rounded once (__f*_rn: no FMA contraction), so the
 * CPU's bits. Elements are independent: a grid-stride loop. Checked against moe_adamw_update_cpu by
 * tests/test_gpu_dense_ops_a.cu (suite gpu). */
#include "core/gpu_cuda.h"

#include <math.h>

extern "C" {
#include "kernels/adamw.h"
}

namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 65535;

struct adamw_consts {
    float b1, b2, eps, step_size, rsqrt_bc2, decay; /* the per-step factors of adamw.h */
    double clip;                                    /* moe_adamw_clip_factor: 0, none */
};

__global__ void adamw_kernel(float *param, const float *grad, float *m, float *v, size_t n, adamw_consts k) {
    const float one_b1 = __fsub_rn(1.0f, k.b1), one_b2 = __fsub_rn(1.0f, k.b2);
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        /* the clipped gradient as moe_scale_cuda leaves it: the product in double, rounded once */
        const float g = k.clip != 0.0 ? __double2float_rn(__dmul_rn((double)grad[i], k.clip)) : grad[i], p = param[i];
        /* m = b1 m + (1 - b1) g;  v = b2 v + ((1 - b2) g) g */
        const float mi = __fadd_rn(__fmul_rn(k.b1, m[i]), __fmul_rn(one_b1, g));
        const float vi = __fadd_rn(__fmul_rn(k.b2, v[i]), __fmul_rn(__fmul_rn(one_b2, g), g));
        m[i] = mi, v[i] = vi;
        /* p -= (step_size m) / (sqrt(v) rsqrt_bc2 + eps) + decay p */
        const float denom = __fadd_rn(__fmul_rn(__fsqrt_rn(vi), k.rsqrt_bc2), k.eps);
        const float step = __fadd_rn(__fdiv_rn(__fmul_rn(k.step_size, mi), denom), __fmul_rn(k.decay, p));
        param[i] = __fsub_rn(p, step);
    }
}

} // namespace

extern "C" moe_status moe_adamw_update_cuda(moe_gpu *gpu, float *param, const float *grad, float *m, float *v,
                                            size_t count, const moe_adamw_params *hp) {
    if (!hp) return MOE_ERR_INVALID_ARG;
    if (count == 0) return MOE_OK;
    if (!param || !grad || !m || !v) return MOE_ERR_INVALID_ARG;
    const double bc1 = 1 - pow(hp->beta1, (double)hp->step), bc2 = 1 - pow(hp->beta2, (double)hp->step);
    adamw_consts k = {hp->beta1, hp->beta2, hp->eps, (float)(hp->lr / bc1), (float)(1 / sqrt(bc2)),
                      (float)((double)hp->lr * hp->weight_decay), moe_adamw_clip_factor(hp)};
    size_t blocks = (count + kThreads - 1) / kThreads;
    adamw_kernel<<<blocks > (size_t)kMaxBlocks ? kMaxBlocks : (int)blocks, kThreads, 0, gpu->stream>>>(param, grad, m,
                                                                                                     v, count, k);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}
