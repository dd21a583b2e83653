/* linear.c — a tensor-parallel linear layer's products, piece by piece (linear.h). */
#include "tp/linear.h"

#include "core/fail.h"

static moe_status dense_add(void *ctx, const moe_real *a, const moe_real *b, size_t n, moe_real *y) {
    moe_tp_linear *l = ctx;
    return l->ops->add(l->dense, a, b, n, y);
}

moe_status moe_tp_pieces_check(int num_pieces, int tp) {
    const int S = num_pieces;
    if (S < 1 || (S & (S - 1)))
        return moe_fail(MOE_ERR_INVALID_CONFIG, "--tp-shards %d: the fixed pieces of tensor parallelism's products "
                        "are a power of two (1, 2, 4, ...)", S);
    if (tp < 1 || (tp & (tp - 1)) || S % tp)
        return moe_fail(MOE_ERR_INVALID_CONFIG, "tensor parallelism over %d ranks with --tp-shards %d: each rank "
                        "must hold a whole subtree of the pieces, so the tensor-parallel size must be a power of two "
                        "that divides --tp-shards", tp, S);
    return MOE_OK;
}

moe_status moe_tp_linear_init(moe_tp_linear *l, moe_runtime *rt, moe_dense_state *dense, moe_comm *group,
                              int num_pieces) {
    *l = (moe_tp_linear){.rt = rt, .ops = moe_runtime_dense_ops(rt), .dense = dense, .group = group, .tp = 1,
                         .num_pieces = num_pieces};
    if (group) l->tp = moe_comm_size(group), l->tp_rank = moe_comm_rank(group);
    MOE_TRY(moe_tp_pieces_check(num_pieces, l->tp));
    l->local_pieces = num_pieces / l->tp;
    return moe_shard_tree_init(&l->tree, rt, dense_add, l, l->local_pieces, 0);
}

moe_status moe_tp_linear_init_block(moe_tp_linear *l, moe_runtime *rt, moe_dense_state *dense, int num_pieces,
                                    int blocks, int block) {
    MOE_TRY(moe_tp_pieces_check(num_pieces, blocks));
    if (block < 0 || block >= blocks) return moe_fail(MOE_ERR_INVALID_ARG, "block %d of %d", block, blocks);
    MOE_TRY(moe_tp_linear_init(l, rt, dense, NULL, num_pieces)); /* its tree (S leaves) serves no sum here */
    l->tp = blocks, l->tp_rank = block, l->local_pieces = num_pieces / blocks;
    return MOE_OK;
}

void moe_tp_linear_free(moe_tp_linear *l) {
    moe_shard_tree_free(&l->tree);
    if (l->rt) {
        moe_runtime_free(l->rt, l->a_piece), moe_runtime_free(l->rt, l->b_piece);
        moe_runtime_free(l->rt, l->c_piece), moe_runtime_free(l->rt, l->sum);
    }
    l->a_piece = l->b_piece = l->c_piece = l->sum = NULL;
    l->a_cap = l->b_cap = l->c_cap = l->sum_cap = 0;
}

moe_status moe_tp_linear_local_width(const moe_tp_linear *l, int D, int *local) {
    if (D < 1 || D % l->num_pieces)
        return moe_fail(MOE_ERR_INVALID_ARG, "a tensor-parallel split of %d values into %d fixed pieces "
                        "(--tp-shards): the pieces must divide it", D, l->num_pieces);
    *local = D / l->tp;
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

/* A local block [rows, w S/tp] of a split dimension: its piece j is its columns [j w, (j+1) w). */
typedef struct {
    int rows, w;
} block;

static size_t block_pitch(const moe_tp_linear *l, block b) { return (size_t)b.w * l->local_pieces * sizeof(moe_real); }

/* Piece j of m as a contiguous [rows, w]: m itself when the block is one piece, else copied into *buf. */
static moe_status piece_in(moe_tp_linear *l, const moe_real *m, block b, int j, moe_real **buf, size_t *cap,
                           const moe_real **piece) {
    if (l->local_pieces == 1) return *piece = m, MOE_OK;
    MOE_TRY(reserve(l->rt, buf, cap, (size_t)b.rows * b.w));
    const size_t wb = (size_t)b.w * sizeof(moe_real);
    MOE_TRY(moe_runtime_copy_2d(l->rt, *buf, wb, m + (size_t)j * b.w, block_pitch(l, b), wb, (size_t)b.rows));
    return *piece = *buf, MOE_OK;
}

/* Where piece j of m is formed: m itself when the block is one piece, else l's result scratch, holding the piece's
 * current values when `keep` (a product that accumulates); piece_out then puts it in place. */
static moe_status piece_target(moe_tp_linear *l, moe_real *m, block b, int j, int keep, moe_real **target) {
    if (l->local_pieces == 1) return *target = m, MOE_OK;
    const moe_real *current;
    if (keep) {
        MOE_TRY(piece_in(l, m, b, j, &l->c_piece, &l->c_cap, &current));
    } else {
        MOE_TRY(reserve(l->rt, &l->c_piece, &l->c_cap, (size_t)b.rows * b.w));
    }
    return *target = l->c_piece, MOE_OK;
}

static moe_status piece_out(moe_tp_linear *l, moe_real *m, block b, int j) {
    if (l->local_pieces == 1) return MOE_OK;
    const size_t wb = (size_t)b.w * sizeof(moe_real);
    return moe_runtime_copy_2d(l->rt, m + (size_t)j * b.w, block_pitch(l, b), l->c_piece, wb, wb, (size_t)b.rows);
}

/* The split dimension D's piece width, checked with the product's other sizes. */
static moe_status piece_width(const moe_tp_linear *l, int T, int D, int other, int *w) {
    int local;
    MOE_TRY(moe_tp_linear_local_width(l, D, &local));
    if (T < 0 || other < 1)
        return moe_fail(MOE_ERR_INVALID_ARG, "a tensor-parallel product of %d tokens and width %d", T, other);
    *w = D / l->num_pieces;
    return MOE_OK;
}

static moe_status check_beta(moe_real beta) {
    return beta == 0 || beta == 1 ? MOE_OK : moe_fail(MOE_ERR_INVALID_ARG, "beta %g is neither 0 nor 1", (double)beta);
}

/* ---- the two sums over the group ---- */

typedef struct {
    const moe_real *act, *W; /* the local blocks: activations [T, D/tp]; the weight's [n, D/tp] or [D/tp, n] */
    int T, w, n;             /* tokens, the piece width, the product's width */
} sum_args;

typedef moe_status (*piece_product_fn)(moe_tp_linear *l, const sum_args *a, int j, moe_real *leaf);

/* row forward, piece j: x_j W_j^T */
static moe_status row_forward_piece(moe_tp_linear *l, const sum_args *a, int j, moe_real *leaf) {
    const moe_real *x, *W;
    MOE_TRY(piece_in(l, a->act, (block){a->T, a->w}, j, &l->a_piece, &l->a_cap, &x));
    MOE_TRY(piece_in(l, a->W, (block){a->n, a->w}, j, &l->b_piece, &l->b_cap, &W));
    return l->ops->linear_forward(l->dense, x, W, a->T, a->w, a->n, leaf);
}

/* column backward input, piece j: dy_j W_j, W_j the block's rows [j w, (j+1) w) (contiguous) */
static moe_status column_backward_input_piece(moe_tp_linear *l, const sum_args *a, int j, moe_real *leaf) {
    const moe_real *dy;
    MOE_TRY(piece_in(l, a->act, (block){a->T, a->w}, j, &l->a_piece, &l->a_cap, &dy));
    return l->ops->linear_backward_input(l->dense, dy, a->W + (size_t)j * a->w * a->n, a->T, a->n, a->w, 0, leaf);
}

moe_status moe_tp_sum_pieces(moe_tp_linear *l, size_t count, moe_tp_piece_fn piece, void *ctx, moe_real *out) {
    if (l->tp > 1 && !l->group)
        return moe_fail(MOE_ERR_INVALID_ARG, "a sum over the pieces of a block held without its group");
    if (l->local_pieces == 1) { /* the subtree is its leaf: formed in place (0 + leaf would give the same bits) */
        MOE_TRY(piece(ctx, 0, out));
        return l->tp > 1 ? moe_comm_allreduce_tree_real(l->group, out, count) : MOE_OK;
    }
    if (count > l->tree.max_count) {
        moe_shard_tree_free(&l->tree);
        MOE_TRY(moe_shard_tree_init(&l->tree, l->rt, dense_add, l, l->local_pieces, count));
    }
    MOE_TRY(moe_shard_tree_begin(&l->tree, count));
    for (int j = 0; j < l->local_pieces; j++) {
        moe_real *leaf;
        MOE_TRY(moe_shard_tree_leaf_raw(&l->tree, &leaf)); /* the piece overwrites it */
        MOE_TRY(piece(ctx, j, leaf));
        MOE_TRY(moe_shard_tree_push(&l->tree));
    }
    MOE_TRY(moe_shard_tree_copy_to(&l->tree, out));
    return l->tp > 1 ? moe_comm_allreduce_tree_real(l->group, out, count) : MOE_OK;
}

/* A product's piece j as moe_tp_sum_pieces asks for it. */
typedef struct {
    moe_tp_linear *l;
    piece_product_fn product;
    const sum_args *a;
} product_piece;

static moe_status form_product_piece(void *ctx, int j, moe_real *leaf) {
    const product_piece *p = ctx;
    return p->product(p->l, p->a, j, leaf);
}

/* out[T, n] = the sum of all S pieces' products (overwritten), on every rank of the group */
static moe_status sum_pieces(moe_tp_linear *l, piece_product_fn product, const sum_args *a, moe_real *out) {
    product_piece p = {l, product, a};
    return moe_tp_sum_pieces(l, (size_t)a->T * a->n, form_product_piece, &p, out);
}

/* out = sum (beta 0) or out + sum (beta 1, one rounding) */
static moe_status sum_pieces_beta(moe_tp_linear *l, piece_product_fn product, const sum_args *a, moe_real beta,
                                  moe_real *out) {
    if (beta == 0) return sum_pieces(l, product, a, out);
    const size_t count = (size_t)a->T * a->n;
    MOE_TRY(reserve(l->rt, &l->sum, &l->sum_cap, count));
    MOE_TRY(sum_pieces(l, product, a, l->sum));
    return l->ops->add(l->dense, out, l->sum, count, out);
}

moe_status moe_tp_row_forward(moe_tp_linear *l, const moe_real *x_local, const moe_real *W_local, int num_tokens,
                              int K, int out, moe_real *y) {
    sum_args a = {.act = x_local, .W = W_local, .T = num_tokens, .n = out};
    MOE_TRY(piece_width(l, num_tokens, K, out, &a.w));
    return sum_pieces(l, row_forward_piece, &a, y);
}

moe_status moe_tp_column_backward_input(moe_tp_linear *l, const moe_real *dy_local, const moe_real *W_local,
                                        int num_tokens, int in, int N, moe_real beta, moe_real *dx) {
    MOE_TRY(check_beta(beta));
    sum_args a = {.act = dy_local, .W = W_local, .T = num_tokens, .n = in};
    MOE_TRY(piece_width(l, num_tokens, N, in, &a.w));
    return sum_pieces_beta(l, column_backward_input_piece, &a, beta, dx);
}

/* ---- the four products whose pieces are concatenated (no exchange) ---- */

moe_status moe_tp_column_forward(moe_tp_linear *l, const moe_real *x, const moe_real *W_local, int num_tokens, int in,
                                 int N, moe_real *y_local) {
    int w = 0;
    MOE_TRY(piece_width(l, num_tokens, N, in, &w));
    const block y = {num_tokens, w};
    for (int j = 0; j < l->local_pieces; j++) {
        moe_real *target;
        MOE_TRY(piece_target(l, y_local, y, j, 0, &target));
        MOE_TRY(l->ops->linear_forward(l->dense, x, W_local + (size_t)j * w * in, num_tokens, in, w, target));
        MOE_TRY(piece_out(l, y_local, y, j));
    }
    return MOE_OK;
}

moe_status moe_tp_column_backward_weight(moe_tp_linear *l, const moe_real *dy_local, const moe_real *x, int num_tokens,
                                         int in, int N, moe_real *dW_local) {
    int w = 0;
    MOE_TRY(piece_width(l, num_tokens, N, in, &w));
    for (int j = 0; j < l->local_pieces; j++) { /* dW's rows [j w, (j+1) w) += dy_j^T x */
        const moe_real *dy;
        MOE_TRY(piece_in(l, dy_local, (block){num_tokens, w}, j, &l->a_piece, &l->a_cap, &dy));
        MOE_TRY(l->ops->linear_backward_weight(l->dense, dy, x, num_tokens, in, w, dW_local + (size_t)j * w * in));
    }
    return MOE_OK;
}

moe_status moe_tp_row_backward_input(moe_tp_linear *l, const moe_real *dy, const moe_real *W_local, int num_tokens,
                                     int K, int out, moe_real beta, moe_real *dx_local) {
    MOE_TRY(check_beta(beta));
    int w = 0;
    MOE_TRY(piece_width(l, num_tokens, K, out, &w));
    const block dx = {num_tokens, w};
    for (int j = 0; j < l->local_pieces; j++) { /* dx_j (+)= dy W_j, W_j the block's columns [j w, (j+1) w) */
        const moe_real *W;
        moe_real *target;
        MOE_TRY(piece_in(l, W_local, (block){out, w}, j, &l->b_piece, &l->b_cap, &W));
        MOE_TRY(piece_target(l, dx_local, dx, j, beta != 0, &target));
        MOE_TRY(l->ops->linear_backward_input(l->dense, dy, W, num_tokens, w, out, beta, target));
        MOE_TRY(piece_out(l, dx_local, dx, j));
    }
    return MOE_OK;
}

moe_status moe_tp_row_backward_weight(moe_tp_linear *l, const moe_real *dy, const moe_real *x_local, int num_tokens,
                                      int K, int out, moe_real *dW_local) {
    int w = 0;
    MOE_TRY(piece_width(l, num_tokens, K, out, &w));
    const block dW = {out, w};
    for (int j = 0; j < l->local_pieces; j++) { /* dW's columns [j w, (j+1) w) += dy^T x_j */
        const moe_real *x;
        moe_real *target;
        MOE_TRY(piece_in(l, x_local, (block){num_tokens, w}, j, &l->a_piece, &l->a_cap, &x));
        MOE_TRY(piece_target(l, dW_local, dW, j, 1, &target));
        MOE_TRY(l->ops->linear_backward_weight(l->dense, dy, x, num_tokens, w, out, target));
        MOE_TRY(piece_out(l, dW_local, dW, j));
    }
    return MOE_OK;
}
