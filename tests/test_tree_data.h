/* test_tree_data.h — the fixed tree's test data and the test's own oracle (what tests/test_tree_allreduce_mpi.c
 * and tests/test_gpu_tree_allreduce.c share).
 *
 * Leaf `leaf`, element i: a value of mixed magnitude, (1 + u) 2^e with u uniform in [0, 1), e in [-24, 24] and
 * a random sign, from a hash of (seed, leaf, i) alone: any rank makes any leaf without communication, and the
 * sums depend on the order of additions (test_tree_check_order_matters proves it for each data set). */
#ifndef MOE_TESTS_TEST_TREE_DATA_H
#define MOE_TESTS_TEST_TREE_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "alltoall/tree_reduce.h"

enum { TEST_TREE_LEAVES = 16 }; /* S: the virtual shards of every test */

size_t test_tree_elem_nbytes(moe_tree_dtype dtype);
/* out[i] = element i of leaf `leaf` (count values of dtype) */
void test_tree_fill_leaf(moe_tree_dtype dtype, uint64_t seed, int leaf, size_t count, void *out);
/* The oracle, independent of the library: per element, a recursive sum over leaves [lo, hi) split at the middle
 * (hi - lo a power of two): the tree of tree_reduce.h, written as its definition. */
void test_tree_oracle(moe_tree_dtype dtype, uint64_t seed, int lo, int hi, size_t count, void *out);
/* A sum in another order, to show that the order matters: the subtrees of `span` leaves each (the oracle's),
 * added left to right, ((t0 + t1) + t2) + ... over leaves [0, S). */
void test_tree_chain_of_subtrees(moe_tree_dtype dtype, uint64_t seed, int span, size_t count, void *out);
/* This rank's share through the library: leaves [first, first + n) pushed one at a time into a moe_tree_acc;
 * aborts the program if the library fails. */
void test_tree_local(moe_tree_dtype dtype, uint64_t seed, int first, int n, size_t count, void *out);
/* How many of count values differ bitwise between a and b; *first_bad = the first such index. */
size_t test_tree_count_diff(moe_tree_dtype dtype, const void *a, const void *b, size_t count, size_t *first_bad);

#endif
