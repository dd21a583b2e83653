/* expert_ffn_cpu.c — the grouped SwiGLU expert GEMMs: row-wise products in fixed row blocks (gemm_rows.h),
 * weight gradients as one cblas call per expert and projection over that expert's rows in order. */
#include "experts/expert_ffn.h"

#include "kernels/gemm_rows.h"
#include "moe/real.h"

static moe_real sigmoid(moe_real h) { return 1 / (1 + moe__exp(-h)); }

void expert_ffn_forward_cpu(const moe_layer_weights *w, int num_experts, int d_model, int d_ff,
                            const int *expert_offset, const moe_real *xp, moe_real *h1, moe_real *h3,
                            moe_real *act, moe_real *y, const gemm_rows_plan *gemm) {
    const int d = d_model;
    const size_t wcount = (size_t)d_ff * d;
    for (int e = 0; e < num_experts; e++) {
        int n = expert_offset[e + 1] - expert_offset[e];
        if (n == 0) continue;
        size_t r0 = expert_offset[e];
        const moe_real *x = xp + r0 * d;
        moe_real *H1 = h1 + r0 * d_ff, *H3 = h3 + r0 * d_ff, *A = act + r0 * d_ff;
        gemm_rows_cpu(gemm, CblasTrans, n, d_ff, d, x, w->w1 + e * wcount, 0, H1);
        gemm_rows_cpu(gemm, CblasTrans, n, d_ff, d, x, w->w3 + e * wcount, 0, H3);
        for (size_t i = 0; i < (size_t)n * d_ff; i++) A[i] = H1[i] * sigmoid(H1[i]) * H3[i];
        gemm_rows_cpu(gemm, CblasTrans, n, d, d_ff, A, w->w2 + e * wcount, 0, y + r0 * d);
    }
}

void expert_ffn_backward_cpu(const moe_layer_weights *w, moe_layer_weights *grads, int num_experts, int d_model,
                             int d_ff, const int *expert_offset, const moe_real *xp, const moe_real *h1,
                             const moe_real *h3, const moe_real *act, const moe_real *dy, moe_real *dh1,
                             moe_real *dh3, moe_real *dxp, const gemm_rows_plan *gemm) {
    const int d = d_model;
    const size_t wcount = (size_t)d_ff * d;
    for (int e = 0; e < num_experts; e++) {
        int n = expert_offset[e + 1] - expert_offset[e];
        if (n == 0) continue;
        size_t r0 = expert_offset[e];
        const moe_real *x = xp + r0 * d, *dY = dy + r0 * d;
        const moe_real *H1 = h1 + r0 * d_ff, *H3 = h3 + r0 * d_ff, *A = act + r0 * d_ff;
        moe_real *dH1 = dh1 + r0 * d_ff, *dH3 = dh3 + r0 * d_ff, *dX = dxp + r0 * d;
        /* dW2 += dY^T A;  dA = dY W2 (into dH1, consumed below) */
        moe__gemm(CblasRowMajor, CblasTrans, CblasNoTrans, d, d_ff, n, 1, dY, d, A, d_ff, 1,
                  grads->w2 + e * wcount, d_ff);
        gemm_rows_cpu(gemm, CblasNoTrans, n, d_ff, d, dY, w->w2 + e * wcount, 0, dH1);
        /* dH3 = dA * silu(H1);  dH1 = dA * H3 * silu'(H1),  silu'(h) = s (1 + h (1 - s)), s = sigmoid(h) */
        for (size_t i = 0; i < (size_t)n * d_ff; i++) {
            moe_real s = sigmoid(H1[i]), dA = dH1[i];
            dH3[i] = dA * H1[i] * s;
            dH1[i] = dA * H3[i] * s * (1 + H1[i] * (1 - s));
        }
        /* dW1 += dH1^T X;  dW3 += dH3^T X;  dX = dH1 W1 + dH3 W3 */
        moe__gemm(CblasRowMajor, CblasTrans, CblasNoTrans, d_ff, d, n, 1, dH1, d_ff, x, d, 1,
                  grads->w1 + e * wcount, d);
        moe__gemm(CblasRowMajor, CblasTrans, CblasNoTrans, d_ff, d, n, 1, dH3, d_ff, x, d, 1,
                  grads->w3 + e * wcount, d);
        gemm_rows_cpu(gemm, CblasNoTrans, n, d, d_ff, dH1, w->w1 + e * wcount, 0, dX);
        gemm_rows_cpu(gemm, CblasNoTrans, n, d, d_ff, dH3, w->w3 + e * wcount, 1, dX);
    }
}
