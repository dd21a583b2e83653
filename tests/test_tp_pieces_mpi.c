/* test_tp_pieces_mpi.c — tensor parallelism's products in fixed pieces (tp/linear.h, tp/vocab_cross_entropy.h) give
 * the same bits at every tensor-parallel size.
 *
 * Under mpirun -np W (meson: W = 1, 2, 4, 8) the world is one tensor-parallel group of tp = W ranks:
 * - the six products of a column- and a row-parallel linear, fp32 and bf16 (tests/test_tp_products.h);
 * - the vocabulary-parallel cross-entropy (tests/test_tp_products.h), S = 1 the whole-vocabulary kernel
 *   (kernels/cross_entropy.h) bit for bit, loss and gradient;
 * - refusals, local and before any exchange: S not a power of two, tp not dividing S, K or V not divisible by S, a
 *   target outside the vocabulary;
 * - sequence parallelism's rows against columns (tp/sequence.h): the slice's rows of every block of columns, each
 *   block held by 1, 2, .. W ranks, and back, exactly (values naming their row and column; a block's other holders
 *   send values that would show). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "alltoall/comm_mpi.h"
#include "moe/dense_ops.h"
#include "tests/test_mpi.h"
#include "tests/test_tp_products.h"
#include "tp/linear.h"
#include "tp/sequence.h"
#include "tp/vocab_cross_entropy.h"

static int W, rank;
static moe_runtime *rt;

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
    test_mpi_require(ops->create(rt, 1, MOE_PRECISION_FP32, 128, &dense), "dense state");
    test_mpi_require(moe_tp_cross_entropy_init(&ce, rt, dense, group, 16), "cross-entropy");
    moe_real logits[2 * 96] = {0};
    int targets[2] = {0, 96};
    double loss;
    CHECK(moe_tp_cross_entropy_forward(&ce, logits, targets, 2, 96, &loss) == MOE_ERR_INVALID_ARG,
          "target 96 of a vocabulary of 96 accepted");
    CHECK(moe_tp_cross_entropy_forward(&ce, logits, targets, 1, 72, &loss) == MOE_ERR_INVALID_ARG,
          "V 72 in 16 pieces accepted");
    moe_tp_cross_entropy_free(&ce);
    ops->destroy(dense);
}

/* moe_tp_slice_all_columns and moe_tp_own_columns over the world as one tensor group, at every sharing that divides
 * it: rank r holds the group's T rows of block r / sharing, value row * 1000 + column (its first holder; the others
 * hold -1 - that, which must never land), width 3. */
static void check_row_moves(moe_comm *group) {
    enum { WIDTH = 3 };
    const int T = 4 * W, Ts = T / W;
    const moe_tp_sequence seq = {.group = group, .rt = rt, .tp = W, .tp_rank = rank};
    moe_real *local = malloc((size_t)T * WIDTH * sizeof *local), *back = malloc((size_t)T * WIDTH * sizeof *back),
             *scratch = malloc((size_t)T * WIDTH * sizeof *scratch), *all = malloc((size_t)T * WIDTH * sizeof *all);
    test_mpi_require(local && back && scratch && all ? MOE_OK : MOE_ERR_OUT_OF_MEMORY, "row buffers");
    for (int sharing = 1; sharing <= W; sharing *= 2) {
        const int block = rank / sharing, N = W / sharing * WIDTH;
        for (int t = 0; t < T; t++)
            for (int j = 0; j < WIDTH; j++) {
                const moe_real v = (moe_real)(t * 1000 + block * WIDTH + j);
                local[t * WIDTH + j] = rank % sharing ? -1 - v : v;
            }
        test_mpi_require(moe_tp_slice_all_columns(&seq, local, T, WIDTH, sharing, scratch, all), "slice_all_columns");
        long wrong = 0;
        for (int i = 0; i < Ts; i++)
            for (int c = 0; c < N; c++) wrong += all[i * N + c] != (moe_real)((rank * Ts + i) * 1000 + c);
        CHECK(wrong == 0, "sharing %d: %ld values of the slice's rows of every column are wrong", sharing, wrong);
        test_mpi_require(moe_tp_own_columns(&seq, all, T, WIDTH, sharing, scratch, back), "own_columns");
        wrong = 0;
        for (int t = 0; t < T; t++)
            for (int j = 0; j < WIDTH; j++) wrong += back[t * WIDTH + j] != (moe_real)(t * 1000 + block * WIDTH + j);
        CHECK(wrong == 0, "sharing %d: %ld values of the rank's block came back wrong", sharing, wrong);
    }
    free(local), free(back), free(scratch), free(all);
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
    const test_tp_setup setup = {.rt = rt, .group = group, .tp = W, .rank = rank, .plain_tolerance = 1e-5,
                                 .one_piece_loss_tolerance = 0};
    test_tp_check_products(&setup, MOE_PRECISION_FP32);
    test_tp_check_products(&setup, MOE_PRECISION_BF16);
    test_tp_check_cross_entropy(&setup);
    check_refusals(group);
    check_row_moves(group);
    if (rank == 0) printf("tp %d: products and the vocabulary-parallel cross-entropy checked at S = %d, 8, 16\n", W, W);
    moe_runtime_destroy(rt);
    moe_comm_destroy(group);
    return test_mpi_finish("test_tp_pieces_mpi");
}
