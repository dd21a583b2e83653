/* piece_sum.c — products summed over fixed pieces of K, locally and across the tensor-parallel group
 * (piece_sum.h). */
#include "tp/piece_sum.h"

#include "core/fail.h"

static moe_status dense_add(void *ctx, const moe_real *a, const moe_real *b, size_t n, moe_real *y) {
    moe_tp_piece_sum *s = ctx;
    return s->ops->add(s->dense, a, b, n, y);
}

moe_status moe_tp_pieces_check(int num_pieces, int tp) {
    const int S = num_pieces;
    if (S < 1 || (S & (S - 1)))
        return moe_fail(MOE_ERR_INVALID_CONFIG, "--tp-shards %d: the fixed pieces of a tensor-parallel sum are a "
                        "power of two (1, 2, 4, ...)", S);
    if ((tp & (tp - 1)) || S % tp)
        return moe_fail(MOE_ERR_INVALID_CONFIG, "tensor parallelism over %d ranks with --tp-shards %d: each rank "
                        "must hold a whole subtree of the pieces, so the tensor-parallel size must be a power of two "
                        "that divides --tp-shards", tp, S);
    return MOE_OK;
}

moe_status moe_tp_piece_sum_init(moe_tp_piece_sum *s, moe_runtime *rt, moe_dense_state *dense, moe_comm *group,
                                 int num_pieces) {
    *s = (moe_tp_piece_sum){.rt = rt, .ops = moe_runtime_dense_ops(rt), .dense = dense, .group = group, .tp = 1,
                            .num_pieces = num_pieces};
    if (group) s->tp = moe_comm_size(group), s->tp_rank = moe_comm_rank(group);
    MOE_TRY(moe_tp_pieces_check(num_pieces, s->tp));
    s->local_pieces = num_pieces / s->tp;
    return moe_shard_tree_init(&s->tree, rt, dense_add, s, s->local_pieces, 0);
}

void moe_tp_piece_sum_free(moe_tp_piece_sum *s) {
    moe_shard_tree_free(&s->tree);
    if (s->rt) {
        moe_runtime_free(s->rt, s->a_piece), moe_runtime_free(s->rt, s->b_piece);
        moe_runtime_free(s->rt, s->sum);
    }
    s->a_piece = s->b_piece = s->sum = NULL;
}

moe_status moe_tp_piece_sum_local_width(const moe_tp_piece_sum *s, int K, int *local) {
    if (K < 1 || K % s->num_pieces)
        return moe_fail(MOE_ERR_INVALID_ARG, "a tensor-parallel sum over %d values in %d fixed pieces: the pieces "
                        "must divide it", K, s->num_pieces);
    *local = K / s->tp;
    return MOE_OK;
}

/* *buf holds at least count reals (its contents are not kept) */
static moe_status reserve(moe_runtime *rt, moe_real **buf, size_t *cap, size_t count) {
    if (count <= *cap) return MOE_OK;
    void **ptrs[1] = {(void **)buf};
    const size_t nbytes[1] = {count * sizeof(moe_real)};
    MOE_TRY(moe_runtime_regrow(rt, ptrs, nbytes, 1));
    *cap = count;
    return MOE_OK;
}

/* Piece j (local) of a row-major [rows, local_width] operand: the operand itself when it is one piece, else its
 * columns [j w, (j+1) w) copied into buf as [rows, w]. */
static moe_status piece_columns(moe_tp_piece_sum *s, const moe_real *m, int rows, int w, int j, moe_real **buf,
                                size_t *cap, const moe_real **piece) {
    if (s->local_pieces == 1) {
        *piece = m;
        return MOE_OK;
    }
    MOE_TRY(reserve(s->rt, buf, cap, (size_t)rows * w));
    const size_t row = (size_t)w * s->local_pieces * sizeof(moe_real);
    MOE_TRY(moe_runtime_copy_2d(s->rt, *buf, (size_t)w * sizeof(moe_real), m + (size_t)j * w, row,
                                (size_t)w * sizeof(moe_real), (size_t)rows));
    *piece = *buf;
    return MOE_OK;
}

typedef struct {
    const moe_real *act, *W; /* the local blocks: activations [T, K/tp], the weight's [*, K/tp] or [K/tp, in] */
    int T, w, n;             /* tokens, the piece width, the product's width (out or in) */
} piece_args;

typedef moe_status (*piece_product_fn)(moe_tp_piece_sum *s, const piece_args *a, int j, moe_real *leaf);

static moe_status row_parallel_piece(moe_tp_piece_sum *s, const piece_args *a, int j, moe_real *leaf) {
    const moe_real *x, *W;
    MOE_TRY(piece_columns(s, a->act, a->T, a->w, j, &s->a_piece, &s->a_cap, &x));
    MOE_TRY(piece_columns(s, a->W, a->n, a->w, j, &s->b_piece, &s->b_cap, &W));
    return s->ops->linear_forward(s->dense, x, W, a->T, a->w, a->n, leaf);
}

static moe_status column_parallel_piece(moe_tp_piece_sum *s, const piece_args *a, int j, moe_real *leaf) {
    const moe_real *dy;
    MOE_TRY(piece_columns(s, a->act, a->T, a->w, j, &s->a_piece, &s->a_cap, &dy));
    /* W's rows [j w, (j+1) w) of the local block are contiguous */
    return s->ops->linear_backward_input(s->dense, dy, a->W + (size_t)j * a->w * a->n, a->T, a->n, a->w, 0, leaf);
}

/* out[T, n] = the sum of all S pieces' products (overwritten), on every rank of the group */
static moe_status sum_pieces(moe_tp_piece_sum *s, piece_product_fn product, const piece_args *a, moe_real *out) {
    const size_t count = (size_t)a->T * a->n;
    if (s->local_pieces == 1) { /* the subtree is its leaf: formed in place (0 + leaf would give the same bits) */
        MOE_TRY(product(s, a, 0, out));
        return s->tp > 1 ? moe_comm_allreduce_tree_real(s->group, out, count) : MOE_OK;
    }
    if (count > s->tree.max_count) {
        moe_shard_tree_free(&s->tree);
        MOE_TRY(moe_shard_tree_init(&s->tree, s->rt, dense_add, s, s->local_pieces, count));
    }
    MOE_TRY(moe_shard_tree_begin(&s->tree, count));
    for (int j = 0; j < s->local_pieces; j++) {
        moe_real *leaf;
        MOE_TRY(moe_shard_tree_leaf_raw(&s->tree, &leaf)); /* the product overwrites it */
        MOE_TRY(product(s, a, j, leaf));
        MOE_TRY(moe_shard_tree_push(&s->tree));
    }
    MOE_TRY(moe_shard_tree_copy_to(&s->tree, out));
    return s->tp > 1 ? moe_comm_allreduce_tree_real(s->group, out, count) : MOE_OK;
}

static moe_status check_shape(const moe_tp_piece_sum *s, int T, int K, int n, int *w) {
    int local;
    MOE_TRY(moe_tp_piece_sum_local_width(s, K, &local));
    if (T < 0 || n < 1)
        return moe_fail(MOE_ERR_INVALID_ARG, "a tensor-parallel product of %d tokens and width %d", T, n);
    *w = K / s->num_pieces;
    return MOE_OK;
}

moe_status moe_tp_row_parallel_forward(moe_tp_piece_sum *s, const moe_real *x_local, const moe_real *W_local,
                                       int num_tokens, int K, int out, moe_real *y) {
    piece_args a = {.act = x_local, .W = W_local, .T = num_tokens, .n = out};
    MOE_TRY(check_shape(s, num_tokens, K, out, &a.w));
    return sum_pieces(s, row_parallel_piece, &a, y);
}

moe_status moe_tp_column_parallel_backward_input(moe_tp_piece_sum *s, const moe_real *dy_local,
                                                 const moe_real *W_local, int num_tokens, int in, int K,
                                                 moe_real beta, moe_real *dx) {
    if (beta != 0 && beta != 1) return moe_fail(MOE_ERR_INVALID_ARG, "beta %g is neither 0 nor 1", (double)beta);
    piece_args a = {.act = dy_local, .W = W_local, .T = num_tokens, .n = in};
    MOE_TRY(check_shape(s, num_tokens, K, in, &a.w));
    if (beta == 0) return sum_pieces(s, column_parallel_piece, &a, dx);
    const size_t count = (size_t)num_tokens * in;
    MOE_TRY(reserve(s->rt, &s->sum, &s->sum_cap, count));
    MOE_TRY(sum_pieces(s, column_parallel_piece, &a, s->sum));
    return s->ops->add(s->dense, dx, s->sum, count, dx);
}
