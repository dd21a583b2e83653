/* shard_tree.c — a binary counter of subtree sums on a runtime's memory (shard_tree.h). */
#include "moe/shard_tree.h"

#include "core/fail.h"
#include "core/tree_schedule.h"

static moe_real *slot(const moe_shard_tree *t, int level) { return t->slots + (size_t)level * t->max_count; }

moe_status moe_shard_tree_local_shards(int num_shards, int world_size, int *local) {
    const int S = num_shards, W = world_size;
    if (W < 1 || (W & (W - 1)) || S % W)
        return moe_fail(MOE_ERR_INVALID_CONFIG, "%d virtual shards of the batch need a power-of-two world size that "
                        "divides them, not %d ranks", S, W);
    *local = S / W;
    return MOE_OK;
}

moe_status moe_shard_tree_init(moe_shard_tree *t, moe_runtime *rt, moe_shard_add_fn add, void *ctx, int num_leaves,
                               size_t max_count) {
    *t = (moe_shard_tree){.rt = rt, .add = add, .ctx = ctx, .num_leaves = num_leaves, .max_count = max_count};
    if (num_leaves < 1 || (num_leaves & (num_leaves - 1)))
        return moe_fail(MOE_ERR_INVALID_CONFIG, "a shard tree needs a power of two >= 1 of local shards, not %d",
                        num_leaves);
    while (1 << t->levels < num_leaves) t->levels++;
    const size_t n = (max_count ? max_count : 1) * sizeof(moe_real);
    MOE_TRY(moe_runtime_alloc(rt, (size_t)(t->levels + 1) * n, (void **)&t->slots));
    return moe_runtime_alloc(rt, n, (void **)&t->spare);
}

void moe_shard_tree_free(moe_shard_tree *t) {
    if (t->rt) moe_runtime_free(t->rt, t->slots), moe_runtime_free(t->rt, t->spare);
    t->slots = t->spare = NULL;
}

moe_status moe_shard_tree_begin(moe_shard_tree *t, size_t count) {
    if (count > t->max_count)
        return moe_fail(MOE_ERR_INVALID_ARG, "shard tree: a sum of %zu values past the %zu it was made for", count,
                        t->max_count);
    t->count = count, t->pushed = 0;
    return MOE_OK;
}

/* Buffer b of core/tree_schedule.h's schedule; MOE_TREE_OUT is out. */
static moe_real *buffer(const moe_shard_tree *t, int b, moe_real *out) {
    return b == MOE_TREE_OUT ? out : b == MOE_TREE_SPARE ? t->spare : slot(t, b - MOE_TREE_SLOT(0));
}

/* The schedule's additions for leaf i (i = num_leaves: the root into out). */
static moe_status run_additions(moe_shard_tree *t, int i, moe_real *out) {
    moe_tree_step steps[MOE_TREE_MAX_STEPS];
    const int n = moe_tree_schedule_steps(t->num_leaves, i, steps);
    for (int j = 0; j < n; j++)
        if (steps[j].segment < 0)
            MOE_TRY(t->add(t->ctx, buffer(t, steps[j].left, out), buffer(t, steps[j].right, out), t->count,
                           buffer(t, steps[j].dst, out)));
    return MOE_OK;
}

moe_status moe_shard_tree_leaf_raw(moe_shard_tree *t, moe_real **leaf) {
    if (t->pushed >= t->num_leaves) return moe_fail(MOE_ERR_INVALID_ARG, "shard %d of %d", t->pushed + 1, t->num_leaves);
    moe_tree_step steps[MOE_TREE_MAX_STEPS];
    moe_tree_schedule_steps(t->num_leaves, t->pushed, steps); /* steps[0]: where the leaf goes */
    *leaf = buffer(t, steps[0].dst, NULL);
    return MOE_OK;
}

moe_status moe_shard_tree_leaf(moe_shard_tree *t, moe_real **leaf) {
    MOE_TRY(moe_shard_tree_leaf_raw(t, leaf));
    return moe_runtime_zero(t->rt, *leaf, t->count * sizeof(moe_real));
}

moe_status moe_shard_tree_push(moe_shard_tree *t) {
    MOE_TRY(run_additions(t, t->pushed, NULL));
    t->pushed++;
    return MOE_OK;
}

moe_status moe_shard_tree_copy_to(moe_shard_tree *t, moe_real *dst) {
    if (t->pushed != t->num_leaves) return MOE_ERR_INVALID_ARG;
    /* a power of two of leaves ends with the root in the last slot (core/tree_schedule.h) */
    return moe_runtime_copy(t->rt, dst, slot(t, t->levels), t->count * sizeof(moe_real));
}

moe_status moe_shard_tree_add_to(moe_shard_tree *t, moe_real *dst) {
    if (t->pushed != t->num_leaves) return MOE_ERR_INVALID_ARG;
    return run_additions(t, t->num_leaves, dst); /* dst = dst + the root */
}
