/* dense_ops.h — the ops of a transformer's dense (data-parallel) parts, as a table per runtime, so that
 * models/model.c and models/optimizer.c are written once and run on the CPU table (dense_ops_cpu.c) or the CUDA one
 * (dense_ops_cuda.c) without knowing which. Every pointer is the runtime's device memory (tokens and
 * targets too); the formulas are those of the CPU kernels each entry names (kernels/, experts/).
 *
 * Determinism: the entries reduce in a fixed order (no float atomics), and `linear` cuts its rows as the
 * layer does (kernels/gemm_rows.h), so a token's activations do not depend on which tokens share its call.
 * Host syncs: sum_squares and find_nonfinite return host values (they wait); the rest is queued, the loss of
 * cross_entropy_forward too (a host value by the runtime's next synchronisation). */
#ifndef MOE_MOE_DENSE_OPS_H
#define MOE_MOE_DENSE_OPS_H

#include <stddef.h>

#include "core/precision.h"
#include "core/types.h"
#include "kernels/adamw.h"
#include "kernels/rope.h"
#include "moe/runtime.h"

typedef struct moe_dense_state moe_dense_state; /* scratch and handles of one model, per table */

typedef struct moe_dense_ops {
    const char *name;
    /* layout_invariant: linear's row blocking (moe_config.layout_invariant); precision: whether linear and swiglu
     * take bf16 inputs (core/precision.h, the MOE_GEMM_DENSE site: then their weights must be bf16 copies, made
     * with round_bf16); max_width: the widest row of a linear's input or output (d, d_ff, V) */
    moe_status (*create)(moe_runtime *rt, int layout_invariant, moe_precision precision, int max_width,
                         moe_dense_state **out);
    void (*destroy)(moe_dense_state *s);

    /* y[t] = table[tokens[t] - first]; dtable[tokens[t] - first] += dy[t] in token order; the table holds the rows
     * of ids [first, first + rows) (0 and the vocabulary: all of them), another id reads -0.0 and adds nothing
     * (kernels/embedding.h) */
    moe_status (*embedding_forward)(moe_dense_state *s, const moe_real *table, const int *tokens, int num_tokens,
                                    int d, int first, int rows, moe_real *y);
    moe_status (*embedding_backward)(moe_dense_state *s, const moe_real *dy, const int *tokens, int num_tokens, int d,
                                     int first, int rows, moe_real *dtable);
    /* RMSNorm (kernels/rmsnorm.h): y, rstd; backward accumulates into dx and dw */
    moe_status (*rmsnorm_forward)(moe_dense_state *s, const moe_real *x, const moe_real *w, int num_tokens, int d,
                                  moe_real eps, moe_real *y, moe_real *rstd);
    moe_status (*rmsnorm_backward)(moe_dense_state *s, const moe_real *x, const moe_real *w, const moe_real *rstd,
                                   const moe_real *dy, int num_tokens, int d, moe_real *dx, moe_real *dw);
    /* y[T, out] = x[T, in] W^T (W [out, in]); dx (+)= dy W with beta 0 or 1; dW += dy^T x */
    moe_status (*linear_forward)(moe_dense_state *s, const moe_real *x, const moe_real *W, int num_tokens, int in,
                                 int out, moe_real *y);
    moe_status (*linear_backward_input)(moe_dense_state *s, const moe_real *dy, const moe_real *W, int num_tokens,
                                        int in, int out, moe_real beta, moe_real *dx);
    moe_status (*linear_backward_weight)(moe_dense_state *s, const moe_real *dy, const moe_real *x, int num_tokens,
                                         int in, int out, moe_real *dW);
    /* RoPE in place (kernels/rope.h: its frequencies and amplitude) */
    moe_status (*rope_forward)(moe_dense_state *s, moe_real *x, int num_seqs, int seq_len, int num_heads,
                               int head_dim, const moe_rope *rope);
    moe_status (*rope_backward)(moe_dense_state *s, moe_real *dx, int num_seqs, int seq_len, int num_heads,
                                int head_dim, const moe_rope *rope);
    /* causal GQA attention (kernels/attention.h); att [num_seqs, H, S, S] is kept for backward */
    moe_status (*attention_forward)(moe_dense_state *s, const moe_real *q, const moe_real *k, const moe_real *v,
                                    int num_seqs, int seq_len, int num_heads, int num_kv_heads, int head_dim,
                                    moe_real *att, moe_real *out);
    moe_status (*attention_backward)(moe_dense_state *s, const moe_real *q, const moe_real *k, const moe_real *v,
                                     const moe_real *att, const moe_real *dout, int num_seqs, int seq_len,
                                     int num_heads, int num_kv_heads, int head_dim, moe_real *dq, moe_real *dk,
                                     moe_real *dv);
    /* the same function fused (kernels/attention.h): lse [num_seqs, H, S] is kept for backward instead of att, which
     * also takes the forward's out */
    moe_status (*attention_fused_forward)(moe_dense_state *s, const moe_real *q, const moe_real *k, const moe_real *v,
                                          int num_seqs, int seq_len, int num_heads, int num_kv_heads, int head_dim,
                                          moe_real *lse, moe_real *out);
    moe_status (*attention_fused_backward)(moe_dense_state *s, const moe_real *q, const moe_real *k, const moe_real *v,
                                           const moe_real *out, const moe_real *lse, const moe_real *dout,
                                           int num_seqs, int seq_len, int num_heads, int num_kv_heads, int head_dim,
                                           moe_real *dq, moe_real *dk, moe_real *dv);
    /* a dense SwiGLU FFN: one expert over every token (experts/expert_ffn.h, router_w unused); h1, h3, act
     * [T, d_ff] are kept for backward, which overwrites dx and accumulates into grads */
    moe_status (*swiglu_forward)(moe_dense_state *s, const moe_layer_weights *w, int num_tokens, int d, int d_ff,
                                 const moe_real *x, moe_real *h1, moe_real *h3, moe_real *act, moe_real *y);
    moe_status (*swiglu_backward)(moe_dense_state *s, const moe_layer_weights *w, moe_layer_weights *grads,
                                  int num_tokens, int d, int d_ff, const moe_real *x, const moe_real *h1,
                                  const moe_real *h3, const moe_real *act, const moe_real *dy, moe_real *dx);
    /* the SwiGLU's elementwise part alone, over n values (a tensor-parallel dense FFN runs its GEMMs in pieces,
     * tp/linear.h): act = silu(h1) h3; backward: dh1 holds dact on entry and dL/dh1 on return, dh3 = dL/dh3. The
     * formulas and order of swiglu_forward/backward's */
    moe_status (*swiglu_act_forward)(moe_dense_state *s, const moe_real *h1, const moe_real *h3, size_t n,
                                     moe_real *act);
    moe_status (*swiglu_act_backward)(moe_dense_state *s, const moe_real *h1, const moe_real *h3, size_t n,
                                      moe_real *dh1, moe_real *dh3);
    /* y = a + b, n values */
    moe_status (*add)(moe_dense_state *s, const moe_real *a, const moe_real *b, size_t n, moe_real *y);
    /* x[t, j] += b[j] for num_tokens rows of n (a projection's bias; its gradient is a column sum, formed as a
     * weight gradient against a column of ones) */
    moe_status (*bias_add)(moe_dense_state *s, moe_real *x, const moe_real *b, int num_tokens, int n);
    /* a sigmoid gate per row (Qwen2-MoE's shared expert, kernels/elementwise.h): out[t, :] += sigmoid(g[t]) y[t, :];
     * backward: dy[t, :] = sigmoid(g[t]) dout[t, :] (overwritten), dg[t] = s (1 - s) sum_i dout[t, i] y[t, i] (the
     * sum in double, in index order) */
    moe_status (*gate_rows_forward)(moe_dense_state *s, const moe_real *g, const moe_real *y, int num_tokens, int d,
                                    moe_real *out);
    moe_status (*gate_rows_backward)(moe_dense_state *s, const moe_real *g, const moe_real *y, const moe_real *dout,
                                     int num_tokens, int d, moe_real *dy, moe_real *dg);
    /* *loss_sum = sum_t of the token losses (kernels/cross_entropy.h; a host double, written by the runtime's next
     * synchronisation: in the runtime's host memory (moe_runtime_host_alloc) the call does not wait, in other host
     * memory it may); backward overwrites the logits with scale * dL/dlogits */
    moe_status (*cross_entropy_forward)(moe_dense_state *s, const moe_real *logits, const int *targets,
                                        int num_tokens, int vocab, double *loss_sum);
    moe_status (*cross_entropy_backward)(moe_dense_state *s, moe_real *logits, const int *targets, int num_tokens,
                                         int vocab, moe_real scale);
    /* the vocabulary-parallel cross-entropy's per-row parts (kernels/vocab_cross_entropy.h: logits [T, width] are
     * columns [first, first + width) of the vocabulary; sums [width / piece][T] and target [T] in double), all in
     * runtime memory; tp/vocab_cross_entropy.h runs the exchanges between them */
    moe_status (*vocab_row_max)(moe_dense_state *s, const moe_real *logits, int num_tokens, int width, moe_real *max);
    moe_status (*vocab_piece_sums)(moe_dense_state *s, const moe_real *logits, const moe_real *max, const int *targets,
                                   int num_tokens, int width, int piece, int first, double *sums, double *target);
    moe_status (*vocab_backward)(moe_dense_state *s, moe_real *logits, const moe_real *max, const double *z,
                                 const int *targets, int num_tokens, int width, int first, moe_real scale);
    /* the optimizer's: AdamW on count values (kernels/adamw.h); sums[i] = the sum of squares in double of
     * a[bounds[i] .. bounds[i + 1]) for each of count ranges (bounds: count + 1 increasing offsets, host; sums: host),
     * each in MOE__SUM_LANES lanes and their fixed tree (core/threads.h), all ranges in one pass (one launch and one
     * download on a GPU); a *= factor, each product rounded once to moe_real */
    moe_status (*adamw_update)(moe_dense_state *s, moe_real *param, const moe_real *grad, moe_real *m, moe_real *v,
                               size_t count, const moe_adamw_params *hp);
    moe_status (*sum_squares)(moe_dense_state *s, const moe_real *a, const size_t *bounds, size_t count, double *sums);
    /* *first = the index of the first NaN or Inf among count values, or -1 (host; the guard's) */
    moe_status (*find_nonfinite)(moe_dense_state *s, const moe_real *a, size_t count, long long *first);
    moe_status (*scale)(moe_dense_state *s, moe_real *a, size_t count, double factor);
    /* dst = src rounded to bf16 (kept as moe_real): a weight's bf16 copy for the GEMMs */
    moe_status (*round_bf16)(moe_dense_state *s, const moe_real *src, size_t count, moe_real *dst);
    /* The weights the GEMMs read have this version (core/types.h): a runtime that keeps their prepared copies (the
     * CPU's: kernels/gemm_rows.h, by address; the GPU's bf16 copies under MOE_LINEAR_LT: kernels/linear.h) keeps them
     * while it stays the same, so every W that linear and swiglu
     * take must then be a weight in place, never a copy in scratch; 0 keeps none. NULL: the runtime keeps none. */
    void (*weights_version)(moe_dense_state *s, unsigned long long version);
} moe_dense_ops;

/* The table of a runtime. */
const moe_dense_ops *moe_runtime_dense_ops(const moe_runtime *rt);

/* The CPU table (always built; float or double with moe_real). */
extern const moe_dense_ops moe_dense_ops_cpu;
/* The CUDA table (dense_ops_cuda.c; only in libmoe_cuda, float only). */
extern const moe_dense_ops moe_dense_ops_cuda;

#endif
