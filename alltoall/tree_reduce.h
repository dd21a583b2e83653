/* tree_reduce.h — sums in one fixed binary tree (issue 15's building block; docs/DETERMINISM.md).
 *
 * The tree: S leaves (S a power of two), each a buffer of `count` values. Level 0 adds leaf 2m and leaf 2m + 1
 * (left + right), level 1 adds those sums pairwise in the same way, and so on up to the root:
 *     S = 8:  ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7))      for every element on its own
 * Every node is one rounded addition of its two children, so the root's bits depend only on the leaves, never
 * on who computed which node. A world of W ranks (a power of two dividing S) where rank r holds leaves
 * [r S / W, (r + 1) S / W) forms its subtree's root here (moe_tree_acc) and the upper levels across ranks with
 * moe_comm_allreduce_tree_real / _f64 (comm.h): the result is bitwise the one-rank root, for any such W.
 *
 * The local sum is a stream: leaves are pushed one at a time in leaf order, and a binary counter of partial
 * sums keeps only log2(S) + 2 buffers of `count` values, whatever the leaves are (a trainer need not hold all
 * of its micro-batches' gradients at once): core/tree_schedule.h's schedule, the one every local tree sum of
 * the project follows. Host memory, one thread, no host syncs. */
#ifndef MOE_ALLTOALL_TREE_REDUCE_H
#define MOE_ALLTOALL_TREE_REDUCE_H

#include <stddef.h>

#include "core/types.h"

typedef enum { MOE_TREE_F32, MOE_TREE_F64 } moe_tree_dtype;
/* the tree dtype of moe_real (float, or double in the float64 build) */
#define MOE_TREE_REAL (sizeof(moe_real) == sizeof(double) ? MOE_TREE_F64 : MOE_TREE_F32)

typedef struct {
    moe_tree_dtype dtype;
    size_t count;       /* values per leaf */
    long num_leaves;    /* S: a power of two >= 1 */
    long pushed;        /* leaves pushed so far */
    int levels;         /* log2(S) */
    void *slots;        /* [levels + 2][count] values: core/tree_schedule.h's scratch buffers (spare, slots 0..levels) */
} moe_tree_acc;

/* Prepares a sum of num_leaves leaves of count values. MOE_ERR_INVALID_CONFIG when num_leaves is not a power
 * of two in [1, 2^30] (the message says which); MOE_ERR_OUT_OF_MEMORY. */
moe_status moe_tree_acc_init(moe_tree_acc *acc, moe_tree_dtype dtype, long num_leaves, size_t count);
/* Adds the next leaf (count values of the dtype). MOE_ERR_INVALID_ARG after num_leaves leaves. */
moe_status moe_tree_acc_push(moe_tree_acc *acc, const void *leaf);
/* The root once all num_leaves leaves are in (count values, owned by acc until the next init or free); NULL
 * before. */
const void *moe_tree_acc_sum(const moe_tree_acc *acc);
/* Forgets the leaves pushed (the next push starts a new sum of the same shape). */
void moe_tree_acc_reset(moe_tree_acc *acc);
void moe_tree_acc_free(moe_tree_acc *acc);

/* out = the tree sum of leaves[0..num_leaves) (an accumulator fed in leaf order; out may be a leaf). Same
 * errors as moe_tree_acc_init. */
moe_status moe_tree_reduce_local(moe_tree_dtype dtype, const void *const *leaves, long num_leaves, size_t count,
                                 void *out);

#endif
