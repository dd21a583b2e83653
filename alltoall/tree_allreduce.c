/* tree_allreduce.c — the fixed-tree all-reduce's schedule (tree_allreduce.h). */
#include "alltoall/tree_allreduce.h"

#include "core/fail.h"

enum { MAX_STEPS = 31 }; /* W < 2^31 */

moe_tree_algorithm moe__tree_algorithm_for(const moe_comm *c, size_t count, size_t elem_nbytes) {
    if (c->tree_algorithm != MOE_TREE_AUTO) return c->tree_algorithm;
    return count * elem_nbytes <= MOE__TREE_DOUBLING_MAX_NBYTES ? MOE_TREE_RECURSIVE_DOUBLING
                                                               : MOE_TREE_HALVING_DOUBLING;
}

void moe__comm_set_tree_piece_nbytes(moe_comm *c, size_t nbytes) { c->tree_piece_nbytes = nbytes; }

/* Elements of one piece (at least one). */
static size_t piece_count(const moe_comm *c, size_t elem_nbytes) {
    const size_t nbytes = c->tree_piece_nbytes ? c->tree_piece_nbytes : MOE__TREE_PIECE_NBYTES;
    return nbytes / elem_nbytes ? nbytes / elem_nbytes : 1;
}

size_t moe__tree_scratch_count(const moe_comm *c, moe_tree_algorithm algo, size_t count, size_t elem_nbytes) {
    if (c->size == 1) return 0;
    const size_t piece = piece_count(c, elem_nbytes);
    count = count < piece ? count : piece;
    /* halving: step 0 receives the larger half at most */
    return algo == MOE_TREE_RECURSIVE_DOUBLING ? count : count - count / 2;
}

/* buf[keep] = (mine is the lower block ? buf[keep] + theirs : theirs + buf[keep]) */
static moe_status combine(const moe__tree_ops *ops, void *ctx, int mine_is_lower, char *keep, const char *theirs,
                          size_t count) {
    return mine_is_lower ? ops->add(ctx, keep, keep, theirs, count) : ops->add(ctx, keep, theirs, keep, count);
}

static moe_status recursive_doubling(const moe__tree_ops *ops, void *ctx, int rank, int size, char *buf,
                                     size_t count, size_t elem_nbytes, char *scratch) {
    for (int bit = 1; bit < size; bit <<= 1) {
        MOE_TRY(ops->sendrecv(ctx, buf, count * elem_nbytes, scratch, count * elem_nbytes, rank ^ bit));
        MOE_TRY(combine(ops, ctx, !(rank & bit), buf, scratch, count));
    }
    return MOE_OK;
}

static moe_status halving_doubling(const moe__tree_ops *ops, void *ctx, int rank, int size, char *buf,
                                   size_t count, size_t elem_nbytes, char *scratch) {
    size_t lo[MAX_STEPS + 1], hi[MAX_STEPS + 1]; /* the range held before step j */
    int steps = 0;
    lo[0] = 0, hi[0] = count;
    /* reduce-scatter: after step j this rank holds the node over its aligned block of 2^(j+1) ranks on
     * [lo[j+1], hi[j+1]) */
    for (int bit = 1; bit < size; bit <<= 1, steps++) {
        const size_t mid = lo[steps] + (hi[steps] - lo[steps]) / 2;
        const int lower = !(rank & bit);
        const size_t keep_lo = lower ? lo[steps] : mid, keep_hi = lower ? mid : hi[steps];
        const size_t give_lo = lower ? mid : lo[steps], give_hi = lower ? hi[steps] : mid;
        MOE_TRY(ops->sendrecv(ctx, buf + give_lo * elem_nbytes, (give_hi - give_lo) * elem_nbytes, scratch,
                              (keep_hi - keep_lo) * elem_nbytes, rank ^ bit));
        MOE_TRY(combine(ops, ctx, lower, buf + keep_lo * elem_nbytes, scratch, keep_hi - keep_lo));
        lo[steps + 1] = keep_lo, hi[steps + 1] = keep_hi;
    }
    /* all-gather: step j again, backwards: swap the kept half for the partner's, in place */
    for (int j = steps - 1; j >= 0; j--) {
        const int lower = !(rank & (1 << j)); /* by the bit: with an empty lower half both halves start at lo[j] */
        const size_t mine_lo = lo[j + 1], mine_hi = hi[j + 1];
        const size_t other_lo = lower ? mine_hi : lo[j], other_hi = lower ? hi[j] : mine_lo;
        MOE_TRY(ops->sendrecv(ctx, buf + mine_lo * elem_nbytes, (mine_hi - mine_lo) * elem_nbytes,
                              buf + other_lo * elem_nbytes, (other_hi - other_lo) * elem_nbytes, rank ^ (1 << j)));
    }
    return MOE_OK;
}

moe_status moe__tree_allreduce_run(const moe__tree_ops *ops, void *ctx, const moe_comm *c, moe_tree_algorithm algo,
                                   void *buf, size_t count, size_t elem_nbytes, void *scratch) {
    if (c->size == 1 || count == 0) return MOE_OK;
    const size_t piece = piece_count(c, elem_nbytes);
    for (size_t at = 0; at < count; at += piece) {
        char *p = (char *)buf + at * elem_nbytes;
        const size_t n = count - at < piece ? count - at : piece;
        MOE_TRY(algo == MOE_TREE_RECURSIVE_DOUBLING
                    ? recursive_doubling(ops, ctx, c->rank, c->size, p, n, elem_nbytes, scratch)
                    : halving_doubling(ops, ctx, c->rank, c->size, p, n, elem_nbytes, scratch));
    }
    return MOE_OK;
}
