/* tree_reduce.c — the local part of the fixed tree: a binary counter of subtree sums (tree_reduce.h). */
#include "alltoall/tree_reduce.h"

#include <stdlib.h>
#include <string.h>

#include "alltoall/tree_add.h"
#include "core/fail.h"

static size_t elem_nbytes(moe_tree_dtype dtype) { return dtype == MOE_TREE_F64 ? sizeof(double) : sizeof(float); }

static void *slot(const moe_tree_acc *acc, int level) {
    return (char *)acc->slots + (size_t)level * acc->count * elem_nbytes(acc->dtype);
}

moe_status moe_tree_acc_init(moe_tree_acc *acc, moe_tree_dtype dtype, long num_leaves, size_t count) {
    *acc = (moe_tree_acc){.dtype = dtype, .count = count, .num_leaves = num_leaves};
    if (num_leaves < 1 || (num_leaves & (num_leaves - 1)))
        return moe_fail(MOE_ERR_INVALID_CONFIG, "a tree sum needs a power of two >= 1 of leaves, not %ld", num_leaves);
    if (dtype != MOE_TREE_F32 && dtype != MOE_TREE_F64) return MOE_ERR_INVALID_ARG;
    while (1L << acc->levels < num_leaves) acc->levels++;
    const size_t nbytes = (size_t)(acc->levels + 1) * count * elem_nbytes(dtype);
    if (!(acc->slots = malloc(nbytes ? nbytes : 1))) return MOE_ERR_OUT_OF_MEMORY; /* count 0: a valid empty sum */
    return MOE_OK;
}

moe_status moe_tree_acc_push(moe_tree_acc *acc, const void *leaf) {
    if (acc->pushed >= acc->num_leaves)
        return moe_fail(MOE_ERR_INVALID_ARG, "leaf %ld pushed into a tree sum of %ld leaves", acc->pushed + 1,
                        acc->num_leaves);
    /* a binary increment: while bit l is set, slot l (the older, left subtree) absorbs the carry */
    const void *carry = leaf;
    int level = 0;
    for (; acc->pushed >> level & 1; level++) {
        moe_tree_add_cpu(acc->dtype, slot(acc, level), slot(acc, level), carry, acc->count);
        carry = slot(acc, level);
    }
    if (acc->count) memcpy(slot(acc, level), carry, acc->count * elem_nbytes(acc->dtype));
    acc->pushed++;
    return MOE_OK;
}

const void *moe_tree_acc_sum(const moe_tree_acc *acc) {
    /* all leaves in: pushed = 2^levels, a single bit, so the root sits in the top slot */
    return acc->pushed == acc->num_leaves ? slot(acc, acc->levels) : NULL;
}

void moe_tree_acc_reset(moe_tree_acc *acc) { acc->pushed = 0; }

void moe_tree_acc_free(moe_tree_acc *acc) {
    free(acc->slots);
    acc->slots = NULL;
}

moe_status moe_tree_reduce_local(moe_tree_dtype dtype, const void *const *leaves, long num_leaves, size_t count,
                                 void *out) {
    moe_tree_acc acc;
    moe_status st = moe_tree_acc_init(&acc, dtype, num_leaves, count);
    for (long i = 0; i < num_leaves && st == MOE_OK; i++) st = moe_tree_acc_push(&acc, leaves[i]);
    if (st == MOE_OK && count) memcpy(out, moe_tree_acc_sum(&acc), count * elem_nbytes(dtype));
    moe_tree_acc_free(&acc);
    return st;
}
