/* expert_ffn.h — SwiGLU experts over rows grouped by expert (a grouped GEMM), forward and backward. CPU.
 *
 * For expert e and its rows X_e = xp[offset[e] : offset[e+1]]  (n_e rows of width d):
 *   H1 = X_e W1_e^T,  H3 = X_e W3_e^T        [n_e, d_ff]
 *   A  = silu(H1) * H3                        [n_e, d_ff]     silu(h) = h * sigmoid(h)
 *   Y_e = A W2_e^T                            [n_e, d]
 * Weight shapes are Mixtral's (moe.h). num_experts here is the number of local experts. */
#ifndef MOE_EXPERTS_EXPERT_FFN_H
#define MOE_EXPERTS_EXPERT_FFN_H

#include "kernels/gemm_rows.h"
#include "moe/moe.h"

/* h1, h3, act: [offset[E], d_ff] saved for backward; y: [offset[E], d];
 * gemm: how the row-wise products are cut into calls (kernels/gemm_rows.h). */
void expert_ffn_forward_cpu(const moe_layer_weights *w, int num_experts, int d_model, int d_ff,
                            const int *expert_offset, const moe_real *xp, moe_real *h1, moe_real *h3,
                            moe_real *act, moe_real *y, const gemm_rows_plan *gemm);

/* From dy [rows, d]: dxp = dH1 W1 + dH3 W3 (overwritten) and grads->w1, w3, w2 += their GEMMs.
 * The rows of expert e arrive as `segments` consecutive segments, one per source rank of the EP group:
 * segment s starts at row segment_start[e * segments + s], and segment_start[E * segments] = all rows.
 * Each weight gradient is summed as one product per segment, in segment order, each product formed
 * whole before it is added. Replicated experts sum per-rank partial products with an all-reduce, so this
 * makes the gradients of sharded and replicated experts bitwise equal on 2 ranks (docs/DETERMINISM.md).
 * dh1, dh3: scratch of [rows, d_ff]; wgrad_scratch: d_ff * d reals. grads->router_w is not touched. */
void expert_ffn_backward_cpu(const moe_layer_weights *w, moe_layer_weights *grads, int num_experts, int d_model,
                             int d_ff, const int *segment_start, int segments, const moe_real *xp, const moe_real *h1,
                             const moe_real *h3, const moe_real *act, const moe_real *dy, moe_real *dh1,
                             moe_real *dh3, moe_real *dxp, moe_real *wgrad_scratch, const gemm_rows_plan *gemm);

#endif
