/* test_tp_products.h — the six products of tp/linear.h as a test, on any runtime (tests/test_tp_pieces_mpi.c runs it on
 * the CPU, tests/test_gpu_tp_pieces.c on CUDA), and what the tensor-parallel tests share.
 *
 * The world is one tensor-parallel group of tp ranks. Every rank draws the same whole operands (host), keeps its part
 * (a block of columns, or of a weight's rows), uploads it to the runtime and runs the group's product; the oracle is
 * the same call at tp 1 (no group) on the whole operands, run on every rank. For S in {tp, 8, 16} (S >= tp), the row
 * blocking of layout invariance on, split dimension 64, the other 24, T 37, beta 0 and 1 where a product takes it,
 * weight gradients accumulated onto random values:
 * - every rank's part of the result bitwise the oracle's;
 * - S = 1 at tp 1 is the dense table's plain product bit for bit; S = 8 is within `plain_tolerance` of it (relative
 *   to the largest value), and for the two sums (row forward, column backward input) differs somewhere (operands of
 *   mixed magnitudes: the piece order matters, so the bitwise check can fail; each rank's block taken as one piece,
 *   Megatron's plain split, fails it at every tp > 1: tried). For the four concatenated products rank 0 at tp 1
 *   prints how many values 8 pieces change against one call (whether the GEMM library rounds a column by the call's
 *   width). */
#ifndef MOE_TESTS_TEST_TP_PRODUCTS_H
#define MOE_TESTS_TEST_TP_PRODUCTS_H

#include "alltoall/comm.h"
#include "core/precision.h"
#include "moe/runtime.h"
#include "tests/test_util.h"

typedef struct {
    moe_runtime *rt;
    moe_comm *group;        /* the world as one group; NULL at tp 1 */
    int tp, rank;
    double plain_tolerance; /* of S pieces against the plain product */
    double one_piece_loss_tolerance; /* the cross-entropy's loss at S = 1 against the whole-vocabulary kernel's,
                                        relative (0: bitwise; the host's log may round otherwise than the GPU's) */
} test_tp_setup;

void test_tp_check_products(const test_tp_setup *setup, moe_precision precision);

/* The vocabulary-parallel cross-entropy (tp/vocab_cross_entropy.h) on the runtime (T 29, V 1024, logits uniform in
 * [-16, 16): exp(l - M) spans 2^-46 .. 1, so even the double sums round and their order shows) at S = tp, 8, 16: the
 * loss and the softmax denominators (white box: the loss and gradient, rounded further, rarely show their last bits)
 * bitwise tp 1's on every rank, each rank's gradient columns bitwise tp 1's columns; S = 1 the runtime's
 * whole-vocabulary kernel (cross_entropy_forward/backward) bit for bit in the gradient, the loss within
 * one_piece_loss_tolerance; S = 8 within rounding of it (the loss 1e-9, the gradient 1e-5 relative) with denominators
 * that differ somewhere (the plain split fails the check at every tp > 1: tried on the CPU). */
void test_tp_check_cross_entropy(const test_tp_setup *setup);

/* count values uniform in scale * [-1, 1), the same on every rank for a seed; mixed: every 7th 100x larger */
moe_real *test_tp_operand(uint64_t seed, size_t count, double scale, int mixed);
/* [rows, cols / parts]: columns [part cols / parts, (part + 1) cols / parts) of a row-major [rows, cols] (malloc'ed) */
moe_real *test_tp_column_block(const moe_real *m, int rows, int cols, int part, int parts);
size_t test_tp_count_diff(const moe_real *a, const moe_real *b, size_t n);
/* max |a - b| / max |b| */
double test_tp_max_rel_err(const moe_real *a, const moe_real *b, size_t n);

#endif
