/* test_tp_pieces_mpi.c — tensor parallelism's sums over fixed pieces (tp/piece_sum.h, tp/vocab_cross_entropy.h)
 * give the same bits at every tensor-parallel size.
 *
 * Under mpirun -np W (meson: W = 1, 2, 4, 8) the world is one tensor-parallel group of tp = W ranks. Every rank
 * draws the same whole operands, keeps its own block (columns, or rows of a column-parallel weight) and runs the
 * group's product; the oracle is the same call at tp 1 (no group) on the whole operands, made on every rank. For
 * S in {W, 8, 16} (S >= W) pieces, fp32 and bf16 GEMM inputs, the row blocking of layout invariance on:
 * - the row-parallel forward y = x W^T (T 37, K 64, out 24) and the column-parallel input gradient dx = dy W
 *   (beta 0 and beta 1 onto a random dx): every rank's result bitwise the oracle's;
 * - the vocabulary-parallel cross-entropy (T 29, V 1024, logits uniform in [-16, 16): exp(l - M) spans 2^-46 .. 1,
 *   so even the double sums round and their order shows): the loss and the softmax denominators (white box: the
 *   loss and gradient, rounded further, rarely show their last bits) bitwise the oracle's on every rank, and each
 *   rank's gradient columns bitwise the oracle's columns;
 * - at S = 1 the oracle is the plain product (dense table's linear) and the whole-vocabulary kernel
 *   (kernels/cross_entropy.h), bit for bit; at S = 8 it is within rounding of them (1e-5 relative; the loss 1e-9) and
 *   differs somewhere (the piece order matters for these data, so a bitwise check can fail: checked by hand with each
 *   rank's block summed as one piece, the plain split, which fails every tp > 1);
 * - refusals, local and before any exchange: S not a power of two, tp not dividing S, K or V not divisible by S, a
 *   target outside the vocabulary. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "alltoall/comm_mpi.h"
#include "kernels/cross_entropy.h"
#include "moe/dense_ops.h"
#include "tests/test_mpi.h"
#include "tests/test_tp_blocks.h"
#include "tp/piece_sum.h"
#include "tp/vocab_cross_entropy.h"

enum { T = 37, K = 64, OUT = 24, CE_T = 29, CE_V = 1024, SEED = 28 };

static int W, rank;
static moe_runtime *rt;

/* count values uniform in scale * [-1, 1), the same on every rank for a seed; mixed: every 7th 100x larger */
static moe_real *operand(uint64_t seed, size_t count, double scale, int mixed) {
    moe_rng rng = moe_rng_seeded(seed);
    moe_real *a = test_alloc_uniform(&rng, count, scale);
    for (size_t i = 0; mixed && i < count; i += 7) a[i] *= 100;
    return a;
}

static moe_real *column_block(const moe_real *m, int rows, int cols) {
    return test_tp_column_block(m, rows, cols, rank, W);
}

static double max_rel_err(const moe_real *a, const moe_real *b, size_t n) {
    double scale = 0, err = 0;
    for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs((double)b[i]));
    for (size_t i = 0; i < n; i++) err = fmax(err, fabs((double)a[i] - (double)b[i]));
    return err / (scale > 0 ? scale : 1);
}

typedef enum { ROW_FORWARD, COLUMN_BACKWARD_BETA0, COLUMN_BACKWARD_BETA1 } product;
static const char *const kProductNames[] = {"row-parallel forward", "column-parallel dx (beta 0)",
                                            "column-parallel dx (beta 1)"};

/* The product at S pieces on group (NULL: tp 1, the whole operands). a: x [T, K] or dy [T, K]; w: W [OUT, K] (row)
 * or W [K, OUT] (column: in = OUT); result [T, OUT]. */
static void run_product(moe_dense_state *dense, moe_comm *group, int S, product p, const moe_real *a,
                        const moe_real *w, const moe_real *dx0, moe_real *result) {
    moe_tp_piece_sum s;
    test_mpi_require(moe_tp_piece_sum_init(&s, rt, dense, group, S), "piece sum");
    const int tp = group ? W : 1;
    moe_real *a_local = group ? column_block(a, T, K) : (moe_real *)a;
    if (p == ROW_FORWARD) {
        moe_real *w_local = group ? column_block(w, OUT, K) : (moe_real *)w;
        test_mpi_require(moe_tp_row_parallel_forward(&s, a_local, w_local, T, K, OUT, result), "row forward");
        if (group) free(w_local);
    } else {
        const moe_real *w_local = w + (size_t)(group ? rank : 0) * (K / tp) * OUT; /* this rank's rows */
        const moe_real beta = p == COLUMN_BACKWARD_BETA1;
        if (beta) memcpy(result, dx0, (size_t)T * OUT * sizeof *result);
        test_mpi_require(moe_tp_column_parallel_backward_input(&s, a_local, w_local, T, OUT, K, beta, result),
                         "column backward");
    }
    if (group) free(a_local);
    moe_tp_piece_sum_free(&s);
}

static void check_products(moe_comm *group, moe_precision precision) {
    const moe_dense_ops *ops = moe_runtime_dense_ops(rt);
    moe_dense_state *dense;
    test_mpi_require(ops->create(rt, 1, precision, K, &dense), "dense state");
    moe_real *x = operand(SEED, (size_t)T * K, 1, 1), *w = operand(SEED + 1, (size_t)OUT * K, 0.1, 1);
    moe_real *dx0 = operand(SEED + 2, (size_t)T * OUT, 1, 1);
    if (precision == MOE_PRECISION_BF16) /* the weights' bf16 copies, as the model makes them */
        test_mpi_require(ops->round_bf16(dense, w, (size_t)OUT * K, w), "round");
    const size_t n = (size_t)T * OUT;
    moe_real *got = malloc(n * sizeof *got), *want = malloc(n * sizeof *want), *plain = malloc(n * sizeof *plain);
    for (product p = ROW_FORWARD; p <= COLUMN_BACKWARD_BETA1; p++) {
        /* the plain product: the dense table's linear over the whole K */
        if (p == ROW_FORWARD) test_mpi_require(ops->linear_forward(dense, x, w, T, K, OUT, plain), "linear");
        else {
            memcpy(plain, dx0, n * sizeof *plain);
            test_mpi_require(ops->linear_backward_input(dense, x, w, T, OUT, K, p == COLUMN_BACKWARD_BETA1, plain),
                             "linear dx");
        }
        run_product(dense, NULL, 1, p, x, w, dx0, want);
        CHECK(test_tp_count_diff(want, plain, n) == 0, "%s, %s: one piece is not the plain product bit for bit",
              kProductNames[p], moe_precision_name(precision));
        const int sizes[] = {W, 8, 16};
        for (int i = 0; i < 3; i++) {
            const int S = sizes[i];
            if (S < W || (i > 0 && S == W)) continue;
            run_product(dense, NULL, S, p, x, w, dx0, want);
            run_product(dense, group, S, p, x, w, dx0, got);
            const size_t diff = test_tp_count_diff(got, want, n);
            CHECK(diff == 0, "%s, %s, S %d: tp %d differs from tp 1 in %zu of %zu values", kProductNames[p],
                  moe_precision_name(precision), S, W, diff, n);
            CHECK(max_rel_err(want, plain, n) < 1e-5, "%s, %s, S %d: %g from the plain product", kProductNames[p],
                  moe_precision_name(precision), S, max_rel_err(want, plain, n));
            if (S == 8 && p != COLUMN_BACKWARD_BETA1)
                CHECK(test_tp_count_diff(want, plain, n) > 0, "%s, %s: 8 pieces give the plain product's bits everywhere: "
                      "the data cannot tell the orders apart", kProductNames[p], moe_precision_name(precision));
        }
    }
    free(x), free(w), free(dx0), free(got), free(want), free(plain);
    ops->destroy(dense);
}

/* the loss, the softmax denominators Z_t (white box: the tree's sums, which the loss and the gradient, rounded
 * further, rarely show) and this rank's gradient columns at S pieces on group (NULL: the whole vocabulary) */
static void run_cross_entropy(moe_comm *group, int S, const moe_real *logits, const int *targets, double *loss,
                              double z[CE_T], moe_real *grad) {
    moe_tp_cross_entropy ce;
    test_mpi_require(moe_tp_cross_entropy_init(&ce, group, S), "cross-entropy");
    const int cols = group ? CE_V / W : CE_V;
    moe_real *l = group ? column_block(logits, CE_T, CE_V) : memcpy(malloc(sizeof *l * CE_T * CE_V), logits,
                                                                     sizeof *l * CE_T * CE_V);
    test_mpi_require(moe_tp_cross_entropy_forward(&ce, l, targets, CE_T, CE_V, loss), "forward");
    test_mpi_require(moe_tp_cross_entropy_backward(&ce, l, targets, CE_T, CE_V, (moe_real)(1.0 / CE_T)), "backward");
    memcpy(grad, l, sizeof *l * CE_T * cols);
    memcpy(z, ce.z, sizeof *z * CE_T);
    free(l);
    moe_tp_cross_entropy_free(&ce);
}

static void check_cross_entropy(moe_comm *group) {
    moe_real *logits = operand(SEED + 3, (size_t)CE_T * CE_V, 16, 0);
    int targets[CE_T];
    moe_rng rng = moe_rng_seeded(SEED + 4);
    for (int t = 0; t < CE_T; t++) targets[t] = (int)(moe_rng_next(&rng) % CE_V);
    const size_t n = (size_t)CE_T * CE_V;
    moe_real *want = malloc(n * sizeof *want), *got = malloc(n * sizeof *got), *plain = malloc(n * sizeof *plain);
    double loss_want, loss_got, z_plain[CE_T], z_want[CE_T], z_got[CE_T];
    /* one piece is the whole-vocabulary kernel */
    memcpy(plain, logits, n * sizeof *plain);
    const double loss_plain = moe_cross_entropy_forward_cpu(plain, targets, CE_T, CE_V);
    moe_cross_entropy_backward_cpu(plain, targets, CE_T, CE_V, (moe_real)(1.0 / CE_T));
    run_cross_entropy(NULL, 1, logits, targets, &loss_want, z_plain, want);
    CHECK(memcmp(&loss_want, &loss_plain, sizeof loss_want) == 0 && test_tp_count_diff(want, plain, n) == 0,
          "one piece: loss %.17g vs the kernel's %.17g, %zu gradient values differ", loss_want, loss_plain,
          test_tp_count_diff(want, plain, n));
    const int sizes[] = {W, 8, 16};
    for (int i = 0; i < 3; i++) {
        const int S = sizes[i];
        if (S < W || (i > 0 && S == W)) continue;
        run_cross_entropy(NULL, S, logits, targets, &loss_want, z_want, want);
        run_cross_entropy(group, S, logits, targets, &loss_got, z_got, got);
        CHECK(memcmp(&loss_got, &loss_want, sizeof loss_got) == 0, "cross-entropy, S %d: tp %d loss %.17g, tp 1 %.17g",
              S, W, loss_got, loss_want);
        CHECK(memcmp(z_got, z_want, sizeof z_got) == 0, "cross-entropy, S %d: tp %d's denominators differ from tp 1's",
              S, W);
        moe_real *want_local = column_block(want, CE_T, CE_V);
        const size_t diff = test_tp_count_diff(got, want_local, n / W);
        CHECK(diff == 0, "cross-entropy, S %d: tp %d's gradient differs from tp 1's in %zu of %zu values", S, W, diff,
              n / W);
        free(want_local);
        CHECK(fabs(loss_want - loss_plain) < 1e-9 * fabs(loss_plain) && max_rel_err(want, plain, n) < 1e-5,
              "cross-entropy, S %d: loss %.17g vs the kernel's %.17g", S, loss_want, loss_plain);
        if (S == 8)
            CHECK(memcmp(z_want, z_plain, sizeof z_want) != 0, "cross-entropy: 8 pieces give the whole-vocabulary "
                  "sums' bits for every token: the data cannot tell the orders apart");
    }
    free(logits), free(want), free(got), free(plain);
}

/* Refusals: each on every rank alike, before any exchange (a lone failure would leave the others waiting). */
static void check_refusals(moe_comm *group) {
    moe_tp_piece_sum s;
    CHECK(moe_tp_pieces_check(6, 1) == MOE_ERR_INVALID_CONFIG, "6 pieces accepted");
    CHECK(moe_tp_pieces_check(8, 3) == MOE_ERR_INVALID_CONFIG, "tp 3 accepted");
    CHECK(moe_tp_pieces_check(4, 8) == MOE_ERR_INVALID_CONFIG, "tp 8 over 4 pieces accepted");
    if (W > 1) {
        CHECK(moe_tp_piece_sum_init(&s, rt, NULL, group, W / 2) == MOE_ERR_INVALID_CONFIG, "S < tp accepted");
        moe_tp_piece_sum_free(&s);
    }
    const moe_dense_ops *ops = moe_runtime_dense_ops(rt);
    moe_dense_state *dense;
    test_mpi_require(ops->create(rt, 1, MOE_PRECISION_FP32, K, &dense), "dense state");
    test_mpi_require(moe_tp_piece_sum_init(&s, rt, dense, group, 16), "piece sum");
    moe_real x[4 * 72] = {0}, w[4 * 72] = {0}, y[16] = {0};
    CHECK(moe_tp_row_parallel_forward(&s, x, w, 4, 72, 4, y) == MOE_ERR_INVALID_ARG, "K 72 in 16 pieces accepted");
    CHECK(moe_tp_column_parallel_backward_input(&s, x, w, 4, 4, 72, 0, y) == MOE_ERR_INVALID_ARG,
          "K 72 in 16 pieces accepted");
    moe_tp_piece_sum_free(&s);
    ops->destroy(dense);
    moe_tp_cross_entropy ce;
    test_mpi_require(moe_tp_cross_entropy_init(&ce, group, 16), "cross-entropy");
    moe_real logits[2 * 96] = {0};
    int targets[2] = {0, 96};
    double loss;
    CHECK(moe_tp_cross_entropy_forward(&ce, logits, targets, 2, 96, &loss) == MOE_ERR_INVALID_ARG,
          "target 96 of a vocabulary of 96 accepted");
    CHECK(moe_tp_cross_entropy_forward(&ce, logits, targets, 1, 72, &loss) == MOE_ERR_INVALID_ARG,
          "V 72 in 16 pieces accepted");
    moe_tp_cross_entropy_free(&ce);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_size(MPI_COMM_WORLD, &W);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (16 % W || (W & (W - 1))) {
        if (rank == 0) fprintf(stderr, "run on 1, 2, 4, 8 or 16 ranks, not %d\n", W);
        MPI_Finalize();
        return 1;
    }
    moe_comm *group;
    test_mpi_require(moe_comm_create_mpi(test_mpi_dup_world(), "tensor-parallel", 120, &group), "group");
    test_mpi_require(moe_runtime_create_cpu(&rt), "runtime");
    check_products(group, MOE_PRECISION_FP32);
    check_products(group, MOE_PRECISION_BF16);
    check_cross_entropy(group);
    check_refusals(group);
    if (rank == 0) printf("tp %d: products and the vocabulary-parallel cross-entropy checked at S = %d, 8, 16\n", W, W);
    moe_runtime_destroy(rt);
    moe_comm_destroy(group);
    return test_mpi_finish("test_tp_pieces_mpi");
}
