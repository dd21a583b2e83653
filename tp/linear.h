/* linear.h — the six products of Megatron's tensor-parallel linear layers, in fixed pieces, so that every rank's
 * results are the same bits at any tensor-parallel size.
 *
 * A column-parallel linear (q/k/v, gate/up) splits W [N, in] by rows: rank r holds W_r = rows [r N/tp, (r+1) N/tp)
 * and the matching columns of y. A row-parallel linear (o_proj, down_proj) splits W [out, K] by columns: rank r holds
 * W_r = columns [r K/tp, (r+1) K/tp) and the matching columns of x. Row-major throughout, T token rows:
 *   column forward          y_r[T, N/tp]  = x[T, in] W_r^T          (concatenated: no sum over ranks)
 *   column backward input   dx[T, in]     = dy[T, N] W[N, in]        (a sum over N: over the group)
 *   column backward weight  dW_r[N/tp, in] += dy_r^T x
 *   row forward             y[T, out]     = x[T, K] W[out, K]^T      (a sum over K: over the group)
 *   row backward input      dx_r[T, K/tp] = dy[T, out] W_r
 *   row backward weight     dW_r[out, K/tp] += dy^T x_r
 * The split dimension is cut into S fixed virtual pieces (--tp-shards S, a power of two; piece p = [p D/S, (p+1) D/S)
 * of the split dimension D), and every product runs piece by piece: one GEMM of the dense-ops table per piece (its
 * precision and row blocking: moe/dense_ops.h), whose shape depends on S and never on tp, since a GEMM library may
 * round a column differently when the call has more columns. Concatenated products write each piece's columns or rows
 * in place. The two sums add the S pieces' products in the fixed binary tree of alltoall/tree_reduce.h: rank r of a
 * group of tp ranks (a power of two dividing S) holds pieces [r S/tp, (r+1) S/tp), a whole subtree, sums it locally
 * (moe/shard_tree.h: core/tree_schedule.h's order) and runs the tree's upper levels across the group
 * (moe_comm_allreduce_tree_real). So every result depends on S and the values alone: tp 1, 2, 4, ..., S give the same
 * bits (tests/test_tp_products.c, on the CPU and CUDA), and S = 1 at tp 1 is the dense table's plain product, bit for
 * bit.
 *
 * D must be a multiple of S. A piece's columns are copied between the row-major operands and scratch
 * (moe_runtime_copy_2d) unless the piece is the rank's whole block. Runtime memory throughout (host on the CPU,
 * device on CUDA; the group's transport moves that memory). Host syncs: those of the group's all-reduce. */
#ifndef MOE_TP_LINEAR_H
#define MOE_TP_LINEAR_H

#include <stddef.h>

#include "alltoall/comm.h"
#include "moe/dense_ops.h"
#include "moe/runtime.h"
#include "moe/shard_tree.h"

typedef struct {
    moe_runtime *rt;
    const moe_dense_ops *ops;
    moe_dense_state *dense;  /* the caller's: the GEMMs' precision and row blocking */
    moe_comm *group;         /* the tensor-parallel group; NULL: this rank alone (tp 1), or a block's products */
    int tp, tp_rank;         /* the ranks (blocks) the split dimension is cut into; this rank's */
    int num_pieces;          /* S */
    int local_pieces;        /* S / tp */
    moe_shard_tree tree;     /* the sums' local subtree, grown to the largest product asked */
    moe_real *a_piece, *b_piece, *c_piece, *sum; /* scratch: pieces of two operands and of a result; a whole sum */
    size_t a_cap, b_cap, c_cap, sum_cap;         /* reals each holds */
} moe_tp_linear;

/* MOE_OK when S fixed pieces can be split over tp ranks: S a power of two >= 1, tp a power of two dividing it
 * (MOE_ERR_INVALID_CONFIG naming both otherwise). */
moe_status moe_tp_pieces_check(int num_pieces, int tp);

/* num_pieces: S; group: NULL or a communicator of tp ranks (MOE_ERR_INVALID_CONFIG unless moe_tp_pieces_check
 * accepts them). dense: a state of rt's dense-ops table. */
moe_status moe_tp_linear_init(moe_tp_linear *l, moe_runtime *rt, moe_dense_state *dense, moe_comm *group,
                              int num_pieces);
/* A split held in `blocks` distinct blocks over a larger group (k_proj and v_proj with fewer kv heads than tp, each
 * block replicated over the ranks that share it): this rank's block `block` of `blocks` (a power of two dividing
 * num_pieces), for the products without a sum over the group (column forward and backward weight, row backward input
 * and weight); the two sums answer MOE_ERR_INVALID_ARG. */
moe_status moe_tp_linear_init_block(moe_tp_linear *l, moe_runtime *rt, moe_dense_state *dense, int num_pieces,
                                    int blocks, int block);
void moe_tp_linear_free(moe_tp_linear *l);

/* The width a rank holds of a split dimension D: D / tp. MOE_ERR_INVALID_ARG unless S divides D. */
moe_status moe_tp_linear_local_width(const moe_tp_linear *l, int D, int *local);

/* Column-parallel (N: the whole output width; W_local [N/tp, in]). forward overwrites y_local; backward input gives
 * every rank of the group the whole dx, + beta dx (beta 0 or 1; with 1 the whole sum is added in one rounding);
 * backward weight accumulates into dW_local. */
moe_status moe_tp_column_forward(moe_tp_linear *l, const moe_real *x, const moe_real *W_local, int num_tokens, int in,
                                 int N, moe_real *y_local);
moe_status moe_tp_column_backward_input(moe_tp_linear *l, const moe_real *dy_local, const moe_real *W_local,
                                        int num_tokens, int in, int N, moe_real beta, moe_real *dx);
moe_status moe_tp_column_backward_weight(moe_tp_linear *l, const moe_real *dy_local, const moe_real *x, int num_tokens,
                                         int in, int N, moe_real *dW_local);

/* Row-parallel (K: the whole input width; W_local [out, K/tp], x_local [T, K/tp]). forward gives every rank of the
 * group the whole y (overwritten); backward input: dx_local = dy W_local + beta dx_local (beta 0 or 1); backward
 * weight accumulates into dW_local. */
moe_status moe_tp_row_forward(moe_tp_linear *l, const moe_real *x_local, const moe_real *W_local, int num_tokens,
                              int K, int out, moe_real *y);
moe_status moe_tp_row_backward_input(moe_tp_linear *l, const moe_real *dy, const moe_real *W_local, int num_tokens,
                                     int K, int out, moe_real beta, moe_real *dx_local);
moe_status moe_tp_row_backward_weight(moe_tp_linear *l, const moe_real *dy, const moe_real *x_local, int num_tokens,
                                      int K, int out, moe_real *dW_local);

/* The fixed tree of the two sums above for any per-piece values: out[count] = the sum over the split dimension's S
 * pieces of what `piece` forms for each (j: the rank's local piece, 0 .. S / tp - 1, i.e. global piece
 * tp_rank S / tp + j; it overwrites leaf[count]), on every rank of the group. Multi-head latent attention's shared
 * RoPE key takes its gradient so, summed over the heads piece by piece (models/mla.c). */
typedef moe_status (*moe_tp_piece_fn)(void *ctx, int j, moe_real *leaf);
moe_status moe_tp_sum_pieces(moe_tp_linear *l, size_t count, moe_tp_piece_fn piece, void *ctx, moe_real *out);

#endif
