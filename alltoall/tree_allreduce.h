/* tree_allreduce.h — inside alltoall/ only: the schedule of the fixed-tree all-reduce (comm.h's
 * moe_comm_allreduce_tree_real / _f64), written once and run by each transport with its own two primitives.
 *
 * W = 2^L ranks; rank r's buffer holds its subtree's sum (tree_reduce.h). At step j = 0 .. L-1 rank r pairs with
 * r XOR 2^j. Before step j, r and its partner share bits 0 .. j-1, so they hold the same element range, and each
 * holds there the sum of its aligned block of 2^j ranks; the block with bit j = 0 is the tree's left child, so
 * "lower + higher" is exactly the tree's node over the aligned block of 2^(j+1) ranks. After step L-1 that block
 * is the whole world: the root. (IEEE addition commutes exactly, so the operand order is for the reader; the
 * grouping is what fixes the bits.)
 *   recursive doubling   each step exchanges the whole buffer and both partners add it: L exchanges of count
 *                        values; both partners compute the same node from the same operands.
 *   halving + doubling   reduce-scatter by recursive halving (step j: the range [lo, hi) splits at
 *                        lo + (hi - lo) / 2, the rank with bit j = 0 keeps the lower half, sends the other and
 *                        adds the partner's copy of the half it keeps; odd sizes fine, empty ranges too), then
 *                        all-gather by recursive doubling (steps L-1 .. 0 swap the kept halves back, copies only):
 *                        each element's node is computed by one rank and copied to the others. 2 L exchanges of
 *                        count / 2, count / 4, ... values: bandwidth-optimal for large buffers.
 * Both compute every node from the same operands, so their results are bitwise the same. */
#ifndef MOE_ALLTOALL_TREE_ALLREDUCE_H
#define MOE_ALLTOALL_TREE_ALLREDUCE_H

#include "alltoall/comm_transport.h"

/* What a transport lends the schedule (ctx is its own). Either may only queue its work (the GPU transports
 * do, in order on one stream); the schedule never reads the buffers itself. */
typedef struct {
    /* sends send_nbytes at send to `peer` and receives recv_nbytes from it into recv (either may be 0) */
    moe_status (*sendrecv)(void *ctx, const void *send, size_t send_nbytes, void *recv, size_t recv_nbytes,
                           int peer);
    /* y = lower + higher, count elements (tree_add.h); y is lower or higher */
    moe_status (*add)(void *ctx, void *y, const void *lower, const void *higher, size_t count);
} moe__tree_ops;

/* The algorithm c runs for count elements of elem_nbytes: c's choice (moe_comm_set_tree_algorithm), or for
 * MOE_TREE_AUTO recursive doubling up to MOE__TREE_DOUBLING_MAX_NBYTES, halving + doubling above. */
enum { MOE__TREE_DOUBLING_MAX_NBYTES = 32 << 10 };
moe_tree_algorithm moe__tree_algorithm_for(const moe_comm *c, size_t count, size_t elem_nbytes);

/* The schedule runs over the buffer in pieces of at most MOE__TREE_PIECE_NBYTES, one after another, so its scratch
 * is a piece's, not the buffer's (a GPU's expert gradients of Mixtral 8x7B are 22 GB); every element's sum is the
 * same whatever the pieces, its order fixed by the ranks' bits alone. Tests set smaller pieces on c. */
enum { MOE__TREE_PIECE_NBYTES = 64 << 20 };
void moe__comm_set_tree_piece_nbytes(moe_comm *c, size_t nbytes);

/* Elements of scratch the schedule needs on c for count elements of elem_nbytes (what the partner sends before it
 * is added, for the largest piece): none on one rank, where the all-reduce is the identity. */
size_t moe__tree_scratch_count(const moe_comm *c, moe_tree_algorithm algo, size_t count, size_t elem_nbytes);

/* Runs the schedule on c (size a power of two, checked by comm.c) over buf, count elements of elem_nbytes. */
moe_status moe__tree_allreduce_run(const moe__tree_ops *ops, void *ctx, const moe_comm *c, moe_tree_algorithm algo,
                                   void *buf, size_t count, size_t elem_nbytes, void *scratch);

#endif
