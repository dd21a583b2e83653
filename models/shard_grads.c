/* shard_grads.c — dense weight gradients per shard, added in the shard tree (shard_grads.h). */
#include "models/shard_grads.h"

#include "alltoall/tree_reduce.h"
#include "core/fail.h"

static moe_status dense_add(void *ctx, const moe_real *a, const moe_real *b, size_t n, moe_real *y) {
    const moe_shard_grads *g = ctx;
    return g->dense->add(g->state, a, b, n, y);
}

moe_status moe_shard_grads_init(moe_shard_grads *g, moe_runtime *rt, const moe_dense_ops *dense,
                                moe_dense_state *state, int local_shards, size_t max_count) {
    *g = (moe_shard_grads){.rt = rt, .dense = dense, .state = state, .local_shards = local_shards};
    const size_t parts = local_shards ? (size_t)local_shards : 1;
    MOE_TRY(moe_runtime_host_alloc(rt, parts * sizeof(double), (void **)&g->loss_parts));
    if (!local_shards) return MOE_OK;
    return moe_shard_tree_init(&g->tree, rt, dense_add, g, local_shards, max_count);
}

void moe_shard_grads_free(moe_shard_grads *g) {
    if (g->local_shards) moe_shard_tree_free(&g->tree);
    if (g->rt) moe_runtime_host_free(g->rt, g->loss_parts);
    g->loss_parts = NULL;
}

size_t moe_shard_grads_max_count(const moe_model_config *cfg) {
    const size_t d = (size_t)cfg->d_model, hd = (size_t)moe_model_head_dim(cfg);
    const size_t counts[] = {(size_t)cfg->vocab_size * d, 3 * (size_t)moe_model_dense_d_ff(cfg) * d,
                             cfg->num_heads * hd * d,
                             cfg->num_kv_heads * hd * d, 3 * (size_t)cfg->shared_d_ff * d};
    size_t max = 0;
    for (size_t i = 0; i < sizeof counts / sizeof *counts; i++) max = counts[i] > max ? counts[i] : max;
    return max;
}

moe_status moe_shard_grads_sum(const moe_shard_grads *g, int first, int T,
                               moe_status (*sum)(void *ctx, int from, int count, double *s), void *ctx, double *out) {
    const int L = g->local_shards;
    if (!L) return sum(ctx, first, T, out);
    moe_tree_acc acc;
    MOE_TRY(moe_tree_acc_init(&acc, MOE_TREE_F64, L, 1));
    moe_status st = MOE_OK;
    for (int j = 0; j < L && st == MOE_OK; j++) {
        const int from = first + (int)((long long)j * T / L), end = first + (int)((long long)(j + 1) * T / L);
        double shard;
        st = sum(ctx, from, end - from, &shard);
        if (st == MOE_OK) st = moe_tree_acc_push(&acc, &shard);
    }
    if (st == MOE_OK) *out = *(const double *)moe_tree_acc_sum(&acc);
    moe_tree_acc_free(&acc);
    return st;
}

/* The loss's shares, queued into g->loss_parts in shard order, handed to moe_shard_grads_sum in the same order. */
typedef struct {
    const moe_shard_grads *g;
    int next;
} loss_parts;

static moe_status queued_loss_part(void *ctx, int from, int count, double *s) {
    loss_parts *p = ctx;
    (void)from, (void)count;
    *s = p->g->loss_parts[p->next++];
    return MOE_OK;
}

moe_status moe_shard_grads_loss(moe_shard_grads *g, const moe_real *logits, const int *targets, int T, int vocab,
                                double *loss_sum) {
    const int L = g->local_shards ? g->local_shards : 1;
    for (int j = 0; j < L; j++) { /* the shards of moe_shard_grads_sum (one: all rows) */
        const int from = (int)((long long)j * T / L), end = (int)((long long)(j + 1) * T / L);
        MOE_TRY(g->dense->cross_entropy_forward(g->state, logits + (size_t)from * vocab, targets + from, end - from,
                                                vocab, g->loss_parts + j));
    }
    MOE_TRY(moe_runtime_synchronize(g->rt)); /* the shares land */
    loss_parts p = {g, 0};
    return moe_shard_grads_sum(g, 0, T, queued_loss_part, &p, loss_sum);
}

/* One op over rows [first, first + n) of the backward, its weight gradient into dW. */
typedef enum { OP_LINEAR, OP_RMSNORM, OP_EMBEDDING, OP_SWIGLU, OP_TP_COLUMN, OP_TP_ROW } op_kind;
typedef struct {
    op_kind kind;
    const moe_real *x, *w, *rstd, *dy, *h1, *h3, *act;
    const int *tokens;
    const moe_layer_weights *weights;
    moe_tp_linear *tp;
    int first, rows; /* embedding: the ids the table holds; rmsnorm: rows per token (each head's norm: H) */
    int in, out; /* linear: in, out; rmsnorm and embedding: d = in; swiglu: d = in, d_ff = out; tensor-parallel: the
                    whole widths (in, N for a column-parallel linear; K, out for a row-parallel one) */
    moe_real *dx;
} op;

static moe_status run(const moe_shard_grads *g, const op *o, int first, int n, moe_real *dW) {
    const size_t f = (size_t)first, in = o->in, out = o->out;
    switch (o->kind) {
    case OP_LINEAR:
        return g->dense->linear_backward_weight(g->state, o->dy + f * out, o->x + f * in, n, o->in, o->out, dW);
    case OP_RMSNORM: { /* rows rows of d = in per token */
        const size_t r = (size_t)o->rows, fr = f * r;
        return g->dense->rmsnorm_backward(g->state, o->x + fr * in, o->w, o->rstd + fr, o->dy + fr * in, n * o->rows,
                                          o->in, o->dx + fr * in, dW);
    }
    case OP_EMBEDDING:
        return g->dense->embedding_backward(g->state, o->dy + f * in, o->tokens + f, n, o->in, o->first, o->rows, dW);
    case OP_TP_COLUMN: /* dy_local rows of N / tp */
        return moe_tp_column_backward_weight(o->tp, o->dy + f * (out / o->tp->tp), o->x + f * in, n, o->in, o->out,
                                             dW);
    case OP_TP_ROW: /* x_local rows of K / tp */
        return moe_tp_row_backward_weight(o->tp, o->dy + f * out, o->x + f * (in / o->tp->tp), n, o->in, o->out, dW);
    case OP_SWIGLU: {
        const size_t wcount = out * in; /* the three gradients, one region */
        moe_layer_weights dw = {.w1 = dW, .w3 = dW + wcount, .w2 = dW + 2 * wcount};
        return g->dense->swiglu_backward(g->state, o->weights, &dw, n, o->in, o->out, o->x + f * in, o->h1 + f * out,
                                         o->h3 + f * out, o->act + f * out, o->dy + f * in, o->dx + f * in);
    }
    }
    return MOE_ERR_INVALID_ARG;
}

/* dW += the op's weight gradient: one run over all rows, or one per local shard added in the tree. */
static moe_status weight_grad(moe_shard_grads *g, const op *o, size_t count, moe_real *dW) {
    const int T = g->num_tokens, L = g->local_shards;
    if (!L) return run(g, o, 0, T, dW);
    MOE_TRY(moe_shard_tree_begin(&g->tree, count));
    for (int j = 0; j < L; j++) {
        const int first = (int)((long long)j * T / L), end = (int)((long long)(j + 1) * T / L);
        moe_real *leaf;
        MOE_TRY(moe_shard_tree_leaf(&g->tree, &leaf));
        MOE_TRY(run(g, o, first, end - first, leaf));
        MOE_TRY(moe_shard_tree_push(&g->tree));
    }
    return moe_shard_tree_add_to(&g->tree, dW);
}

moe_status moe_shard_grads_linear(moe_shard_grads *g, const moe_real *dy, const moe_real *x, int in, int out,
                                  moe_real *dW) {
    const op o = {.kind = OP_LINEAR, .dy = dy, .x = x, .in = in, .out = out};
    return weight_grad(g, &o, (size_t)in * out, dW);
}

moe_status moe_shard_grads_rmsnorm_rows(moe_shard_grads *g, const moe_real *x, const moe_real *w,
                                        const moe_real *rstd, const moe_real *dy, int rows, int d, moe_real *dx,
                                        moe_real *dw) {
    const op o = {.kind = OP_RMSNORM, .x = x, .w = w, .rstd = rstd, .dy = dy, .rows = rows, .in = d, .dx = dx};
    return weight_grad(g, &o, (size_t)d, dw);
}

moe_status moe_shard_grads_rmsnorm(moe_shard_grads *g, const moe_real *x, const moe_real *w, const moe_real *rstd,
                                   const moe_real *dy, int d, moe_real *dx, moe_real *dw) {
    return moe_shard_grads_rmsnorm_rows(g, x, w, rstd, dy, 1, d, dx, dw);
}

moe_status moe_shard_grads_embedding(moe_shard_grads *g, const moe_real *dy, const int *tokens, int d, int first,
                                     int rows, moe_real *dtable) {
    const op o = {.kind = OP_EMBEDDING, .dy = dy, .tokens = tokens, .first = first, .rows = rows, .in = d};
    return weight_grad(g, &o, (size_t)rows * d, dtable);
}

moe_status moe_shard_grads_swiglu(moe_shard_grads *g, const moe_layer_weights *w, moe_layer_weights *grads, int d,
                                  int d_ff, const moe_real *x, const moe_real *h1, const moe_real *h3,
                                  const moe_real *act, const moe_real *dy, moe_real *dx) {
    const size_t wcount = (size_t)d_ff * d;
    if (grads->w3 != grads->w1 + wcount || grads->w2 != grads->w3 + wcount) return MOE_ERR_INVALID_ARG;
    const op o = {.kind = OP_SWIGLU, .weights = w, .x = x, .h1 = h1, .h3 = h3, .act = act, .dy = dy, .in = d,
                  .out = d_ff, .dx = dx};
    return weight_grad(g, &o, 3 * wcount, grads->w1);
}

moe_status moe_shard_grads_tp_column(moe_shard_grads *g, moe_tp_linear *tp, const moe_real *dy_local,
                                     const moe_real *x, int in, int N, moe_real *dW_local) {
    const op o = {.kind = OP_TP_COLUMN, .tp = tp, .dy = dy_local, .x = x, .in = in, .out = N};
    return weight_grad(g, &o, (size_t)(N / tp->tp) * in, dW_local);
}

moe_status moe_shard_grads_tp_row(moe_shard_grads *g, moe_tp_linear *tp, const moe_real *dy, const moe_real *x_local,
                                  int K, int out, moe_real *dW_local) {
    const op o = {.kind = OP_TP_ROW, .tp = tp, .dy = dy, .x = x_local, .in = K, .out = out};
    return weight_grad(g, &o, (size_t)out * (K / tp->tp), dW_local);
}
