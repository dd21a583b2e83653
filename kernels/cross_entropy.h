/* cross_entropy.h — softmax cross-entropy over the vocabulary. CPU.
 *   loss_t = logsumexp(logits[t, :]) - logits[t, target_t] */
#ifndef MOE_KERNELS_CROSS_ENTROPY_H
#define MOE_KERNELS_CROSS_ENTROPY_H

#include "core/types.h"

/* Returns sum_t loss_t (in double). logits: [T, V], targets: [T] in [0, V). */
double moe_cross_entropy_forward_cpu(const moe_real *logits, const int *targets, int num_tokens, int vocab);

/* Overwrites logits with dlogits = scale * (softmax(logits) - onehot(target)) (in place: the logits are
 * not needed after this). */
void moe_cross_entropy_backward_cpu(moe_real *logits, const int *targets, int num_tokens, int vocab, moe_real scale);

#endif
