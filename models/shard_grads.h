/* shard_grads.h — the dense model's weight gradients, formed per virtual shard of the batch and added in the
 * fixed tree over the shards (moe/shard_tree.h; docs/DETERMINISM.md), or, without shards, as one product over the
 * rank's rows (today's reductions).
 *
 * Each call runs one dense-table op (moe/dense_ops.h) over this rank's T rows: with local_shards L > 0, once per
 * local shard j (rows [j T / L, (j + 1) T / L), the row-wise outputs dx written for those rows only) into a zeroed
 * leaf pushed into the tree, whose root is then added into the gradient; with L = 0, once over all rows straight
 * into the gradient. The row-wise outputs (dx) come out the same bits either way: the table's row-wise products
 * do not depend on which rows share a call (kernels/gemm_rows.h). Host syncs: the table's. */
#ifndef MOE_MODELS_SHARD_GRADS_H
#define MOE_MODELS_SHARD_GRADS_H

#include "models/model.h"
#include "moe/dense_ops.h"
#include "moe/shard_tree.h"
#include "tp/linear.h"

typedef struct {
    moe_runtime *rt;
    const moe_dense_ops *dense;
    moe_dense_state *state;
    double *loss_parts; /* [max(1, local_shards)] the loss's shares, queued (the runtime's host memory) */
    int local_shards; /* 0: off */
    int num_tokens;   /* T of the backward under way */
    moe_shard_tree tree;
} moe_shard_grads;

/* local_shards 0: off (nothing allocated); else a power of two, max_count the largest gradient tensor summed
 * (the dense SwiGLU's three count as one: moe_shard_grads_max_count). dense, state: where the ops run (the model's). */
moe_status moe_shard_grads_init(moe_shard_grads *g, moe_runtime *rt, const moe_dense_ops *dense,
                                moe_dense_state *state, int local_shards, size_t max_count);
void moe_shard_grads_free(moe_shard_grads *g);
/* The largest dense weight gradient of cfg's model: the embedding (or lm_head), a dense SwiGLU's three matrices, an
 * attention projection. */
size_t moe_shard_grads_max_count(const moe_model_config *cfg);

/* A sum over rows [first, first + T) in shards: sum(ctx, from, count, &s) gives rows [from, from + count)'s, once for
 * all of them (local_shards 0), or once per local shard (rows [first + j T / L, first + (j + 1) T / L)) with the
 * shards' sums added in double in the fixed tree (alltoall/tree_reduce.h), as every sum over the batch is with
 * shards. */
moe_status moe_shard_grads_sum(const moe_shard_grads *g, int first, int T,
                               moe_status (*sum)(void *ctx, int from, int count, double *s), void *ctx, double *out);

/* The cross-entropy loss sum of T rows of logits [T, vocab]: moe_shard_grads_sum of the dense table's, each shard's
 * queued, then one synchronisation of the runtime for all of them. */
moe_status moe_shard_grads_loss(moe_shard_grads *g, const moe_real *logits, const int *targets, int T, int vocab,
                                double *loss_sum);

/* dW [out, in] += dy^T x */
moe_status moe_shard_grads_linear(moe_shard_grads *g, const moe_real *dy, const moe_real *x, int in, int out,
                                  moe_real *dW);
/* RMSNorm backward: dx += (rows), dw [d] += */
moe_status moe_shard_grads_rmsnorm(moe_shard_grads *g, const moe_real *x, const moe_real *w, const moe_real *rstd,
                                   const moe_real *dy, int d, moe_real *dx, moe_real *dw);
/* The same for a norm of `rows` rows of d per token (each head's: a token's H heads), rstd [T * rows]: a shard's
 * leaf sums its tokens' rows. */
moe_status moe_shard_grads_rmsnorm_rows(moe_shard_grads *g, const moe_real *x, const moe_real *w,
                                        const moe_real *rstd, const moe_real *dy, int rows, int d, moe_real *dx,
                                        moe_real *dw);
/* dtable [rows, d] += dy scattered by tokens: the table holds the rows of ids [first, first + rows) (0 and the
 * vocabulary: all; a vocabulary-parallel block otherwise, other ids adding nothing) */
moe_status moe_shard_grads_embedding(moe_shard_grads *g, const moe_real *dy, const int *tokens, int d, int first,
                                     int rows, moe_real *dtable);
/* the dense SwiGLU's backward: dx overwritten (rows), grads->w1, w3, w2 += (they must be one region [w1 | w3 | w2],
 * as the model lays them out: MOE_ERR_INVALID_ARG otherwise) */
moe_status moe_shard_grads_swiglu(moe_shard_grads *g, const moe_layer_weights *w, moe_layer_weights *grads, int d,
                                  int d_ff, const moe_real *x, const moe_real *h1, const moe_real *h3,
                                  const moe_real *act, const moe_real *dy, moe_real *dx);

/* Tensor parallelism's weight gradients (tp/linear.h), one piece-by-piece product per shard of g's rows (the tensor
 * group's): a column-parallel linear's dW_local [N/tp, in] += dy_local^T x, a row-parallel one's dW_local [out, K/tp]
 * += dy^T x_local. */
moe_status moe_shard_grads_tp_column(moe_shard_grads *g, moe_tp_linear *tp, const moe_real *dy_local,
                                     const moe_real *x, int in, int N, moe_real *dW_local);
moe_status moe_shard_grads_tp_row(moe_shard_grads *g, moe_tp_linear *tp, const moe_real *dy, const moe_real *x_local,
                                  int K, int out, moe_real *dW_local);

#endif
