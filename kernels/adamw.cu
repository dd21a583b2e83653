/* adamw.cu — one AdamW step on the GPU (formula: adamw.h), the operations of kernels/adamw_cpu.c in its
 * order: the bias corrections 1 - b^t in double on the host (the CPU's pow) rounded to float, the rest in
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
    float b1, b2, lr, eps, wd, bc1, bc2;
};

__global__ void adamw_kernel(float *param, const float *grad, float *m, float *v, size_t n, adamw_consts k) {
    const float one_b1 = __fsub_rn(1.0f, k.b1), one_b2 = __fsub_rn(1.0f, k.b2);
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float g = grad[i], p = param[i];
        /* m = b1 m + (1 - b1) g;  v = b2 v + ((1 - b2) g) g */
        const float mi = __fadd_rn(__fmul_rn(k.b1, m[i]), __fmul_rn(one_b1, g));
        const float vi = __fadd_rn(__fmul_rn(k.b2, v[i]), __fmul_rn(__fmul_rn(one_b2, g), g));
        m[i] = mi, v[i] = vi;
        const float mhat = __fdiv_rn(mi, k.bc1), vhat = __fdiv_rn(vi, k.bc2);
        /* p -= lr (mhat / (sqrt(vhat) + eps) + wd p) */
        const float step = __fadd_rn(__fdiv_rn(mhat, __fadd_rn(__fsqrt_rn(vhat), k.eps)), __fmul_rn(k.wd, p));
        param[i] = __fsub_rn(p, __fmul_rn(k.lr, step));
    }
}

} // namespace

extern "C" moe_status moe_adamw_update_cuda(moe_gpu *gpu, float *param, const float *grad, float *m, float *v,
                                            size_t count, const moe_adamw_params *hp) {
    if (!hp) return MOE_ERR_INVALID_ARG;
    if (count == 0) return MOE_OK;
    if (!param || !grad || !m || !v) return MOE_ERR_INVALID_ARG;
    adamw_consts k = {hp->beta1, hp->beta2, hp->lr, hp->eps, hp->weight_decay,
                      (float)(1 - pow(hp->beta1, (double)hp->step)), (float)(1 - pow(hp->beta2, (double)hp->step))};
    size_t blocks = (count + kThreads - 1) / kThreads;
    adamw_kernel<<<blocks > (size_t)kMaxBlocks ? kMaxBlocks : (int)blocks, kThreads, 0, gpu->stream>>>(param, grad, m,
                                                                                                     v, count, k);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}
