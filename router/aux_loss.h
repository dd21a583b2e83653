/* aux_loss.h — router auxiliary losses and their exact gradients. CPU and CUDA.
 *
 * Load balancing (Switch/GShard):  L_aux = E * sum_e f_e * P_e
 *   f_e = n_e / (T*k), n_e = top-k assignments to e before capacity (no gradient flows through f);
 *   P_e = (1/T) sum_t q[t,e], q = the softmax probabilities, or for sigmoid routing the affinities
 *   normalised per token, s / sum_e s (DeepSeek-V3's convention).
 *   Perfect balance (f_e = P_e = 1/E) gives exactly 1 for every k.
 * Router z-loss (ST-MoE):  L_z = (1/T) sum_t logsumexp(logits[t,:])^2
 *
 * T is the global batch (num_tokens_global) and n_e the global counts; each rank passes its own tokens
 * (num_tokens of them), so the forward functions return this rank's share of the loss (the shares sum
 * to the loss over ranks) and the backward functions this rank's tokens' exact gradients.
 */
#ifndef MOE_ROUTER_AUX_LOSS_H
#define MOE_ROUTER_AUX_LOSS_H

#include "core/types.h"
#include "core/gpu.h"

double moe_router_load_balance_loss_cpu(moe_score_func func, const moe_real *scores, const int *num_selected,
                                        int num_tokens, int num_tokens_global, int num_experts, int top_k);
/* dscores += coef * dL_aux/dscores */
void moe_router_load_balance_loss_backward_cpu(moe_score_func func, const moe_real *scores, const int *num_selected,
                                               int num_tokens, int num_tokens_global, int num_experts, int top_k,
                                               moe_real coef, moe_real *dscores);

double moe_router_z_loss_cpu(const moe_real *logits, int num_tokens, int num_tokens_global, int num_experts);
/* dlogits += coef * (2/T) * lse_t * softmax(logits_t) */
void moe_router_z_loss_backward_cpu(const moe_real *logits, int num_tokens, int num_tokens_global, int num_experts,
                                    moe_real coef, moe_real *dlogits);

/* CUDA (float, device pointers; num_selected is a device [E] array; host syncs: moe_router_losses_cuda waits
 * for the device, the rest are queued). The forward gives both shares in double on the host, {load balance, z},
 * from fixed-order reductions (no atomics): the queued form into loss[2] of pinned host memory by the stream's
 * next synchronisation (the layer's deferred losses, moe/moe.h), the other at once. */
moe_status moe_router_losses_queue_cuda(moe_gpu *gpu, moe_score_func func, const float *scores, const float *logits,
                                        const int *num_selected, int num_tokens, int num_tokens_global,
                                        int num_experts, int top_k, double *loss);
moe_status moe_router_losses_cuda(moe_gpu *gpu, moe_score_func func, const float *scores, const float *logits,
                                  const int *num_selected, int num_tokens, int num_tokens_global, int num_experts,
                                  int top_k, double loss[2]);
moe_status moe_router_load_balance_loss_backward_cuda(moe_gpu *gpu, moe_score_func func, const float *scores,
                                                      const int *num_selected, int num_tokens, int num_tokens_global,
                                                      int num_experts, int top_k, float coef, float *dscores);
moe_status moe_router_z_loss_backward_cuda(moe_gpu *gpu, const float *logits, int num_tokens, int num_tokens_global,
                                           int num_experts, float coef, float *dlogits);

#endif
