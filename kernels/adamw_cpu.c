/* adamw_cpu.c — one AdamW step (formula: adamw.h). The bias corrections 1 - b^t are computed once in
 * double; the per-element arithmetic is in moe_real. Weight decay uses the parameter before this step
 * (decoupled, as torch.optim.AdamW's p *= 1 - lr * wd). Elements are independent: split over the threads.
 * Tested in tests/test_model_kernels.c against the formula written out in double: weight_decay 0 and > 0,
 * and step 1 (where the bias-corrected moments are g and g^2). */
#include "kernels/adamw.h"

#include <math.h>

#include "core/threads.h"

#ifdef MOE_REAL_IS_DOUBLE
#define adamw__sqrt sqrt
#else
#define adamw__sqrt sqrtf
#endif

void moe_adamw_update_cpu(moe_real *param, const moe_real *grad, moe_real *m, moe_real *v, size_t count,
                          const moe_adamw_params *hp) {
    const moe_real b1 = hp->beta1, b2 = hp->beta2, lr = hp->lr, eps = hp->eps, wd = hp->weight_decay;
    const moe_real bc1 = (moe_real)(1 - pow(hp->beta1, (double)hp->step));
    const moe_real bc2 = (moe_real)(1 - pow(hp->beta2, (double)hp->step));
#pragma omp parallel for schedule(static) if (count >= MOE__PAR_MIN_ELEMS)
    for (size_t i = 0; i < count; i++) {
        moe_real g = grad[i];
        m[i] = b1 * m[i] + (1 - b1) * g;
        v[i] = b2 * v[i] + (1 - b2) * g * g;
        moe_real mhat = m[i] / bc1, vhat = v[i] / bc2;
        param[i] -= lr * (mhat / (adamw__sqrt(vhat) + eps) + wd * param[i]);
    }
}
