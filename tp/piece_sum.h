/* piece_sum.h — tensor parallelism's sums over an inner dimension, the same bits at any tensor-parallel size.
 *
 * Two products of Megatron's tensor parallelism add over a dimension K that the tensor-parallel group splits:
 *   row-parallel forward           y[T, out] = x[T, K] W[out, K]^T   (K: the input width; each rank holds a block of
 *                                                                      x's and W's columns; o_proj, down_proj)
 *   column-parallel input gradient dx[T, in] = dy[T, K] W[K, in]     (K: the output width; each rank holds a block
 *                                                                      of dy's columns and W's rows; q/k/v, gate/up)
 * A plain split adds tp partial products, so the bits would depend on tp. Here K is cut into S fixed virtual pieces
 * (--tp-shards S, a power of two; piece p = [p K/S, (p+1) K/S)), each piece's product is one GEMM of the dense-ops
 * table (its precision and row blocking: moe/dense_ops.h), and the S products are added in the fixed binary tree of
 * alltoall/tree_reduce.h: rank r of a group of tp ranks (a power of two dividing S) holds pieces [r S/tp, (r+1) S/tp),
 * a whole subtree, sums it locally (moe/shard_tree.h: core/tree_schedule.h's order) and runs the tree's upper levels
 * across the group (moe_comm_allreduce_tree_real). So the result depends on S and the values alone: tp 1, 2, 4, ...,
 * S give the same bits, and S = 1 (at tp 1) is the plain product, bit for bit (tests/test_tp_pieces_mpi.c).
 *
 * K must be a multiple of S (every piece the same width, so every piece is one GEMM shape). A piece's columns are
 * copied out of the row-major operands into scratch (moe_runtime_copy_2d) unless they are the whole local block.
 * Runtime memory throughout (host on the CPU, device on CUDA; the group's transport moves that memory). Host syncs:
 * those of the group's all-reduce. */
#ifndef MOE_TP_PIECE_SUM_H
#define MOE_TP_PIECE_SUM_H

#include <stddef.h>

#include "alltoall/comm.h"
#include "moe/dense_ops.h"
#include "moe/runtime.h"
#include "moe/shard_tree.h"

typedef struct {
    moe_runtime *rt;
    const moe_dense_ops *ops;
    moe_dense_state *dense;  /* the caller's: the GEMMs' precision and row blocking */
    moe_comm *group;         /* the tensor-parallel group; NULL: this rank alone (tp 1) */
    int tp, tp_rank;
    int num_pieces;          /* S */
    int local_pieces;        /* S / tp */
    moe_shard_tree tree;     /* the local subtree, grown to the largest product asked */
    moe_real *a_piece, *b_piece, *sum; /* scratch: one piece of each operand; a sum before it is added (beta 1) */
    size_t a_cap, b_cap, sum_cap;      /* reals each holds */
} moe_tp_piece_sum;

/* MOE_OK when S fixed pieces can be split over tp ranks: S a power of two >= 1, tp a power of two dividing it
 * (MOE_ERR_INVALID_CONFIG naming both otherwise). */
moe_status moe_tp_pieces_check(int num_pieces, int tp);

/* num_pieces: S, a power of two >= 1; group: NULL or a communicator whose size is a power of two dividing S
 * (MOE_ERR_INVALID_CONFIG naming both otherwise). dense: a state of rt's dense-ops table. */
moe_status moe_tp_piece_sum_init(moe_tp_piece_sum *s, moe_runtime *rt, moe_dense_state *dense, moe_comm *group,
                                 int num_pieces);
void moe_tp_piece_sum_free(moe_tp_piece_sum *s);

/* The widths a rank holds of a dimension K split over the group: K / tp, from column tp_rank K / tp on.
 * MOE_ERR_INVALID_ARG unless S divides K. */
moe_status moe_tp_piece_sum_local_width(const moe_tp_piece_sum *s, int K, int *local);

/* y[T, out] = x[T, K] W[out, K]^T, the whole product on every rank of the group. x_local [T, K/tp] and W_local
 * [out, K/tp] are this rank's columns. y is overwritten. */
moe_status moe_tp_row_parallel_forward(moe_tp_piece_sum *s, const moe_real *x_local, const moe_real *W_local,
                                       int num_tokens, int K, int out, moe_real *y);
/* dx[T, in] = dy[T, K] W[K, in] + beta dx (beta 0 or 1; with 1 the whole sum is added to dx in one rounding), on
 * every rank of the group. dy_local [T, K/tp] is this rank's columns of dy, W_local [K/tp, in] its rows of W. */
moe_status moe_tp_column_parallel_backward_input(moe_tp_piece_sum *s, const moe_real *dy_local,
                                                 const moe_real *W_local, int num_tokens, int in, int K,
                                                 moe_real beta, moe_real *dx);

#endif
