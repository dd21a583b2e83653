/* shard_tree.c — a binary counter of subtree sums on a runtime's memory (shard_tree.h). */
#include "moe/shard_tree.h"

#include "core/fail.h"

static moe_real *slot(const moe_shard_tree *t, int level) { return t->slots + (size_t)level * t->max_count; }

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
    if (count > t->max_count) return MOE_ERR_INVALID_ARG;
    t->count = count, t->pushed = 0;
    return MOE_OK;
}

/* An even push lands in slot 0 (free: bit 0 clear); an odd one in the spare, to be carried. */
static moe_real *leaf_of(const moe_shard_tree *t) { return t->pushed & 1 ? t->spare : slot(t, 0); }

moe_status moe_shard_tree_leaf(moe_shard_tree *t, moe_real **leaf) {
    if (t->pushed >= t->num_leaves) return moe_fail(MOE_ERR_INVALID_ARG, "shard %d of %d", t->pushed + 1, t->num_leaves);
    *leaf = leaf_of(t);
    return moe_runtime_zero(t->rt, *leaf, t->count * sizeof(moe_real));
}

moe_status moe_shard_tree_push(moe_shard_tree *t) {
    /* a binary increment: while bit l is set, slot l (older, left) + the carry; the sum goes to slot l + 1 when
     * that slot is free (bit l + 1 clear: where the carry ends), else back into slot l, to carry on */
    const moe_real *carry = leaf_of(t);
    for (int l = 0; t->pushed >> l & 1; l++) {
        moe_real *y = t->pushed >> (l + 1) & 1 ? slot(t, l) : slot(t, l + 1);
        MOE_TRY(t->add(t->ctx, slot(t, l), carry, t->count, y));
        carry = y;
    }
    t->pushed++;
    return MOE_OK;
}

moe_status moe_shard_tree_add_to(moe_shard_tree *t, moe_real *dst) {
    if (t->pushed != t->num_leaves) return MOE_ERR_INVALID_ARG;
    /* pushed = 2^levels: the root sits in the top slot */
    return t->add(t->ctx, dst, slot(t, t->levels), t->count, dst);
}
