/* shard_tree.h — the local part of the fixed tree over the batch's virtual shards (docs/DETERMINISM.md), on a
 * runtime's memory (host on the CPU, device on CUDA): core/tree_schedule.h's binary counter of subtree sums (the
 * order every local tree sum follows), with the additions done by the caller's `add` (a runtime op: the dense table's add, the layer table's add), so
 * the same orchestration runs on every runtime.
 *
 * A sum over this rank's L local shards (L a power of two) of one quantity of `count` reals: for each local shard
 * in shard order, the caller fills moe_shard_tree_leaf() (zeroed by it) and pushes it; moe_shard_tree_add_to(dst)
 * then adds the root into dst (dst = dst + root: a replica's gradient buffer, zeroed at the start of a micro-batch).
 * A carry writes straight into the next free slot, so no push copies. Buffers: (log2 L + 2) * max_count reals.
 * Host syncs: none (the add and zero ops are queued). */
#ifndef MOE_MOE_SHARD_TREE_H
#define MOE_MOE_SHARD_TREE_H

#include <stddef.h>

#include "moe/runtime.h"

/* y = a + b over n reals of the runtime's memory, one rounded addition each (y may be a or b). */
typedef moe_status (*moe_shard_add_fn)(void *ctx, const moe_real *a, const moe_real *b, size_t n, moe_real *y);

typedef struct {
    moe_runtime *rt;
    moe_shard_add_fn add;
    void *ctx;
    int num_leaves, levels; /* L = 2^levels local shards */
    size_t max_count, count;
    int pushed;
    moe_real *slots;        /* [levels + 1][max_count]: the schedule's slots 0..levels */
    moe_real *spare;        /* [max_count]: the schedule's spare (an odd leaf until its carry) */
} moe_shard_tree;

/* The local shards of S virtual shards on world_size ranks (rank r holds [r S/W, (r+1) S/W)) into *local: S / W,
 * which needs W a power of two dividing S (MOE_ERR_INVALID_CONFIG, the reason recorded, otherwise). */
moe_status moe_shard_tree_local_shards(int num_shards, int world_size, int *local);

/* num_leaves: a power of two >= 1 (MOE_ERR_INVALID_CONFIG otherwise); max_count: the largest quantity summed. */
moe_status moe_shard_tree_init(moe_shard_tree *t, moe_runtime *rt, moe_shard_add_fn add, void *ctx, int num_leaves,
                               size_t max_count);
void moe_shard_tree_free(moe_shard_tree *t);
/* Starts a sum of count (<= max_count) reals per leaf. */
moe_status moe_shard_tree_begin(moe_shard_tree *t, size_t count);
/* The next leaf's buffer, zeroed: fill it (accumulating ops welcome), then push. */
moe_status moe_shard_tree_leaf(moe_shard_tree *t, moe_real **leaf);
/* The same, not zeroed: for a product that overwrites it. */
moe_status moe_shard_tree_leaf_raw(moe_shard_tree *t, moe_real **leaf);
moe_status moe_shard_tree_push(moe_shard_tree *t);
/* After all leaves: dst = dst + root. */
moe_status moe_shard_tree_add_to(moe_shard_tree *t, moe_real *dst);
/* After all leaves: dst = root (a copy: the bits of add_to onto zeros, without reading dst). */
moe_status moe_shard_tree_copy_to(moe_shard_tree *t, moe_real *dst);

#endif
