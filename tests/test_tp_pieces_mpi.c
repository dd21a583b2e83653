/* test_tp_pieces_mpi.c — tensor parallelism's products in fixed pieces (tp/linear.h, tp/vocab_cross_entropy.h) give
 * the same bits at every tensor-parallel size.
 *
 * Under mpirun -np W (meson: W = 1, 2, 4, 8) the world is one tensor-parallel group of tp = W ranks:
 * - the six products of a column- and a row-parallel linear, fp32 and bf16 (tests/test_tp_products.h);
 * - the vocabulary-parallel cross-entropy (T 29, V 1024, logits uniform in [-16, 16): exp(l - M) spans 2^-46 .. 1,
 *   so even the double sums round and their order shows) at S = W, 8, 16: the loss and the softmax denominators
 *   (white box: the loss and gradient, rounded further, rarely show their last bits) bitwise tp 1's on every rank,
 *   and each rank's gradient columns bitwise tp 1's columns; S = 1 the whole-vocabulary kernel (kernels/
 *   cross_entropy.h) bit for bit, loss and gradient; S = 8 within rounding of it (the loss 1e-9, the gradient 1e-5
 *   relative) with denominators that differ somewhere (the plain split fails the check at every tp > 1: tried);
 * - refusals, local and before any exchange: S not a power of two, tp not dividing S, K or V not divisible by S, a
 *   target outside the vocabulary. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "alltoall/comm_mpi.h"
#include "kernels/cross_entropy.h"
#include "moe/dense_ops.h"
#include "tests/test_mpi.h"
#include "tests/test_tp_products.h"
#include "tp/linear.h"
#include "tp/vocab_cross_entropy.h"

enum { CE_T = 29, CE_V = 1024, SEED = 28 };

static int W, rank;
static moe_runtime *rt;

static moe_real *column_block(const moe_real *m, int rows, int cols) {
    return test_tp_column_block(m, rows, cols, rank, W);
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
    moe_real *logits = test_tp_operand(SEED + 3, (size_t)CE_T * CE_V, 16, 0);
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
        CHECK(fabs(loss_want - loss_plain) < 1e-9 * fabs(loss_plain) && test_tp_max_rel_err(want, plain, n) < 1e-5,
              "cross-entropy, S %d: loss %.17g vs the kernel's %.17g", S, loss_want, loss_plain);
        if (S == 8)
            CHECK(memcmp(z_want, z_plain, sizeof z_want) != 0, "cross-entropy: 8 pieces give the whole-vocabulary "
                  "sums' bits for every token: the data cannot tell the orders apart");
    }
    free(logits), free(want), free(got), free(plain);
}

/* Refusals: each on every rank alike, before any exchange (a lone failure would leave the others waiting). */
static void check_refusals(moe_comm *group) {
    moe_tp_linear s;
    CHECK(moe_tp_pieces_check(6, 1) == MOE_ERR_INVALID_CONFIG, "6 pieces accepted");
    CHECK(moe_tp_pieces_check(8, 3) == MOE_ERR_INVALID_CONFIG, "tp 3 accepted");
    CHECK(moe_tp_pieces_check(4, 8) == MOE_ERR_INVALID_CONFIG, "tp 8 over 4 pieces accepted");
    if (W > 1) {
        CHECK(moe_tp_linear_init(&s, rt, NULL, group, W / 2) == MOE_ERR_INVALID_CONFIG, "S < tp accepted");
        moe_tp_linear_free(&s);
    }
    const moe_dense_ops *ops = moe_runtime_dense_ops(rt);
    moe_dense_state *dense;
    test_mpi_require(ops->create(rt, 1, MOE_PRECISION_FP32, 128, &dense), "dense state");
    test_mpi_require(moe_tp_linear_init(&s, rt, dense, group, 16), "tp linear");
    moe_real x[4 * 72] = {0}, w[4 * 72] = {0}, y[16] = {0};
    CHECK(moe_tp_row_forward(&s, x, w, 4, 72, 4, y) == MOE_ERR_INVALID_ARG, "K 72 in 16 pieces accepted");
    CHECK(moe_tp_column_backward_input(&s, x, w, 4, 4, 72, 0, y) == MOE_ERR_INVALID_ARG, "N 72 in 16 pieces accepted");
    CHECK(moe_tp_column_forward(&s, x, w, 4, 4, 72, y) == MOE_ERR_INVALID_ARG, "N 72 in 16 pieces accepted");
    CHECK(moe_tp_row_backward_input(&s, x, w, 4, 64, 4, 2, y) == MOE_ERR_INVALID_ARG, "beta 2 accepted");
    moe_tp_linear_free(&s);
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
    const test_tp_setup setup = {.rt = rt, .group = group, .tp = W, .rank = rank, .plain_tolerance = 1e-5};
    test_tp_check_products(&setup, MOE_PRECISION_FP32);
    test_tp_check_products(&setup, MOE_PRECISION_BF16);
    check_cross_entropy(group);
    check_refusals(group);
    if (rank == 0) printf("tp %d: products and the vocabulary-parallel cross-entropy checked at S = %d, 8, 16\n", W, W);
    moe_runtime_destroy(rt);
    moe_comm_destroy(group);
    return test_mpi_finish("test_tp_pieces_mpi");
}
