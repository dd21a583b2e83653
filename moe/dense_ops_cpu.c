/* dense_ops_cpu.c — the CPU table of the dense ops (moe/dense_ops.h): the _cpu kernels of kernels/ and experts/,
 * OpenBLAS through the row-wise GEMMs of kernels/gemm_rows.h (bf16 inputs there under bf16 precision). No host
 * syncs. */
#include <stdlib.h>
#include <string.h>

#include "core/fail.h"
#include "core/real.h"
#include "core/threads.h"
#include "experts/expert_ffn.h"
#include "kernels/attention.h"
#include "kernels/cross_entropy.h"
#include "kernels/vocab_cross_entropy.h"
#include "kernels/embedding.h"
#include "kernels/gemm_rows.h"
#include "kernels/nonfinite.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "moe/dense_ops.h"

struct moe_dense_state {
    moe_runtime *rt;
    moe_gemm_rows_plan gemm;
    size_t att_nbytes, ffn_nbytes, wgrad_nbytes; /* what the scratch below holds */
    moe_real *att_scratch;                      /* [threads, S, S] attention backward, or the fused kernels' tiles */
    moe_real *dh1, *dh3;                        /* [T, d_ff] dense FFN backward        */
    moe_real *wgrad_scratch;                    /* moe_expert_ffn_wgrad_scratch_count(d, d_ff, 1) reals */
    moe_real *rope_table;                       /* moe_rope_table_cpu's for the shape below (every layer's) */
    int rope_seq_len, rope_head_dim;
    moe_rope rope;
    int bf16_attention; /* the fused attention's products in bf16 (core/precision.h, MOE_GEMM_ATTENTION) */
};

/* Grows the buffers behind ptrs to nbytes each when *have is smaller. */
static moe_status reserve(moe_dense_state *s, size_t *have, size_t nbytes, void **ptrs[], int n) {
    if (nbytes <= *have) return MOE_OK;
    const size_t sizes[] = {nbytes, nbytes};
    *have = 0;
    MOE_TRY(moe_runtime_regrow(s->rt, ptrs, sizes, n));
    *have = nbytes;
    return MOE_OK;
}

static void cpu_destroy(moe_dense_state *s) {
    if (!s) return;
    moe_gemm_rows_plan_free(&s->gemm);
    moe_real *bufs[] = {s->att_scratch, s->dh1, s->dh3, s->wgrad_scratch, s->rope_table};
    for (int i = 0; i < 5; i++) moe_runtime_free(s->rt, bufs[i]);
    free(s);
}

static moe_status cpu_create(moe_runtime *rt, int layout_invariant, moe_precision precision, int max_width,
                             moe_dense_state **out) {
    moe_dense_state *s = calloc(1, sizeof *s);
    if (!s) return MOE_ERR_OUT_OF_MEMORY;
    s->rt = rt;
    s->bf16_attention = moe_precision_bf16_inputs(precision, MOE_GEMM_ATTENTION);
    moe_status st = moe_gemm_rows_plan_init(&s->gemm, layout_invariant,
                                            moe_precision_bf16_inputs(precision, MOE_GEMM_DENSE), max_width);
    if (st != MOE_OK) return cpu_destroy(s), st;
    *out = s;
    return MOE_OK;
}

static moe_status cpu_embedding_forward(moe_dense_state *s, const moe_real *table, const int *tokens, int T, int d,
                                        int first, int rows, moe_real *y) {
    (void)s;
    moe_embedding_forward_range_cpu(table, tokens, T, d, first, rows, y);
    return MOE_OK;
}

static moe_status cpu_embedding_backward(moe_dense_state *s, const moe_real *dy, const int *tokens, int T, int d,
                                         int first, int rows, moe_real *dtable) {
    (void)s;
    moe_embedding_backward_range_cpu(dy, tokens, T, d, first, rows, dtable);
    return MOE_OK;
}

static moe_status cpu_rmsnorm_forward(moe_dense_state *s, const moe_real *x, const moe_real *w, int T, int d,
                                      moe_real eps, moe_real *y, moe_real *rstd) {
    (void)s;
    moe_rmsnorm_forward_cpu(x, w, T, d, eps, y, rstd);
    return MOE_OK;
}

static moe_status cpu_rmsnorm_backward(moe_dense_state *s, const moe_real *x, const moe_real *w, const moe_real *rstd,
                                       const moe_real *dy, int T, int d, moe_real *dx, moe_real *dw) {
    (void)s;
    moe_rmsnorm_backward_cpu(x, w, rstd, dy, T, d, dx, dw);
    return MOE_OK;
}

static moe_status cpu_linear_forward(moe_dense_state *s, const moe_real *x, const moe_real *W, int T, int in, int out,
                                     moe_real *y) {
    return moe_gemm_rows_cpu(&s->gemm, CblasTrans, T, out, in, x, W, 0, y);
}

static moe_status cpu_linear_backward_input(moe_dense_state *s, const moe_real *dy, const moe_real *W, int T, int in,
                                            int out, moe_real beta, moe_real *dx) {
    return moe_gemm_rows_cpu(&s->gemm, CblasNoTrans, T, in, out, dy, W, beta, dx);
}

/* a sum over this rank's tokens, as one GEMM (in fp32) */
static moe_status cpu_linear_backward_weight(moe_dense_state *s, const moe_real *dy, const moe_real *x, int T, int in,
                                             int out, moe_real *dW) {
    return moe_gemm_rows_at_b_cpu(&s->gemm, T, out, in, dy, x, 1, dW);
}

/* The rotation's cos/sin table for (S, hd, rope), made when they change (kept for every later call). */
static moe_status rope_table(moe_dense_state *s, int S, int hd, const moe_rope *rope, const moe_real **table) {
    if (!s->rope_table || s->rope_seq_len != S || s->rope_head_dim != hd || memcmp(&s->rope, rope, sizeof *rope)) {
        moe_runtime_free(s->rt, s->rope_table);
        s->rope_table = NULL;
        const size_t count = moe_rope_table_count(S, hd);
        MOE_TRY(moe_runtime_alloc(s->rt, (count ? count : 1) * sizeof(moe_real), (void **)&s->rope_table));
        moe_rope_table_cpu(S, hd, rope, s->rope_table);
        s->rope_seq_len = S, s->rope_head_dim = hd, s->rope = *rope;
    }
    *table = s->rope_table;
    return MOE_OK;
}

static moe_status cpu_rope_forward(moe_dense_state *s, moe_real *x, int num_seqs, int S, int H, int hd,
                                   const moe_rope *rope) {
    const moe_real *table;
    MOE_TRY(rope_table(s, S, hd, rope, &table));
    moe_rope_rotate_cpu(x, num_seqs, S, H, hd, table, 0);
    return MOE_OK;
}

static moe_status cpu_rope_backward(moe_dense_state *s, moe_real *dx, int num_seqs, int S, int H, int hd,
                                    const moe_rope *rope) {
    const moe_real *table;
    MOE_TRY(rope_table(s, S, hd, rope, &table));
    moe_rope_rotate_cpu(dx, num_seqs, S, H, hd, table, 1);
    return MOE_OK;
}

static moe_status cpu_attention_forward(moe_dense_state *s, const moe_real *q, const moe_real *k, const moe_real *v,
                                        int num_seqs, int S, int H, int KV, int hd, moe_real *att, moe_real *out) {
    (void)s;
    moe_attention_forward_cpu(q, k, v, num_seqs, S, H, KV, hd, att, out);
    return MOE_OK;
}

static moe_status cpu_attention_backward(moe_dense_state *s, const moe_real *q, const moe_real *k, const moe_real *v,
                                         const moe_real *att, const moe_real *dout, int num_seqs, int S, int H, int KV,
                                         int hd, moe_real *dq, moe_real *dk, moe_real *dv) {
    void **ptrs[] = {(void **)&s->att_scratch};
    MOE_TRY(reserve(s, &s->att_nbytes, (size_t)moe_threads_get() * S * S * sizeof(moe_real), ptrs, 1));
    moe_attention_backward_cpu(q, k, v, att, dout, num_seqs, S, H, KV, hd, dq, dk, dv, s->att_scratch);
    return MOE_OK;
}

/* The fused kernels' per-thread tiles, in the attention scratch (grown as the materialized backward grows it). */
static moe_status fused_scratch(moe_dense_state *s, int hd) {
    void **ptrs[] = {(void **)&s->att_scratch};
    return reserve(s, &s->att_nbytes, (size_t)moe_threads_get() * moe_attention_fused_scratch_count(hd) * sizeof(moe_real),
                   ptrs, 1);
}

static moe_status cpu_attention_fused_forward(moe_dense_state *s, const moe_real *q, const moe_real *k,
                                              const moe_real *v, int num_seqs, int S, int H, int KV, int hd,
                                              moe_real *lse, moe_real *out) {
    MOE_TRY(fused_scratch(s, hd));
    moe_attention_fused_forward_cpu(q, k, v, num_seqs, S, H, KV, hd, s->bf16_attention, lse, out, s->att_scratch);
    return MOE_OK;
}

static moe_status cpu_attention_fused_backward(moe_dense_state *s, const moe_real *q, const moe_real *k,
                                               const moe_real *v, const moe_real *out, const moe_real *lse,
                                               const moe_real *dout, int num_seqs, int S, int H, int KV, int hd,
                                               moe_real *dq, moe_real *dk, moe_real *dv) {
    MOE_TRY(fused_scratch(s, hd));
    moe_attention_fused_backward_cpu(q, k, v, out, lse, dout, num_seqs, S, H, KV, hd, s->bf16_attention, dq, dk, dv,
                                     s->att_scratch);
    return MOE_OK;
}

static moe_status cpu_swiglu_forward(moe_dense_state *s, const moe_layer_weights *w, int T, int d, int d_ff,
                                     const moe_real *x, moe_real *h1, moe_real *h3, moe_real *act, moe_real *y) {
    const int offsets[2] = {0, T}; /* one expert that sees every token */
    return moe_expert_ffn_forward_cpu(w, 1, d, d_ff, offsets, x, h1, h3, act, y, &s->gemm);
}

static moe_status cpu_swiglu_backward(moe_dense_state *s, const moe_layer_weights *w, moe_layer_weights *grads, int T,
                                      int d, int d_ff, const moe_real *x, const moe_real *h1, const moe_real *h3,
                                      const moe_real *act, const moe_real *dy, moe_real *dx) {
    void **ffn[] = {(void **)&s->dh1, (void **)&s->dh3}, **wgrad[] = {(void **)&s->wgrad_scratch};
    MOE_TRY(reserve(s, &s->ffn_nbytes, (size_t)T * d_ff * sizeof(moe_real), ffn, 2));
    MOE_TRY(reserve(s, &s->wgrad_nbytes, moe_expert_ffn_wgrad_scratch_count(d, d_ff, 1) * sizeof(moe_real), wgrad, 1));
    const int offsets[2] = {0, T};
    return moe_expert_ffn_backward_cpu(w, grads, 1, d, d_ff, offsets, 1, x, h1, h3, act, dy, s->dh1, s->dh3, dx,
                                       s->wgrad_scratch, &s->gemm);
}

static moe_real sigmoid(moe_real h) { return 1 / (1 + moe__exp(-h)); } /* experts/expert_ffn_cpu.c's */

static moe_status cpu_swiglu_act_forward(moe_dense_state *s, const moe_real *h1, const moe_real *h3, size_t n,
                                         moe_real *act) {
    (void)s;
    MOE__PARALLEL_FOR(n >= MOE__PAR_MIN_ELEMS,
    for (size_t i = 0; i < n; i++) act[i] = h1[i] * sigmoid(h1[i]) * h3[i]);
    return MOE_OK;
}

static moe_status cpu_swiglu_act_backward(moe_dense_state *s, const moe_real *h1, const moe_real *h3, size_t n,
                                          moe_real *dh1, moe_real *dh3) {
    (void)s;
    MOE__PARALLEL_FOR(n >= MOE__PAR_MIN_ELEMS,
    for (size_t i = 0; i < n; i++) { /* dh3 = dA silu(h1); dh1 = dA h3 silu'(h1), silu'(h) = s (1 + h (1 - s)) */
        const moe_real sg = sigmoid(h1[i]), dA = dh1[i];
        dh3[i] = dA * h1[i] * sg;
        dh1[i] = dA * h3[i] * sg * (1 + h1[i] * (1 - sg));
    });
    return MOE_OK;
}

static moe_status cpu_add(moe_dense_state *s, const moe_real *a, const moe_real *b, size_t n, moe_real *y) {
    (void)s;
    MOE__PARALLEL_FOR(n >= MOE__PAR_MIN_ELEMS,
    for (size_t i = 0; i < n; i++) y[i] = a[i] + b[i]);
    return MOE_OK;
}

static moe_status cpu_bias_add(moe_dense_state *s, moe_real *x, const moe_real *b, int T, int n) {
    (void)s;
    MOE__PARALLEL_FOR((size_t)T * n >= MOE__PAR_MIN_ELEMS,
    for (int t = 0; t < T; t++)
        for (int j = 0; j < n; j++) x[(size_t)t * n + j] += b[j]);
    return MOE_OK;
}

static moe_status cpu_gate_rows_forward(moe_dense_state *s, const moe_real *g, const moe_real *y, int T, int d,
                                        moe_real *out) {
    (void)s;
    MOE__PARALLEL_FOR((size_t)T * d >= MOE__PAR_MIN_ELEMS,
    for (int t = 0; t < T; t++) {
        const moe_real gate = sigmoid(g[t]);
        for (int i = 0; i < d; i++) out[(size_t)t * d + i] += gate * y[(size_t)t * d + i];
    });
    return MOE_OK;
}

static moe_status cpu_gate_rows_backward(moe_dense_state *s, const moe_real *g, const moe_real *y,
                                         const moe_real *dout, int T, int d, moe_real *dy, moe_real *dg) {
    (void)s;
    MOE__PARALLEL_FOR((size_t)T * d >= MOE__PAR_MIN_ELEMS,
    for (int t = 0; t < T; t++) {
        const moe_real gate = sigmoid(g[t]);
        double dot = 0;
        for (int i = 0; i < d; i++) {
            const size_t at = (size_t)t * d + i;
            dot += (double)dout[at] * y[at];
            dy[at] = gate * dout[at];
        }
        dg[t] = (moe_real)(dot * gate * (1 - gate));
    });
    return MOE_OK;
}

static moe_status cpu_cross_entropy_forward(moe_dense_state *s, const moe_real *logits, const int *targets, int T,
                                            int V, double *loss_sum) {
    (void)s;
    *loss_sum = moe_cross_entropy_forward_cpu(logits, targets, T, V);
    return MOE_OK;
}

static moe_status cpu_cross_entropy_backward(moe_dense_state *s, moe_real *logits, const int *targets, int T, int V,
                                             moe_real scale) {
    (void)s;
    moe_cross_entropy_backward_cpu(logits, targets, T, V, scale);
    return MOE_OK;
}

static moe_status cpu_vocab_row_max(moe_dense_state *s, const moe_real *logits, int T, int width, moe_real *max) {
    (void)s;
    moe_vocab_row_max_cpu(logits, T, width, max);
    return MOE_OK;
}

static moe_status cpu_vocab_piece_sums(moe_dense_state *s, const moe_real *logits, const moe_real *max,
                                       const int *targets, int T, int width, int piece, int first, double *sums,
                                       double *target) {
    (void)s;
    moe_vocab_piece_sums_cpu(logits, max, targets, T, width, piece, first, sums, target);
    return MOE_OK;
}

static moe_status cpu_vocab_backward(moe_dense_state *s, moe_real *logits, const moe_real *max, const double *z,
                                     const int *targets, int T, int width, int first, moe_real scale) {
    (void)s;
    moe_vocab_backward_cpu(logits, max, z, targets, T, width, first, scale);
    return MOE_OK;
}

static moe_status cpu_adamw_update(moe_dense_state *s, moe_real *param, const moe_real *grad, moe_real *m, moe_real *v,
                                   size_t count, const moe_adamw_params *hp) {
    (void)s;
    moe_adamw_update_cpu(param, grad, m, v, count, hp);
    return MOE_OK;
}

/* One range's sum of squares in MOE__SUM_LANES lanes and their tree (core/threads.h). A square of a float is exact in
 * double, so a fused multiply-add would give the same bits; the lanes are independent, so the loop vectorizes. */
static double range_sum_squares(const moe_real *a, size_t n) {
    enum { L = MOE__SUM_LANES };
    double t[L] = {0};
    size_t i = 0;
    for (; i + L <= n; i += L)
        for (int j = 0; j < L; j++) t[j] += (double)a[i + j] * a[i + j];
    for (int j = 0; i + j < n; j++) t[j] += (double)a[i + j] * a[i + j];
    for (int h = L / 2; h > 0; h /= 2)
        for (int j = 0; j < h; j++) t[j] += t[j + h];
    return t[0];
}

/* the ranges split over the threads (each range's bits its own: the same for any thread count) */
static moe_status cpu_sum_squares(moe_dense_state *s, const moe_real *a, const size_t *bounds, size_t count,
                                  double *sums) {
    (void)s;
    const size_t total = count ? bounds[count] - bounds[0] : 0;
#pragma omp parallel for schedule(dynamic, 1) if (total >= MOE__PAR_MIN_ELEMS && count > 1)
    for (size_t i = 0; i < count; i++) sums[i] = range_sum_squares(a + bounds[i], bounds[i + 1] - bounds[i]);
    return MOE_OK;
}

static moe_status cpu_find_nonfinite(moe_dense_state *s, const moe_real *a, size_t n, long long *first) {
    (void)s;
    *first = moe_find_nonfinite_cpu(a, n);
    return MOE_OK;
}

static moe_status cpu_scale(moe_dense_state *s, moe_real *a, size_t n, double factor) {
    (void)s;
    MOE__PARALLEL_FOR(n >= MOE__PAR_MIN_ELEMS,
    for (size_t i = 0; i < n; i++) a[i] = (moe_real)(a[i] * factor));
    return MOE_OK;
}

static moe_status cpu_round_bf16(moe_dense_state *s, const moe_real *src, size_t n, moe_real *dst) {
    (void)s;
    moe_round_bf16_cpu(src, n, dst);
    return MOE_OK;
}

static void cpu_weights_version(moe_dense_state *s, unsigned long long version) {
    moe_gemm_rows_plan_set_weights_version(&s->gemm, version);
}

const moe_dense_ops moe_dense_ops_cpu = {
    .name = "cpu",
    .create = cpu_create,
    .destroy = cpu_destroy,
    .embedding_forward = cpu_embedding_forward,
    .embedding_backward = cpu_embedding_backward,
    .rmsnorm_forward = cpu_rmsnorm_forward,
    .rmsnorm_backward = cpu_rmsnorm_backward,
    .linear_forward = cpu_linear_forward,
    .linear_backward_input = cpu_linear_backward_input,
    .linear_backward_weight = cpu_linear_backward_weight,
    .rope_forward = cpu_rope_forward,
    .rope_backward = cpu_rope_backward,
    .attention_forward = cpu_attention_forward,
    .attention_backward = cpu_attention_backward,
    .attention_fused_forward = cpu_attention_fused_forward,
    .attention_fused_backward = cpu_attention_fused_backward,
    .swiglu_forward = cpu_swiglu_forward,
    .swiglu_backward = cpu_swiglu_backward,
    .swiglu_act_forward = cpu_swiglu_act_forward,
    .swiglu_act_backward = cpu_swiglu_act_backward,
    .add = cpu_add,
    .bias_add = cpu_bias_add,
    .gate_rows_forward = cpu_gate_rows_forward,
    .gate_rows_backward = cpu_gate_rows_backward,
    .cross_entropy_forward = cpu_cross_entropy_forward,
    .cross_entropy_backward = cpu_cross_entropy_backward,
    .vocab_row_max = cpu_vocab_row_max,
    .vocab_piece_sums = cpu_vocab_piece_sums,
    .vocab_backward = cpu_vocab_backward,
    .adamw_update = cpu_adamw_update,
    .sum_squares = cpu_sum_squares,
    .find_nonfinite = cpu_find_nonfinite,
    .scale = cpu_scale,
    .round_bf16 = cpu_round_bf16,
    .weights_version = cpu_weights_version,
};
