/* gates.h — combine weights of the chosen experts, forward and backward. CPU and CUDA. */
#ifndef MOE_ROUTER_GATES_H
#define MOE_ROUTER_GATES_H

#include "core/types.h"
#include "core/gpu.h"

/* expert_score[t,j] = scores[t, expert[t,j]];  gate = expert_score, divided by its sum over j when
 * renormalize is set, then times scale (DeepSeek's routed_scaling_factor; 1: none, exactly). */
void moe_router_gates_cpu(const moe_real *scores, const int *expert, int num_tokens, int num_experts, int top_k,
                          int renormalize, moe_real scale, moe_real *expert_score, moe_real *gate);

/* Accumulates dL/dscores from dL/dgate, with dg_j = scale dL/dgate_j:  plain: ds[e_j] += dg_j;
 * renormalised (g_j = s_j / S, S = sum_i s_i, formed again from the scores):  ds[e_j] += (dg_j - sum_i dg_i g_i) / S. */
void moe_router_gates_backward_cpu(const moe_real *scores, const int *expert, const moe_real *dgate, int num_tokens,
                                   int num_experts, int top_k, int renormalize, moe_real scale, moe_real *dscores);

/* CUDA (float, device pointers): the same formulas, one thread per token; queued, no host sync. */
moe_status moe_router_gates_cuda(moe_gpu *gpu, const float *scores, const int *expert, int num_tokens, int num_experts,
                                 int top_k, int renormalize, float scale, float *expert_score, float *gate);
moe_status moe_router_gates_backward_cuda(moe_gpu *gpu, const float *scores, const int *expert, const float *dgate,
                                          int num_tokens, int num_experts, int top_k, int renormalize, float scale,
                                          float *dscores);

#endif
