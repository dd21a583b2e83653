/* adamw.h — the AdamW update (decoupled weight decay, bias-corrected moments). CPU and CUDA.
 * With t the update's count (1 for the first update; a step that applies none, dropped as non-finite, counts none:
 * train/trainer.h's optimizer_updates, as torch's and Megatron's skipped steps):
 *   m = b1 m + (1 - b1) g;   v = b2 v + (1 - b2) g^2
 *   p -= lr * ( (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) + weight_decay * p )
 * computed as p -= (lr / (1 - b1^t)) m / (sqrt(v) (1 / sqrt(1 - b2^t)) + eps) + (lr weight_decay) p, the three
 * factors in brackets once per step in double (as torch.optim.AdamW folds them): one division and one square root
 * per element, where the formula as written takes three divisions (the divider bounds the CPU loop).
 * Gradient clipping is folded in: with clip_factor c (clip / norm when the norm is above the threshold), g is
 * (moe_real)(grad * c) in double, rounded once, the very value a separate pass of g *= c would leave (dense_ops'
 * scale), so fusing saves a read and a write of every gradient and changes no bit; the gradient buffer is left as
 * it was. */
#ifndef MOE_KERNELS_ADAMW_H
#define MOE_KERNELS_ADAMW_H

#include <stddef.h>

#include "core/gpu.h"
#include "core/types.h"

typedef struct {
    float lr, beta1, beta2, eps, weight_decay;
    long step;
    double clip_factor; /* the gradient's factor (above); 0 or 1: the gradient as it is */
} moe_adamw_params;

/* hp's clip factor, or 0 when it leaves the gradient as it is (0 or 1). */
double moe_adamw_clip_factor(const moe_adamw_params *hp);

/* count elements of param, grad, m, v (moments in fp32, as the parameters). */
void moe_adamw_update_cpu(moe_real *param, const moe_real *grad, moe_real *m, moe_real *v, size_t count,
                          const moe_adamw_params *hp);

/* The same on the GPU (kernels/adamw.cu): device arrays, queued on gpu's stream, no host sync. The CPU's
 * operations in its order, each rounded once (no FMA): its bits where the CPU build does not contract. */
moe_status moe_adamw_update_cuda(moe_gpu *gpu, float *param, const float *grad, float *m, float *v, size_t count,
                                 const moe_adamw_params *hp);

#endif
