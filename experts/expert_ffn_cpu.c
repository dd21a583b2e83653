/* expert_ffn_cpu.c — the grouped SwiGLU expert GEMMs: row-wise products in fixed row blocks (gemm_rows.h),
 * weight gradients as one product per expert, projection and segment, added in tree_schedule.h's order; with bf16
 * inputs (the plan's) the weights and activations are rounded on their way into each GEMM. act, dH1 and dH3 are GEMM
 * inputs only: where the plan stages reals (bf16 on fp32 units) the elementwise loops round them as they write them,
 * which the GEMMs would do anyway (the same bits), so that they need no staging pass.
 * Threads: each product's calls are spread over the pool by kernels/gemm_rows.h; the elementwise SwiGLU and gradient
 * additions are split over elements. */
#include "experts/expert_ffn.h"
#include "core/tree_schedule.h"

#include "core/fail.h"
#include "core/real.h"
#include "core/threads.h"
#include "kernels/cast.h"
#include "kernels/gemm_rows.h"

/* The plan's stage slots (kernels/gemm_rows.h) this file uses. */
enum { STAGE_X, STAGE_DY, STAGE_DH1, STAGE_DH3, STAGE_ACT };

static moe_real sigmoid(moe_real h) { return 1 / (1 + moe__exp(-h)); }

/* x as a bf16 GEMM input reads it when `round`, else x */
static inline moe_real input_value(moe_real x, int round) {
#ifdef MOE_REAL_IS_DOUBLE
    return round ? (moe_real)moe_bf16_round((float)x) : x;
#else
    return round ? moe_bf16_round_inline(x) : x;
#endif
}

moe_status moe_expert_ffn_reserve_cpu(moe_gemm_rows_plan *gemm, int d_model, int d_ff, int expert_rows) {
    const size_t rd = (size_t)expert_rows * d_model, rf = (size_t)expert_rows * d_ff;
    MOE_TRY(moe_gemm_rows_reserve_stage(gemm, STAGE_X, rd, 0));
    MOE_TRY(moe_gemm_rows_reserve_stage(gemm, STAGE_DY, rd, 0));
    MOE_TRY(moe_gemm_rows_reserve_stage(gemm, STAGE_ACT, rf, 1));
    MOE_TRY(moe_gemm_rows_reserve_stage(gemm, STAGE_DH1, rf, 1));
    return moe_gemm_rows_reserve_stage(gemm, STAGE_DH3, rf, 1);
}

moe_status moe_expert_ffn_forward_cpu(const moe_layer_weights *w, int num_experts, int d_model, int d_ff,
                                      const int *expert_offset, const moe_real *xp, moe_real *h1, moe_real *h3,
                                      moe_real *act, moe_real *y, moe_gemm_rows_plan *gemm) {
    const int d = d_model;
    const size_t wcount = (size_t)d_ff * d;
    const int round = moe_gemm_rows_caller_rounds(gemm); /* act rounded as it is written (above) */
    for (int e = 0; e < num_experts; e++) {
        int n = expert_offset[e + 1] - expert_offset[e];
        if (n == 0) continue;
        size_t r0 = expert_offset[e];
        const moe_real *x = xp + r0 * d;
        moe_real *H1 = h1 + r0 * d_ff, *H3 = h3 + r0 * d_ff, *A = act + r0 * d_ff;
        const void *x_in; /* rounded once for both products (bf16 inputs) */
        MOE_TRY(moe_gemm_rows_stage(gemm, STAGE_X, x, (size_t)n * d, &x_in));
        MOE_TRY(moe_gemm_rows_staged_cpu(gemm, CblasTrans, n, d_ff, d, x_in, w->w1 + e * wcount, 0, H1));
        MOE_TRY(moe_gemm_rows_staged_cpu(gemm, CblasTrans, n, d_ff, d, x_in, w->w3 + e * wcount, 0, H3));
        const size_t count = (size_t)n * d_ff;
        MOE__PARALLEL_FOR(count >= MOE__PAR_MIN_ELEMS,
        for (size_t i = 0; i < count; i++) A[i] = input_value(H1[i] * sigmoid(H1[i]) * H3[i], round));
        if (!y) continue;
        const void *A_in;
        MOE_TRY(moe_gemm_rows_stage_rounded(gemm, STAGE_ACT, A, count, &A_in));
        MOE_TRY(moe_gemm_rows_staged_cpu(gemm, CblasTrans, n, d, d_ff, A_in, w->w2 + e * wcount, 0, y + r0 * d));
    }
    return MOE_OK;
}

static void add_into(moe_real *y, const moe_real *a, const moe_real *b, size_t count) {
    MOE__PARALLEL_FOR(count >= MOE__PAR_MIN_ELEMS,
    for (size_t i = 0; i < count; i++) y[i] = a[i] + b[i]);
}

/* One weight gradient of one expert, dW[out, in] += the sum over its segments of dY_s^T X_s (staged inputs:
 * moe_gemm_rows_stage), each segment's product formed whole (an empty segment's is zero) and the products added
 * in tree_schedule.h's schedule: the fixed binary tree over the segments when their number is a power of two
 * (tree_reduce.h's counter), segment order otherwise. That is the sum the replicas' tree all-reduce or a one-rank
 * run forms from the same shards (why: expert_ffn.h). */
typedef struct {
    moe_gemm_rows_plan *gemm;
    const int *seg; /* the expert's segment_start, [segments + 1] */
    int segments, out, in;
    const void *dY, *X; /* staged, from the expert's first row */
    size_t dY_width, X_width;
} segment_products;

/* tree_schedule.h's buffer b: the gradient, or scratch buffer b of count values */
static moe_real *buffer(int b, moe_real *dW, moe_real *scratch, size_t count) {
    return b == MOE_TREE_OUT ? dW : scratch + count * (size_t)(b - 1);
}

static moe_status add_weight_grad(const segment_products *p, moe_real *dW, moe_real *scratch) {
    const size_t count = (size_t)p->out * p->in;
    moe_tree_step steps[MOE_TREE_MAX_STEPS];
    for (int sg = 0; sg <= p->segments; sg++) {
        const int n = moe_tree_schedule_steps(p->segments, sg, steps);
        if (n < 0) return MOE_ERR_INVALID_ARG;
        for (int i = 0; i < n; i++) {
            const moe_tree_step *st = &steps[i];
            moe_real *y = buffer(st->dst, dW, scratch, count);
            if (st->segment < 0) {
                add_into(y, buffer(st->left, dW, scratch, count), buffer(st->right, dW, scratch, count), count);
                continue;
            }
            const int s = st->segment;
            const size_t a = p->seg[s] - p->seg[0], rows = p->seg[s + 1] - p->seg[s];
            const void *dY = moe_gemm_rows_staged_at(p->gemm, p->dY, a * p->dY_width);
            const void *X = moe_gemm_rows_staged_at(p->gemm, p->X, a * p->X_width);
            if (rows) MOE_TRY(moe_gemm_rows_at_b_staged_cpu(p->gemm, (int)rows, p->out, p->in, dY, X, 0, y));
            else for (size_t j = 0; j < count; j++) y[j] = 0;
        }
    }
    return MOE_OK;
}

size_t moe_expert_ffn_wgrad_scratch_count(int d_model, int d_ff, int segments) {
    return (size_t)moe_tree_schedule_buffers(segments) * d_ff * d_model;
}

moe_status moe_expert_ffn_backward_cpu(const moe_layer_weights *w, moe_layer_weights *grads, int num_experts,
                                       int d_model, int d_ff, const int *segment_start, int segments,
                                       const moe_real *xp, const moe_real *h1, const moe_real *h3, const moe_real *act,
                                       const moe_real *dy, moe_real *dh1, moe_real *dh3, moe_real *dxp,
                                       moe_real *wgrad_scratch, moe_gemm_rows_plan *gemm) {
    const int d = d_model;
    const size_t wcount = (size_t)d_ff * d;
    const int round = moe_gemm_rows_caller_rounds(gemm); /* as in forward: act was rounded there */
    for (int e = 0; e < num_experts; e++) {
        const int *seg = segment_start + (size_t)e * segments;
        int n = seg[segments] - seg[0];
        if (n == 0) continue;
        size_t r0 = seg[0];
        const moe_real *dY = dy + r0 * d, *H1 = h1 + r0 * d_ff, *H3 = h3 + r0 * d_ff;
        moe_real *dH1 = dh1 + r0 * d_ff, *dH3 = dh3 + r0 * d_ff, *dX = dxp + r0 * d;
        /* Each input is rounded once (bf16 inputs) for its row product and its weight gradient. */
        const void *dY_in, *dH1_in, *dH3_in, *X_in, *A_in;
        MOE_TRY(moe_gemm_rows_stage(gemm, STAGE_DY, dY, (size_t)n * d, &dY_in));
        /* dA = dY W2 (into dH1, consumed below) */
        MOE_TRY(moe_gemm_rows_staged_cpu(gemm, CblasNoTrans, n, d_ff, d, dY_in, w->w2 + e * wcount, 0, dH1));
        /* dH3 = dA * silu(H1);  dH1 = dA * H3 * silu'(H1),  silu'(h) = s (1 + h (1 - s)), s = sigmoid(h) */
        const size_t count = (size_t)n * d_ff;
        MOE__PARALLEL_FOR(count >= MOE__PAR_MIN_ELEMS,
        for (size_t i = 0; i < count; i++) {
            moe_real s = sigmoid(H1[i]), dA = dH1[i];
            dH3[i] = input_value(dA * H1[i] * s, round);
            dH1[i] = input_value(dA * H3[i] * s * (1 + H1[i] * (1 - s)), round);
        });
        /* dX = dH1 W1 + dH3 W3 */
        MOE_TRY(moe_gemm_rows_stage_rounded(gemm, STAGE_DH1, dH1, count, &dH1_in));
        MOE_TRY(moe_gemm_rows_stage_rounded(gemm, STAGE_DH3, dH3, count, &dH3_in));
        MOE_TRY(moe_gemm_rows_staged_cpu(gemm, CblasNoTrans, n, d, d_ff, dH1_in, w->w1 + e * wcount, 0, dX));
        MOE_TRY(moe_gemm_rows_staged_cpu(gemm, CblasNoTrans, n, d, d_ff, dH3_in, w->w3 + e * wcount, 1, dX));
        MOE_TRY(moe_gemm_rows_stage(gemm, STAGE_X, xp + r0 * d, (size_t)n * d, &X_in));
        MOE_TRY(moe_gemm_rows_stage_rounded(gemm, STAGE_ACT, act + r0 * d_ff, count, &A_in));
        /* dW2 += dY^T A;  dW1 += dH1^T X;  dW3 += dH3^T X — one product per segment, added in the tree */
        const segment_products w2 = {gemm, seg, segments, d, d_ff, dY_in, A_in, d, d_ff},
                               w1 = {gemm, seg, segments, d_ff, d, dH1_in, X_in, d_ff, d},
                               w3 = {gemm, seg, segments, d_ff, d, dH3_in, X_in, d_ff, d};
        MOE_TRY(add_weight_grad(&w2, grads->w2 + e * wcount, wgrad_scratch));
        MOE_TRY(add_weight_grad(&w1, grads->w1 + e * wcount, wgrad_scratch));
        MOE_TRY(add_weight_grad(&w3, grads->w3 + e * wcount, wgrad_scratch));
    }
    return MOE_OK;
}
