/* test_tree_allreduce_mpi.c — the fixed binary tree (alltoall/tree_reduce.h): the local sum and the cross-rank
 * all-reduce (moe_comm_allreduce_tree_real / _f64 on the MPI transport), checked bitwise against the test's own
 * one-process tree.
 *
 * Under mpirun -np W (meson: W = 1, 2, 4, 8): S = 16 leaves of mixed magnitudes (tests/test_tree_data.h); rank r
 * sums leaves [r S/W, (r+1) S/W) with the library's streaming accumulator, then all-reduces. For float (moe_real)
 * and double, counts 0, 1, 3, 7, 1000, 1001, 99999 and 2^20 (odd ones and ones below W included), and each
 * algorithm (auto, recursive doubling, halving + doubling), every rank's result must equal the oracle's tree over
 * all S leaves bit for bit, and one all-reduce must count as one completed exchange. That the check can fail: for
 * every data set the left-to-right sum of the leaves, and for W >= 4 the left-to-right sum of the ranks' subtrees
 * (what a rank-order chain would give), must differ from the tree somewhere. Also: the local accumulator's
 * refusals (6 leaves, a leaf too many) and array form, and, for W >= 4, a 3-rank communicator refused with
 * MOE_ERR_INVALID_CONFIG on each of its ranks before any communication; and the scratch the transports allocate
 * for the all-reduce: none on one rank. */
#include <stdlib.h>
#include <string.h>

#include "alltoall/comm_mpi.h"
#include "alltoall/comm_transport.h" /* white box: the count of completed exchanges */
#include "alltoall/tree_allreduce.h"  /* white box: the scratch the transports allocate */
#include "core/fail.h"
#include "tests/test_mpi.h"
#include "tests/test_tree_data.h"

static const size_t kCounts[] = {0, 1, 3, 7, 1000, 1001, 99999, 1u << 20};
static const moe_tree_algorithm kAlgos[] = {MOE_TREE_AUTO, MOE_TREE_RECURSIVE_DOUBLING, MOE_TREE_HALVING_DOUBLING};
static const char *const kAlgoNames[] = {"auto", "doubling", "halving+doubling"};
enum { SEED = 15 };

static void *alloc_values(moe_tree_dtype dtype, size_t count) {
    void *p = malloc(count ? count * test_tree_elem_nbytes(dtype) : 1);
    if (!p) test_mpi_require(MOE_ERR_OUT_OF_MEMORY, "test buffer");
    return p;
}

static const char *dtype_name(moe_tree_dtype dtype) { return dtype == MOE_TREE_F64 ? "double" : "float"; }

/* The data must be order-sensitive, or a bitwise check proves nothing. */
static void check_order_matters(moe_tree_dtype dtype, size_t count, const void *want, int W) {
    void *other = alloc_values(dtype, count);
    size_t first;
    test_tree_chain_of_subtrees(dtype, SEED, 1, count, other);
    CHECK(test_tree_count_diff(dtype, other, want, count, &first) > 0,
          "%s, %zu values: the left-to-right sum of the leaves equals the tree everywhere: the data cannot tell "
          "orders apart", dtype_name(dtype), count);
    if (W >= 4) {
        test_tree_chain_of_subtrees(dtype, SEED, TEST_TREE_LEAVES / W, count, other);
        CHECK(test_tree_count_diff(dtype, other, want, count, &first) > 0,
              "%s, %zu values: the rank-order chain of %d subtrees equals the tree everywhere", dtype_name(dtype),
              count, W);
    }
    free(other);
}

static void check_count(moe_comm *c, moe_tree_dtype dtype, size_t count) {
    const int W = moe_comm_size(c), r = moe_comm_rank(c), span = TEST_TREE_LEAVES / W;
    void *want = alloc_values(dtype, count), *mine = alloc_values(dtype, count), *buf = alloc_values(dtype, count);
    const size_t nbytes = count * test_tree_elem_nbytes(dtype);
    test_tree_oracle(dtype, SEED, 0, TEST_TREE_LEAVES, count, want);
    test_tree_local(dtype, SEED, r * span, span, count, mine);
    /* the local part alone: this rank's subtree is the oracle's node over the same leaves */
    void *node = alloc_values(dtype, count);
    size_t first = 0, bad;
    test_tree_oracle(dtype, SEED, r * span, (r + 1) * span, count, node);
    bad = test_tree_count_diff(dtype, mine, node, count, &first);
    CHECK(bad == 0, "rank %d %s count %zu: local tree over %d leaves: %zu values differ from the oracle, first at %zu",
          r, dtype_name(dtype), count, span, bad, first);
    if (count >= 1000) check_order_matters(dtype, count, want, W);

    /* whole, and in 3 or 4 pieces of count / 3 + 1 values (the last one shorter, odd sizes): the same bits */
    for (size_t a = 0; a < 2 * sizeof kAlgos / sizeof kAlgos[0]; a++) {
        const size_t algo = a % (sizeof kAlgos / sizeof kAlgos[0]);
        const size_t piece = a < sizeof kAlgos / sizeof kAlgos[0] ? 0 : count / 3 + 1;
        moe_comm_set_tree_algorithm(c, kAlgos[algo]);
        moe__comm_set_tree_piece_nbytes(c, piece * test_tree_elem_nbytes(dtype));
        if (nbytes) memcpy(buf, mine, nbytes);
        const long before = c->completed;
        moe_status st = dtype == MOE_TREE_F64 ? moe_comm_allreduce_tree_f64(c, buf, count)
                                              : moe_comm_allreduce_tree_real(c, buf, count);
        test_mpi_require(st, "tree all-reduce");
        CHECK(c->completed == before + 1, "%s: completed went from %ld to %ld over one all-reduce", kAlgoNames[algo],
              before, c->completed);
        bad = test_tree_count_diff(dtype, buf, want, count, &first);
        CHECK(bad == 0, "rank %d of %d, %s, pieces of %zu, %s, %zu values: %zu differ from the one-process tree, first "
              "at %zu", r, W, kAlgoNames[algo], piece, dtype_name(dtype), count, bad, first);
    }
    moe_comm_set_tree_algorithm(c, MOE_TREE_AUTO);
    moe__comm_set_tree_piece_nbytes(c, 0);
    free(want), free(mine), free(buf), free(node);
}

static void check_local_api(void) {
    moe_tree_acc acc;
    CHECK(moe_tree_acc_init(&acc, MOE_TREE_F32, 6, 4) == MOE_ERR_INVALID_CONFIG, "6 leaves accepted");
    CHECK(strstr(moe_failure_message(MOE_ERR_INVALID_CONFIG), "power of two"), "message: %s",
          moe_failure_message(MOE_ERR_INVALID_CONFIG));
    moe_tree_acc_free(&acc);
    float leaves[4][3], out[3], want[3];
    const void *ptrs[4];
    for (int l = 0; l < 4; l++) {
        test_tree_fill_leaf(MOE_TREE_F32, SEED, l, 3, leaves[l]);
        ptrs[l] = leaves[l];
    }
    CHECK_OK(moe_tree_acc_init(&acc, MOE_TREE_F32, 4, 3));
    for (int l = 0; l < 4; l++) {
        CHECK(moe_tree_acc_sum(&acc) == NULL, "a sum after %d of 4 leaves", l);
        CHECK_OK(moe_tree_acc_push(&acc, leaves[l]));
    }
    CHECK(moe_tree_acc_push(&acc, leaves[0]) == MOE_ERR_INVALID_ARG, "a fifth leaf accepted");
    test_tree_oracle(MOE_TREE_F32, SEED, 0, 4, 3, want);
    CHECK(moe_tree_acc_sum(&acc) && !memcmp(moe_tree_acc_sum(&acc), want, sizeof want), "accumulator of 4 leaves");
    moe_tree_acc_reset(&acc);
    CHECK(moe_tree_acc_sum(&acc) == NULL, "a sum right after reset");
    moe_tree_acc_free(&acc);
    CHECK_OK(moe_tree_reduce_local(MOE_TREE_F32, ptrs, 4, 3, out));
    CHECK(!memcmp(out, want, sizeof want), "moe_tree_reduce_local of 4 leaves");
    CHECK(moe_tree_reduce_local(MOE_TREE_F32, ptrs, 3, 3, out) == MOE_ERR_INVALID_CONFIG, "3 leaves accepted");
}

/* Ranks 0..2 of a world of 4 or more: a communicator of 3, which the tree cannot serve. */
static void check_not_power_of_two(int rank) {
    MPI_Comm three;
    if (MPI_Comm_split(MPI_COMM_WORLD, rank < 3 ? 0 : MPI_UNDEFINED, rank, &three) != MPI_SUCCESS)
        test_mpi_require(MOE_ERR_COMM, "MPI_Comm_split");
    if (three == MPI_COMM_NULL) return;
    moe_comm *c;
    test_mpi_require(moe_comm_create_mpi(three, "three", 10, &c), "3-rank comm");
    float x = 1;
    double y = 1;
    CHECK(moe_comm_allreduce_tree_real(c, &x, 1) == MOE_ERR_INVALID_CONFIG, "rank %d: 3 ranks accepted (float)", rank);
    const char *msg = moe_failure_message(MOE_ERR_INVALID_CONFIG);
    CHECK(strstr(msg, "power-of-two") && strstr(msg, "has 3"), "rank %d: message: %s", rank, msg);
    CHECK(moe_comm_allreduce_tree_f64(c, &y, 1) == MOE_ERR_INVALID_CONFIG, "rank %d: 3 ranks accepted (double)", rank);
    CHECK(c->completed == 0, "rank %d: a refused all-reduce counted as an exchange", rank);
    moe_comm_destroy(c);
}

/* The scratch every transport sizes from moe__tree_scratch_count (the NCCL transport's is device memory): none
 * on one rank, where the all-reduce copies nothing; the partner's whole piece (doubling) or its larger half
 * (halving) otherwise: the buffer's, or past MOE__TREE_PIECE_NBYTES a piece's. */
static void check_scratch_count(const moe_comm *c, int W) {
    const size_t piece = MOE__TREE_PIECE_NBYTES / sizeof(float);
    const size_t sizes[] = {1001, 3 * piece + 5}, want_piece[] = {1001, piece};
    for (int i = 0; i < 2; i++) {
        const size_t n = sizes[i], p = want_piece[i];
        const size_t doubling = moe__tree_scratch_count(c, MOE_TREE_RECURSIVE_DOUBLING, n, sizeof(float));
        const size_t halving = moe__tree_scratch_count(c, MOE_TREE_HALVING_DOUBLING, n, sizeof(float));
        if (W == 1) CHECK(doubling == 0 && halving == 0, "W=1: tree scratch %zu / %zu values, want none", doubling,
                          halving);
        else CHECK(doubling == p && halving == p - p / 2, "W=%d, %zu values: tree scratch %zu / %zu values, want %zu / "
                   "%zu", W, n, doubling, halving, p, p - p / 2);
    }
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int W, rank;
    MPI_Comm_size(MPI_COMM_WORLD, &W);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (TEST_TREE_LEAVES % W || (W & (W - 1))) {
        if (rank == 0) fprintf(stderr, "run on a power of two of ranks up to %d, not %d\n", TEST_TREE_LEAVES, W);
        MPI_Finalize();
        return 1;
    }
    check_local_api();
    moe_comm *c;
    test_mpi_require(moe_comm_create_mpi(test_mpi_dup_world(), "world", 120, &c), "world comm");
    for (int d = 0; d < 2; d++)
        for (size_t k = 0; k < sizeof kCounts / sizeof kCounts[0]; k++) {
            check_count(c, d ? MOE_TREE_F64 : MOE_TREE_REAL, kCounts[k]);
            if (rank == 0 && kCounts[k] >= 1000)
                printf("W=%d %s count %zu: local trees and the all-reduce (3 algorithms) checked\n", W,
                       d ? "double" : "float", kCounts[k]);
        }
    check_scratch_count(c, W);
    moe_comm_destroy(c);
    if (W >= 4) check_not_power_of_two(rank);
    return test_mpi_finish("test_tree_allreduce_mpi");
}
