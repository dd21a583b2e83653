/* tree_reduce.c — the local part of the fixed tree on the host: core/tree_schedule.h's binary counter (tree_reduce.h). */
#include "alltoall/tree_reduce.h"

#include <stdlib.h>
#include <string.h>

#include "alltoall/tree_add.h"
#include "core/fail.h"
#include "core/tree_schedule.h"

static size_t elem_nbytes(moe_tree_dtype dtype) { return dtype == MOE_TREE_F64 ? sizeof(double) : sizeof(float); }

/* Scratch buffer b (>= 1) of core/tree_schedule.h's schedule: [spare | slot 0 | ... | slot levels]. */
static void *buffer(const moe_tree_acc *acc, int b) {
    return (char *)acc->slots + (size_t)(b - 1) * acc->count * elem_nbytes(acc->dtype);
}

moe_status moe_tree_acc_init(moe_tree_acc *acc, moe_tree_dtype dtype, long num_leaves, size_t count) {
    *acc = (moe_tree_acc){.dtype = dtype, .count = count, .num_leaves = num_leaves};
    if (num_leaves < 1 || num_leaves > 1L << 30 || (num_leaves & (num_leaves - 1)))
        return moe_fail(MOE_ERR_INVALID_CONFIG, "a tree sum needs a power of two >= 1 of leaves, not %ld", num_leaves);
    if (dtype != MOE_TREE_F32 && dtype != MOE_TREE_F64) return MOE_ERR_INVALID_ARG;
    while (1L << acc->levels < num_leaves) acc->levels++;
    const size_t nbytes = (size_t)moe_tree_schedule_buffers((int)num_leaves) * count * elem_nbytes(dtype);
    if (!(acc->slots = malloc(nbytes ? nbytes : 1))) return MOE_ERR_OUT_OF_MEMORY; /* count 0: a valid empty sum */
    return MOE_OK;
}

moe_status moe_tree_acc_push(moe_tree_acc *acc, const void *leaf) {
    if (acc->pushed >= acc->num_leaves)
        return moe_fail(MOE_ERR_INVALID_ARG, "leaf %ld pushed into a tree sum of %ld leaves", acc->pushed + 1,
                        acc->num_leaves);
    /* the leaf into its buffer, then the additions it causes (core/tree_schedule.h) */
    moe_tree_step steps[MOE_TREE_MAX_STEPS];
    const int n = moe_tree_schedule_steps((int)acc->num_leaves, (int)acc->pushed, steps);
    if (acc->count) memcpy(buffer(acc, steps[0].dst), leaf, acc->count * elem_nbytes(acc->dtype));
    for (int j = 1; j < n; j++)
        moe_tree_add_cpu(acc->dtype, buffer(acc, steps[j].dst), buffer(acc, steps[j].left), buffer(acc, steps[j].right),
                         acc->count);
    acc->pushed++;
    return MOE_OK;
}

const void *moe_tree_acc_sum(const moe_tree_acc *acc) {
    /* all leaves in: pushed = 2^levels, a single bit, so the root sits in the top slot (the schedule's last step,
     * out = out + root, is the caller's) */
    return acc->pushed == acc->num_leaves ? buffer(acc, MOE_TREE_SLOT(acc->levels)) : NULL;
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
