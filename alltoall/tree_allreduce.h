/* tree_allreduce.h — inside alltoall/ only: the schedule of the fixed-tree all-reduce (comm.h's
 * moe_comm_allreduce_tree_real / _f64) and of its halves (moe_comm_reduce_scatter_tree_real,
 * moe_comm_allgather_tree_real), written once and run by each transport with its own two primitives.
 *
 * W = 2^L ranks; rank r's buffer holds its subtree's sum (tree_reduce.h). At step j = 0 .. L-1 rank r pairs with
 * r XOR 2^j. Before step j, r and its partner share bits 0 .. j-1, so they hold the same element range, and each
 * holds there the sum of its aligned block of 2^j ranks; the block with bit j = 0 is the tree's left child, so
 * "lower + higher" is exactly the tree's node over the aligned block of 2^(j+1) ranks. After step L-1 that block
 * is the whole world: the root. (IEEE addition commutes exactly, so the operand order is for the reader; the
 * grouping is what fixes the bits.)
 *   recursive doubling   each step exchanges the whole buffer and both partners add it: L exchanges of count
 *                        values; both partners compute the same node from the same operands.
 *   halving + doubling   reduce-scatter by recursive halving over comm.h's moe_tree_partition (step j: the range
 *                        [lo, hi) both partners hold splits, the rank with bit j = 0 keeps the lower part, sends the
 *                        other and adds the partner's copy of the part it keeps; odd sizes, uneven splits and empty
 *                        parts fine), then all-gather by recursive doubling (steps L-1 .. 0 swap the kept parts back,
 *                        copies only): each element's node is computed by one rank and copied to the others. 2 L
 *                        exchanges of count / 2, count / 4, ... values: bandwidth-optimal for large buffers. The
 *                        halves run alone too (comm.h's moe_comm_reduce_scatter_tree_real / allgather), on a
 *                        window of the region: the partition is the region's, and each step moves only the parts'
 *                        intersections with the window (the same on both partners, as the window is).
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

/* One run of the fixed tree: what comm.c builds from comm.h's entries and hands to a transport's tree_real. */
typedef enum {
    MOE__TREE_REDUCE_SCATTER = 1,
    MOE__TREE_ALLGATHER = 2,
    MOE__TREE_ALLREDUCE = MOE__TREE_REDUCE_SCATTER | MOE__TREE_ALLGATHER,
} moe__tree_phases;
struct moe__tree_job {
    moe__tree_phases phases;
    moe_tree_algorithm algo;   /* resolved, never AUTO; recursive doubling for a whole all-reduce only */
    moe_tree_partition part;   /* the region and its splits */
    size_t from, n;            /* the window: buf[0 .. n) is the region's [from, from + n) */
};
typedef struct moe__tree_job moe__tree_job;

/* The all-reduce of count values of elem_nbytes on c: the whole region, no bounds, c's algorithm for that size. */
moe__tree_job moe__tree_job_allreduce(const moe_comm *c, size_t count, size_t elem_nbytes);
/* What the job is, for messages: "fixed-tree all-reduce", "fixed-tree reduce-scatter", "fixed-tree all-gather". */
const char *moe__tree_job_name(const moe__tree_job *job);
/* MOE_OK, or MOE_ERR_INVALID_ARG with a message naming the job and c: bounds that do not ascend within
 * [0, count], or a window outside the region. Local: every rank with the same job answers alike. */
moe_status moe__tree_job_check(const moe_comm *c, const moe__tree_job *job);
/* Runs the job on c through its transport (the size check, then c->ops->tree_real, timed): what comm.h's entries
 * and a wrapping transport's forward (mpi-staged) call. */
moe_status moe__comm_tree_real(moe_comm *c, moe_real *buf, const moe__tree_job *job);

/* The algorithm c runs for count elements of elem_nbytes: c's choice (moe_comm_set_tree_algorithm), or for
 * MOE_TREE_AUTO recursive doubling up to MOE__TREE_DOUBLING_MAX_NBYTES, halving + doubling above. */
enum { MOE__TREE_DOUBLING_MAX_NBYTES = 32 << 10 };
moe_tree_algorithm moe__tree_algorithm_for(const moe_comm *c, size_t count, size_t elem_nbytes);

/* The most the schedule moves at once, so that its scratch is bounded whatever the buffer (a GPU's expert gradients
 * of Mixtral 8x7B are 22 GB) and every MPI message stays far below 2 GiB: recursive doubling runs over pieces of
 * MOE__TREE_PIECE_NBYTES one after another; halving + doubling runs its steps over the whole region and moves each
 * step's parts in chunks of half a piece (rounded up to whole values), each received chunk added into the kept part
 * before the next arrives. Half a piece is what halving a piece on its own received at most, so the all-reduce's
 * scratch is what it was when the schedule ran piece by piece. Every element's sum is the same whatever the pieces,
 * its order fixed by the ranks' bits alone. Tests set smaller pieces on c (0: the default). */
enum { MOE__TREE_PIECE_NBYTES = 64 << 20 };
void moe__comm_set_tree_piece_nbytes(moe_comm *c, size_t nbytes);

/* Elements of scratch the job needs on c, elements of elem_nbytes (what a partner sends before it is added): none on
 * one rank, where the tree is the identity, nor for an all-gather alone; min(n, a piece) for recursive doubling;
 * for reduce-scatter, min(half a piece, the largest part this rank keeps within the window at any step), e.g.
 * ceil(min(count, piece) / 2) for an all-reduce's rank with bit 0 set. Depends on the rank; pure. */
size_t moe__tree_scratch_count(const moe_comm *c, const moe__tree_job *job, size_t elem_nbytes);

/* Runs the job on c (size a power of two, checked by comm.c, as the job is) over buf: n elements of elem_nbytes
 * (payload memory); scratch holds moe__tree_scratch_count elements. */
moe_status moe__tree_run(const moe__tree_ops *ops, void *ctx, const moe_comm *c, const moe__tree_job *job, void *buf,
                         size_t elem_nbytes, void *scratch);

#endif
