/* tree_schedule.h — the fixed order in which a run of leaves is added, as data: a binary counter of subtree sums
 * for a power of two of leaves (((l0 + l1) + (l2 + l3)) + ..., the older subtree always on the left), leaf order
 * otherwise. Every local tree sum of the project follows it step by step: the experts' per-segment weight
 * gradients on the CPU and on CUDA (experts/expert_ffn.h's segments contract), the shard trees of the dense
 * gradients in runtime memory (moe/shard_tree.h) and the host sums of alltoall/tree_reduce.h, so their orders
 * cannot drift apart, and tests/test_tree_schedule.c checks the order without a GPU. (The cross-rank levels above
 * a rank's subtree are alltoall/tree_allreduce.c's.)
 *
 * Buffers, each one leaf's size: MOE_TREE_OUT is where the sum ends (out = out + root, or out = out + each leaf in
 * leaf order); scratch buffer b >= 1 is at scratch + (b - 1) * count, moe_tree_schedule_buffers(leaves) of them:
 * [spare | slot 0 | ... | slot L], L = log2(leaves) (L + 2 buffers).
 *
 * leaves a power of two: leaf i goes into slot 0 (i even) or the spare (i odd); then, while bit l of i is set,
 * slot (l or l + 1) = slot l + carry: after the last leaf slot L holds the root, and the last step is
 * out = out + slot L. Otherwise (3, 5, 6, ...) in leaf order: each leaf into the spare, then out = out + spare.
 * An empty leaf (an empty segment) is a zero leaf, so the shape never depends on the counts. */
#ifndef MOE_CORE_TREE_SCHEDULE_H
#define MOE_CORE_TREE_SCHEDULE_H

enum { MOE_TREE_OUT = 0, MOE_TREE_SPARE = 1 };
/* slot l of the counter */
#define MOE_TREE_SLOT(l) (2 + (l))
/* the most steps one call of moe_tree_schedule_steps writes: a leaf and a carry per bit of an int */
#define MOE_TREE_MAX_STEPS 33

typedef struct {
    int segment; /* >= 0: buffer dst = that leaf (a segment's product, formed whole; zero when it is empty) */
    int dst;     /* segment < 0: buffer dst = buffer left + buffer right, element by element, one rounding each */
    int left, right;
} moe_tree_step;

/* Scratch buffers the schedule of `segments` leaves uses (segments >= 1): log2 rounded up, plus 2. */
int moe_tree_schedule_buffers(int segments);

/* The steps after which segment sg's product is in (0 <= sg < segments): its leaf, then the additions it causes;
 * sg == segments: what ends the sum (the root into the gradient; none in segment order). Run in order for
 * sg = 0, 1, ..., segments they are the whole sum. Returns how many steps it wrote into steps[], -1 when sg is out
 * of range or segments < 1. */
int moe_tree_schedule_steps(int segments, int sg, moe_tree_step steps[MOE_TREE_MAX_STEPS]);

#endif
