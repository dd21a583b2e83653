/* dense_ops_fault.c — one dense entry run twice (moe/dense_ops_fault.h). */
#include "moe/dense_ops_fault.h"

#include <string.h>

#include "core/fail.h"

static const moe_dense_ops *g_base; /* the table whose entry runs twice */

static moe_status rmsnorm_backward_twice(moe_dense_state *s, const moe_real *x, const moe_real *w,
                                         const moe_real *rstd, const moe_real *dy, int num_tokens, int d, moe_real *dx,
                                         moe_real *dw) {
    MOE_TRY(g_base->rmsnorm_backward(s, x, w, rstd, dy, num_tokens, d, dx, dw));
    return g_base->rmsnorm_backward(s, x, w, rstd, dy, num_tokens, d, dx, dw);
}

static moe_status linear_backward_weight_twice(moe_dense_state *s, const moe_real *dy, const moe_real *x,
                                               int num_tokens, int in, int out, moe_real *dW) {
    MOE_TRY(g_base->linear_backward_weight(s, dy, x, num_tokens, in, out, dW));
    return g_base->linear_backward_weight(s, dy, x, num_tokens, in, out, dW);
}

static moe_status embedding_backward_twice(moe_dense_state *s, const moe_real *dy, const int *tokens, int num_tokens,
                                           int d, int first, int rows, moe_real *dtable) {
    MOE_TRY(g_base->embedding_backward(s, dy, tokens, num_tokens, d, first, rows, dtable));
    return g_base->embedding_backward(s, dy, tokens, num_tokens, d, first, rows, dtable);
}

static moe_status swiglu_backward_twice(moe_dense_state *s, const moe_layer_weights *w, moe_layer_weights *grads,
                                        int num_tokens, int d, int d_ff, const moe_real *x, const moe_real *h1,
                                        const moe_real *h3, const moe_real *act, const moe_real *dy, moe_real *dx) {
    MOE_TRY(g_base->swiglu_backward(s, w, grads, num_tokens, d, d_ff, x, h1, h3, act, dy, dx));
    return g_base->swiglu_backward(s, w, grads, num_tokens, d, d_ff, x, h1, h3, act, dy, dx);
}

static moe_status rope_forward_twice(moe_dense_state *s, moe_real *x, int num_seqs, int seq_len, int num_heads,
                                     int head_dim, const moe_rope *rope) {
    MOE_TRY(g_base->rope_forward(s, x, num_seqs, seq_len, num_heads, head_dim, rope));
    return g_base->rope_forward(s, x, num_seqs, seq_len, num_heads, head_dim, rope);
}

static moe_status rope_backward_twice(moe_dense_state *s, moe_real *dx, int num_seqs, int seq_len, int num_heads,
                                      int head_dim, const moe_rope *rope) {
    MOE_TRY(g_base->rope_backward(s, dx, num_seqs, seq_len, num_heads, head_dim, rope));
    return g_base->rope_backward(s, dx, num_seqs, seq_len, num_heads, head_dim, rope);
}

moe_status moe_dense_ops_with_fault(const moe_dense_ops *base, const char *entry, moe_dense_ops *out) {
    *out = *base;
    if (!strcmp(entry, "rmsnorm_backward")) out->rmsnorm_backward = rmsnorm_backward_twice;
    else if (!strcmp(entry, "linear_backward_weight")) out->linear_backward_weight = linear_backward_weight_twice;
    else if (!strcmp(entry, "embedding_backward")) out->embedding_backward = embedding_backward_twice;
    else if (!strcmp(entry, "swiglu_backward")) out->swiglu_backward = swiglu_backward_twice;
    else if (!strcmp(entry, "rope_forward")) out->rope_forward = rope_forward_twice;
    else if (!strcmp(entry, "rope_backward")) out->rope_backward = rope_backward_twice;
    else
        return moe_fail(MOE_ERR_INVALID_ARG, "no fault for the dense entry '%s' (there are: rmsnorm_backward, "
                        "linear_backward_weight, embedding_backward, swiglu_backward, rope_forward, rope_backward)",
                        entry);
    g_base = base;
    out->name = "fault";
    return MOE_OK;
}
