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
} test_tp_setup;

void test_tp_check_products(const test_tp_setup *setup, moe_precision precision);

/* count values uniform in scale * [-1, 1), the same on every rank for a seed; mixed: every 7th 100x larger */
moe_real *test_tp_operand(uint64_t seed, size_t count, double scale, int mixed);
/* [rows, cols / parts]: columns [part cols / parts, (part + 1) cols / parts) of a row-major [rows, cols] (malloc'ed) */
moe_real *test_tp_column_block(const moe_real *m, int rows, int cols, int part, int parts);
size_t test_tp_count_diff(const moe_real *a, const moe_real *b, size_t n);
/* max |a - b| / max |b| */
double test_tp_max_rel_err(const moe_real *a, const moe_real *b, size_t n);

#endif
