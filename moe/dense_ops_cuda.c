/* dense_ops_cuda.c — the CUDA table of the dense ops (moe/dense_ops.h): the _cuda kernels of kernels/, queued on the
 * runtime's stream, entry by entry the semantics of the CPU table (dense_ops_cpu.c): the same outputs overwritten or
 * accumulated, beta 0 or 1, and under bf16 precision the same GEMM inputs rounded to bf16 (the row operands of
 * linear and of the dense SwiGLU, both operands of a weight gradient; the weights are the caller's bf16 copies).
 * Linear products: kernels/linear.h (fp32 cublasSgemm on the rounded values kept in fp32 buffers, in the row blocks
 * of kernels/gemm_rows.h when layout_invariant; with MOE_LINEAR_GEMM=lt one pinned cuBLASLt call per product, bf16
 * under bf16 precision). Reductions in a fixed order, no float atomics.
 *
 * Host syncs: sum_squares and find_nonfinite (they return host values); growing a scratch buffer (the first calls
 * at a new size) frees the old one, which waits for the device. The rest is queued (cross_entropy_forward's loss
 * lands in host memory by the next synchronisation).
 * Scratch: the table's own buffers below; the kernels of embedding, RMSNorm, RoPE, attention, cross-entropy and the
 * sums use the context's (core/gpu_cuda.h), which none of the buffers here is. In libmoe_cuda only. */
#include <stdlib.h>

#include "core/fail.h"
#include "kernels/adamw.h"
#include "kernels/attention.h"
#include "kernels/cast.h"
#include "kernels/cross_entropy.h"
#include "kernels/vocab_cross_entropy.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/linear.h"
#include "kernels/nonfinite.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "moe/dense_ops.h"

_Static_assert(sizeof(moe_real) == sizeof(float), "the CUDA table is float only");

/* The GEMM inputs a call rounds to bf16 at once (the CPU plan's stage slots, kernels/gemm_rows.h). */
enum { STAGE_X, STAGE_DY, STAGE_ACT, STAGE_SLOTS };

/* a device buffer that grows to the largest size asked of it */
typedef struct {
    float *data;
    size_t nbytes;
} scratch;

struct moe_dense_state {
    moe_runtime *rt;
    moe_gpu *gpu;
    int bf16_inputs;               /* core/precision.h, MOE_GEMM_DENSE */
    int bf16_attention;            /* core/precision.h, MOE_GEMM_ATTENTION: the fused attention's products */
    moe_linear_plan linear;
    scratch stage[STAGE_SLOTS];    /* bf16-rounded copies of GEMM inputs, [T, width] */
    scratch dh1, dh3;              /* [T, d_ff] dense FFN backward */
    scratch wgrad;                 /* [d_ff, d] one weight gradient product of the dense FFN */
};

static moe_status reserve(moe_dense_state *s, scratch *b, size_t count) {
    const size_t nbytes = (count ? count : 1) * sizeof(float);
    if (nbytes <= b->nbytes) return MOE_OK;
    void **ptrs[] = {(void **)&b->data};
    b->nbytes = 0;
    MOE_TRY(moe_runtime_regrow(s->rt, ptrs, &nbytes, 1));
    b->nbytes = nbytes;
    return MOE_OK;
}

/* count values of a GEMM input as the products read it: x itself (fp32), or rounded to bf16 into slot's buffer; x
 * itself too under MOE_LINEAR_LT, whose products round their token operands as they cast them (kernels/linear.h) */
static moe_status stage(moe_dense_state *s, int slot, const float *x, size_t count, const float **out) {
    *out = x;
    if (!s->bf16_inputs || s->linear.lt) return MOE_OK;
    MOE_TRY(reserve(s, &s->stage[slot], count));
    *out = s->stage[slot].data;
    return moe_bf16_round_cuda(s->gpu, x, count, s->stage[slot].data);
}

static void cuda_destroy(moe_dense_state *s) {
    if (!s) return;
    moe_linear_plan_free(s->gpu, &s->linear);
    scratch *bufs[] = {&s->stage[STAGE_X], &s->stage[STAGE_DY], &s->stage[STAGE_ACT], &s->dh1, &s->dh3, &s->wgrad};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) moe_runtime_free(s->rt, bufs[i]->data);
    free(s);
}

static moe_status cuda_create(moe_runtime *rt, int layout_invariant, moe_precision precision, int max_width,
                              moe_dense_state **out) {
    moe_gpu *gpu = moe_runtime_gpu(rt);
    if (!gpu)
        return moe_fail(MOE_ERR_NO_DEVICE, "the CUDA dense table needs a CUDA runtime, not '%s'", moe_runtime_name(rt));
    moe_dense_state *s = calloc(1, sizeof *s);
    if (!s) return MOE_ERR_OUT_OF_MEMORY;
    s->rt = rt, s->gpu = gpu;
    s->bf16_inputs = moe_precision_bf16_inputs(precision, MOE_GEMM_DENSE);
    s->bf16_attention = moe_precision_bf16_inputs(precision, MOE_GEMM_ATTENTION);
    moe_linear_gemm gemm = MOE_LINEAR_SGEMM;
    moe_status st = moe_linear_gemm_from_env(&gemm);
    if (st == MOE_OK) st = moe_linear_plan_init(gpu, gemm, layout_invariant, s->bf16_inputs, max_width, &s->linear);
    if (st != MOE_OK) return cuda_destroy(s), st;
    *out = s;
    return MOE_OK;
}

static moe_status cuda_embedding_forward(moe_dense_state *s, const moe_real *table, const int *tokens, int T, int d,
                                         int first, int rows, moe_real *y) {
    return moe_embedding_forward_range_cuda(s->gpu, table, tokens, T, d, first, rows, y);
}

static moe_status cuda_embedding_backward(moe_dense_state *s, const moe_real *dy, const int *tokens, int T, int d,
                                          int first, int rows, moe_real *dtable) {
    return moe_embedding_backward_range_cuda(s->gpu, dy, tokens, T, d, first, rows, dtable);
}

static moe_status cuda_rmsnorm_forward(moe_dense_state *s, const moe_real *x, const moe_real *w, int T, int d,
                                       moe_real eps, moe_real *y, moe_real *rstd) {
    return moe_rmsnorm_forward_cuda(s->gpu, x, w, T, d, eps, y, rstd);
}

static moe_status cuda_rmsnorm_backward(moe_dense_state *s, const moe_real *x, const moe_real *w, const moe_real *rstd,
                                        const moe_real *dy, int T, int d, moe_real *dx, moe_real *dw) {
    return moe_rmsnorm_backward_cuda(s->gpu, x, w, rstd, dy, T, d, dx, dw);
}

static moe_status cuda_linear_forward(moe_dense_state *s, const moe_real *x, const moe_real *W, int T, int in, int out,
                                      moe_real *y) {
    const float *x_in;
    MOE_TRY(stage(s, STAGE_X, x, (size_t)T * in, &x_in));
    return moe_linear_forward_cuda(s->gpu, &s->linear, x_in, W, T, in, out, y);
}

static moe_status cuda_linear_backward_input(moe_dense_state *s, const moe_real *dy, const moe_real *W, int T, int in,
                                             int out, moe_real beta, moe_real *dx) {
    const float *dy_in;
    MOE_TRY(stage(s, STAGE_DY, dy, (size_t)T * out, &dy_in));
    return moe_linear_backward_input_cuda(s->gpu, &s->linear, dy_in, W, T, in, out, beta, dx);
}

/* a sum over this rank's tokens, as one GEMM (in fp32) */
static moe_status cuda_linear_backward_weight(moe_dense_state *s, const moe_real *dy, const moe_real *x, int T, int in,
                                              int out, moe_real *dW) {
    const float *dy_in, *x_in;
    MOE_TRY(stage(s, STAGE_DY, dy, (size_t)T * out, &dy_in));
    MOE_TRY(stage(s, STAGE_X, x, (size_t)T * in, &x_in));
    return moe_linear_backward_weight_cuda(s->gpu, &s->linear, dy_in, x_in, T, in, out, 1, dW);
}

static moe_status cuda_rope_forward(moe_dense_state *s, moe_real *x, int num_seqs, int S, int H, int hd,
                                    const moe_rope *rope) {
    return moe_rope_forward_cuda(s->gpu, x, num_seqs, S, H, hd, rope);
}

static moe_status cuda_rope_backward(moe_dense_state *s, moe_real *dx, int num_seqs, int S, int H, int hd,
                                     const moe_rope *rope) {
    return moe_rope_backward_cuda(s->gpu, dx, num_seqs, S, H, hd, rope);
}

static moe_status cuda_attention_forward(moe_dense_state *s, const moe_real *q, const moe_real *k, const moe_real *v,
                                         int num_seqs, int S, int H, int KV, int hd, moe_real *att, moe_real *out) {
    return moe_attention_forward_cuda(s->gpu, q, k, v, num_seqs, S, H, KV, hd, att, out);
}

static moe_status cuda_attention_backward(moe_dense_state *s, const moe_real *q, const moe_real *k, const moe_real *v,
                                          const moe_real *att, const moe_real *dout, int num_seqs, int S, int H,
                                          int KV, int hd, moe_real *dq, moe_real *dk, moe_real *dv) {
    return moe_attention_backward_cuda(s->gpu, q, k, v, att, dout, num_seqs, S, H, KV, hd, dq, dk, dv);
}

static moe_status cuda_attention_fused_forward(moe_dense_state *s, const moe_real *q, const moe_real *k,
                                               const moe_real *v, int num_seqs, int S, int H, int KV, int hd,
                                               moe_real *lse, moe_real *out) {
    return moe_attention_fused_forward_cuda(s->gpu, q, k, v, num_seqs, S, H, KV, hd, s->bf16_attention, lse, out);
}

static moe_status cuda_attention_fused_backward(moe_dense_state *s, const moe_real *q, const moe_real *k,
                                                const moe_real *v, const moe_real *out, const moe_real *lse,
                                                const moe_real *dout, int num_seqs, int S, int H, int KV, int hd,
                                                moe_real *dq, moe_real *dk, moe_real *dv) {
    return moe_attention_fused_backward_cuda(s->gpu, q, k, v, out, lse, dout, num_seqs, S, H, KV, hd,
                                             s->bf16_attention, dq, dk, dv);
}

/* experts/expert_ffn_cpu.c's forward for one expert over every token: H1 = x W1^T, H3 = x W3^T (x rounded once for
 * both under bf16), act = silu(H1) H3, y = act W2^T */
static moe_status cuda_swiglu_forward(moe_dense_state *s, const moe_layer_weights *w, int T, int d, int d_ff,
                                      const moe_real *x, moe_real *h1, moe_real *h3, moe_real *act, moe_real *y) {
    if (T == 0) return MOE_OK;
    const float *x_in, *act_in;
    MOE_TRY(stage(s, STAGE_X, x, (size_t)T * d, &x_in));
    MOE_TRY(moe_linear_forward_cuda(s->gpu, &s->linear, x_in, w->w1, T, d, d_ff, h1));
    MOE_TRY(moe_linear_forward_cuda(s->gpu, &s->linear, x_in, w->w3, T, d, d_ff, h3));
    MOE_TRY(moe_swiglu_f32_forward_cuda(s->gpu, h1, h3, (size_t)T * d_ff, act));
    MOE_TRY(stage(s, STAGE_ACT, act, (size_t)T * d_ff, &act_in));
    return moe_linear_forward_cuda(s->gpu, &s->linear, act_in, w->w2, T, d_ff, d, y);
}

static moe_status cuda_swiglu_act_forward(moe_dense_state *s, const moe_real *h1, const moe_real *h3, size_t n,
                                          moe_real *act) {
    return n ? moe_swiglu_f32_forward_cuda(s->gpu, h1, h3, n, act) : MOE_OK;
}

static moe_status cuda_swiglu_act_backward(moe_dense_state *s, const moe_real *h1, const moe_real *h3, size_t n,
                                           moe_real *dh1, moe_real *dh3) {
    return n ? moe_swiglu_f32_backward_cuda(s->gpu, h1, h3, n, dh1, dh3) : MOE_OK;
}

/* dW[out, in] += dY^T X, formed whole into scratch and then added, as expert_ffn_cpu.c's add_weight_grad */
static moe_status add_weight_grad(moe_dense_state *s, int T, int in, int out, const float *dY, const float *X,
                                  float *dW) {
    MOE_TRY(moe_linear_backward_weight_cuda(s->gpu, &s->linear, dY, X, T, in, out, 0, s->wgrad.data));
    return moe_add_cuda(s->gpu, dW, s->wgrad.data, (size_t)out * in, dW);
}

/* expert_ffn_cpu.c's backward for one expert over every token: dA = dY W2, dH1 and dH3 from it (rounded in place
 * under bf16: nothing reads them unrounded after), dX = dH1 W1 + dH3 W3, then dW2 += dY^T act, dW1 += dH1^T x,
 * dW3 += dH3^T x */
static moe_status cuda_swiglu_backward(moe_dense_state *s, const moe_layer_weights *w, moe_layer_weights *grads, int T,
                                       int d, int d_ff, const moe_real *x, const moe_real *h1, const moe_real *h3,
                                       const moe_real *act, const moe_real *dy, moe_real *dx) {
    if (T == 0) return MOE_OK;
    const size_t count = (size_t)T * d_ff;
    MOE_TRY(reserve(s, &s->dh1, count));
    MOE_TRY(reserve(s, &s->dh3, count));
    MOE_TRY(reserve(s, &s->wgrad, (size_t)d_ff * d));
    float *dh1 = s->dh1.data, *dh3 = s->dh3.data;
    const float *dy_in, *x_in, *act_in;
    MOE_TRY(stage(s, STAGE_DY, dy, (size_t)T * d, &dy_in));
    MOE_TRY(moe_linear_backward_input_cuda(s->gpu, &s->linear, dy_in, w->w2, T, d_ff, d, 0, dh1));
    MOE_TRY(moe_swiglu_f32_backward_cuda(s->gpu, h1, h3, count, dh1, dh3));
    if (s->bf16_inputs) {
        MOE_TRY(moe_bf16_round_cuda(s->gpu, dh1, count, dh1));
        MOE_TRY(moe_bf16_round_cuda(s->gpu, dh3, count, dh3));
    }
    MOE_TRY(moe_linear_backward_input_cuda(s->gpu, &s->linear, dh1, w->w1, T, d, d_ff, 0, dx));
    MOE_TRY(moe_linear_backward_input_cuda(s->gpu, &s->linear, dh3, w->w3, T, d, d_ff, 1, dx));
    MOE_TRY(stage(s, STAGE_X, x, (size_t)T * d, &x_in));
    MOE_TRY(stage(s, STAGE_ACT, act, count, &act_in));
    MOE_TRY(add_weight_grad(s, T, d_ff, d, dy_in, act_in, grads->w2));
    MOE_TRY(add_weight_grad(s, T, d, d_ff, dh1, x_in, grads->w1));
    return add_weight_grad(s, T, d, d_ff, dh3, x_in, grads->w3);
}

static moe_status cuda_add(moe_dense_state *s, const moe_real *a, const moe_real *b, size_t n, moe_real *y) {
    return moe_add_cuda(s->gpu, a, b, n, y);
}

static moe_status cuda_bias_add(moe_dense_state *s, moe_real *x, const moe_real *b, int T, int n) {
    return moe_bias_add_cuda(s->gpu, x, b, T, n);
}

static moe_status cuda_gate_rows_forward(moe_dense_state *s, const moe_real *g, const moe_real *y, int T, int d,
                                         moe_real *out) {
    return moe_gate_rows_forward_cuda(s->gpu, g, y, T, d, out);
}

static moe_status cuda_gate_rows_backward(moe_dense_state *s, const moe_real *g, const moe_real *y,
                                          const moe_real *dout, int T, int d, moe_real *dy, moe_real *dg) {
    return moe_gate_rows_backward_cuda(s->gpu, g, y, dout, T, d, dy, dg);
}

static moe_status cuda_cross_entropy_forward(moe_dense_state *s, const moe_real *logits, const int *targets, int T,
                                             int V, double *loss_sum) {
    return moe_cross_entropy_forward_queue_cuda(s->gpu, logits, targets, T, V, loss_sum);
}

static moe_status cuda_cross_entropy_backward(moe_dense_state *s, moe_real *logits, const int *targets, int T, int V,
                                              moe_real scale) {
    return moe_cross_entropy_backward_cuda(s->gpu, logits, targets, T, V, scale);
}

static moe_status cuda_vocab_row_max(moe_dense_state *s, const moe_real *logits, int T, int width, moe_real *max) {
    return moe_vocab_row_max_cuda(s->gpu, logits, T, width, max);
}

static moe_status cuda_vocab_piece_sums(moe_dense_state *s, const moe_real *logits, const moe_real *max,
                                        const int *targets, int T, int width, int piece, int first, double *sums,
                                        double *target) {
    return moe_vocab_piece_sums_cuda(s->gpu, logits, max, targets, T, width, piece, first, sums, target);
}

static moe_status cuda_vocab_backward(moe_dense_state *s, moe_real *logits, const moe_real *max, const double *z,
                                      const int *targets, int T, int width, int first, moe_real scale) {
    return moe_vocab_backward_cuda(s->gpu, logits, max, z, targets, T, width, first, scale);
}

static moe_status cuda_adamw_update(moe_dense_state *s, moe_real *param, const moe_real *grad, moe_real *m,
                                    moe_real *v, size_t count, const moe_adamw_params *hp) {
    return moe_adamw_update_cuda(s->gpu, param, grad, m, v, count, hp);
}

/* the CPU's lanes and tree (kernels/elementwise.h) */
static moe_status cuda_sum_squares(moe_dense_state *s, const moe_real *a, const size_t *bounds, size_t count,
                                   double *sums) {
    return moe_sum_squares_cuda(s->gpu, a, bounds, count, sums);
}

static moe_status cuda_find_nonfinite(moe_dense_state *s, const moe_real *a, size_t n, long long *first) {
    return moe_find_nonfinite_cuda(s->gpu, a, n, first);
}

static moe_status cuda_scale(moe_dense_state *s, moe_real *a, size_t n, double factor) {
    return moe_scale_cuda(s->gpu, a, n, factor);
}

static moe_status cuda_round_bf16(moe_dense_state *s, const moe_real *src, size_t n, moe_real *dst) {
    return moe_bf16_round_cuda(s->gpu, src, n, dst);
}

/* Under MOE_LINEAR_LT with bf16 inputs the plan keeps each weight's bf16 copy for this version (kernels/linear.h) */
static void cuda_weights_version(moe_dense_state *s, unsigned long long version) {
    moe_linear_plan_set_weights_version(&s->linear, version);
}

const moe_dense_ops moe_dense_ops_cuda = {
    .name = "cuda",
    .create = cuda_create,
    .destroy = cuda_destroy,
    .embedding_forward = cuda_embedding_forward,
    .embedding_backward = cuda_embedding_backward,
    .rmsnorm_forward = cuda_rmsnorm_forward,
    .rmsnorm_backward = cuda_rmsnorm_backward,
    .linear_forward = cuda_linear_forward,
    .linear_backward_input = cuda_linear_backward_input,
    .linear_backward_weight = cuda_linear_backward_weight,
    .rope_forward = cuda_rope_forward,
    .rope_backward = cuda_rope_backward,
    .attention_forward = cuda_attention_forward,
    .attention_backward = cuda_attention_backward,
    .attention_fused_forward = cuda_attention_fused_forward,
    .attention_fused_backward = cuda_attention_fused_backward,
    .swiglu_forward = cuda_swiglu_forward,
    .swiglu_backward = cuda_swiglu_backward,
    .swiglu_act_forward = cuda_swiglu_act_forward,
    .swiglu_act_backward = cuda_swiglu_act_backward,
    .add = cuda_add,
    .bias_add = cuda_bias_add,
    .gate_rows_forward = cuda_gate_rows_forward,
    .gate_rows_backward = cuda_gate_rows_backward,
    .cross_entropy_forward = cuda_cross_entropy_forward,
    .cross_entropy_backward = cuda_cross_entropy_backward,
    .vocab_row_max = cuda_vocab_row_max,
    .vocab_piece_sums = cuda_vocab_piece_sums,
    .vocab_backward = cuda_vocab_backward,
    .adamw_update = cuda_adamw_update,
    .sum_squares = cuda_sum_squares,
    .find_nonfinite = cuda_find_nonfinite,
    .scale = cuda_scale,
    .round_bf16 = cuda_round_bf16,
    .weights_version = cuda_weights_version,
};
