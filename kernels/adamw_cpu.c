/* adamw_cpu.c — one AdamW step (formula: adamw.h). The per-step factors are computed once in double; the
 * per-element arithmetic is in moe_real. Weight decay uses the parameter before this step
 * (decoupled, as torch.optim.AdamW's p *= 1 - lr * wd); the clip factor scales each gradient value as it is read.
 * Elements are independent: split over the threads.
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

double moe_adamw_clip_factor(const moe_adamw_params *hp) {
    return hp->clip_factor == 1.0 ? 0.0 : hp->clip_factor;
}

void moe_adamw_update_cpu(moe_real *param, const moe_real *grad, moe_real *m, moe_real *v, size_t count,
                          const moe_adamw_params *hp) {
    const moe_real b1 = hp->beta1, b2 = hp->beta2, eps = hp->eps;
    const double bc1 = 1 - pow(hp->beta1, (double)hp->step), bc2 = 1 - pow(hp->beta2, (double)hp->step);
    const moe_real step_size = (moe_real)(hp->lr / bc1), rsqrt_bc2 = (moe_real)(1 / sqrt(bc2));
    const moe_real decay = (moe_real)((double)hp->lr * hp->weight_decay);
    const double clip = moe_adamw_clip_factor(hp);
    MOE__PARALLEL_FOR(count >= MOE__PAR_MIN_ELEMS,
    for (size_t i = 0; i < count; i++) {
        const moe_real g = clip ? (moe_real)(grad[i] * clip) : grad[i];
        const moe_real mi = b1 * m[i] + (1 - b1) * g, vi = b2 * v[i] + (1 - b2) * g * g;
        m[i] = mi, v[i] = vi;
        param[i] -= step_size * mi / (adamw__sqrt(vi) * rsqrt_bc2 + eps) + decay * param[i];
    });
}
