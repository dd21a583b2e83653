/* cross_entropy.h — softmax cross-entropy over the vocabulary. CPU and CUDA.
 *   loss_t = logsumexp(logits[t, :]) - logits[t, target_t] */
#ifndef MOE_KERNELS_CROSS_ENTROPY_H
#define MOE_KERNELS_CROSS_ENTROPY_H

#include "core/gpu.h"
#include "core/types.h"

/* Returns sum_t loss_t (in double). logits: [T, V], targets: [T] in [0, V). */
double moe_cross_entropy_forward_cpu(const moe_real *logits, const int *targets, int num_tokens, int vocab);

/* Overwrites logits with dlogits = scale * (softmax(logits) - onehot(target)) (in place: the logits are
 * not needed after this). */
void moe_cross_entropy_backward_cpu(moe_real *logits, const int *targets, int num_tokens, int vocab, moe_real scale);

/* CUDA (float logits, device pointers; targets device ints). forward: *loss_sum (host) = sum_t loss_t, the
 * token losses (double) kept in gpu's scratch and added in a fixed order; it synchronises the stream (the result
 * is a host value), or queued, into pinned host memory by the stream's next synchronisation (into pageable memory
 * the copy ends before the call returns). backward: as the CPU's, queued, no host sync. A target outside
 * [0, vocab) is not read: its loss is NaN and backward leaves the one-hot term out. */
moe_status moe_cross_entropy_forward_cuda(moe_gpu *gpu, const float *logits, const int *targets, int num_tokens,
                                          int vocab, double *loss_sum);
moe_status moe_cross_entropy_forward_queue_cuda(moe_gpu *gpu, const float *logits, const int *targets,
                                                int num_tokens, int vocab, double *loss_sum);
moe_status moe_cross_entropy_backward_cuda(moe_gpu *gpu, float *logits, const int *targets, int num_tokens, int vocab,
                                           float scale);

#endif
