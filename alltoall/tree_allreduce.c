/* tree_allreduce.c — the fixed tree's schedule: the all-reduce and its halves (tree_allreduce.h), and the partition
 * of comm.h's moe_tree_partition. */
#include "alltoall/tree_allreduce.h"

#include "core/fail.h"

enum { MAX_STEPS = 31 }; /* W < 2^31 */

static size_t min_size(size_t a, size_t b) { return a < b ? a : b; }

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

/* Elements of one chunk of halving + doubling: half a piece, rounded up. */
static size_t chunk_count(const moe_comm *c, size_t elem_nbytes) {
    const size_t piece = piece_count(c, elem_nbytes);
    return piece - piece / 2;
}

/* ---- the partition ---- */

/* The split of [lo, hi): the entry nearest the midpoint (comm.h). The guards keep the answer in [lo, hi] even for
 * bounds that do not ascend (moe_tree_partition_range is pure and checks nothing). */
static size_t split(const moe_tree_partition *p, size_t lo, size_t hi) {
    const size_t mid = lo + (hi - lo) / 2;
    if (!p->bounds) return mid;
    size_t a = 0, b = p->num_bounds; /* a: the first entry >= mid */
    while (a < b) {
        const size_t m = a + (b - a) / 2;
        if (p->bounds[m] < mid) a = m + 1;
        else b = m;
    }
    const size_t above = a < p->num_bounds && p->bounds[a] >= mid && p->bounds[a] < hi ? p->bounds[a] : hi;
    const size_t below = a > 0 && p->bounds[a - 1] > lo && p->bounds[a - 1] <= mid ? p->bounds[a - 1] : lo;
    return mid - below <= above - mid ? below : above;
}

/* lo[j], hi[j]: the range `rank` holds before step j, for j = 0 .. steps (after the last step: its own); returns
 * the number of steps, log2(size). */
static int ranges(const moe_tree_partition *p, int size, int rank, size_t lo[MAX_STEPS + 1],
                  size_t hi[MAX_STEPS + 1]) {
    int steps = 0;
    lo[0] = 0, hi[0] = p->count;
    for (int bit = 1; bit < size && steps < MAX_STEPS; bit <<= 1, steps++) {
        const size_t mid = split(p, lo[steps], hi[steps]);
        const int lower = !(rank & bit);
        lo[steps + 1] = lower ? lo[steps] : mid;
        hi[steps + 1] = lower ? mid : hi[steps];
    }
    return steps;
}

void moe_tree_partition_range(const moe_tree_partition *p, int size, int rank, size_t *lo, size_t *hi) {
    size_t los[MAX_STEPS + 1], his[MAX_STEPS + 1];
    const int steps = ranges(p, size, rank, los, his);
    *lo = los[steps], *hi = his[steps];
}

/* ---- jobs ---- */

moe__tree_job moe__tree_job_allreduce(const moe_comm *c, size_t count, size_t elem_nbytes) {
    return (moe__tree_job){.phases = MOE__TREE_ALLREDUCE, .algo = moe__tree_algorithm_for(c, count, elem_nbytes),
                           .part = {.count = count}, .from = 0, .n = count};
}

const char *moe__tree_job_name(const moe__tree_job *job) {
    return job->phases == MOE__TREE_REDUCE_SCATTER ? "fixed-tree reduce-scatter"
           : job->phases == MOE__TREE_ALLGATHER    ? "fixed-tree all-gather"
                                                   : "fixed-tree all-reduce";
}

moe_status moe__tree_job_check(const moe_comm *c, const moe__tree_job *job) {
    const moe_tree_partition *p = &job->part;
    for (size_t i = 0; p->bounds && i < p->num_bounds; i++) {
        if (p->bounds[i] > p->count)
            return moe_fail(MOE_ERR_INVALID_ARG,
                            "world rank %d: %s on communicator '%s': bounds[%zu] = %zu is past the region of %zu: the "
                            "bounds must ascend within [0, %zu]", c->world_rank, moe__tree_job_name(job), c->label, i,
                            p->bounds[i], p->count, p->count);
        if (i && p->bounds[i] < p->bounds[i - 1])
            return moe_fail(MOE_ERR_INVALID_ARG,
                            "world rank %d: %s on communicator '%s': bounds[%zu] = %zu is below bounds[%zu] = %zu: the "
                            "bounds must ascend within [0, %zu]", c->world_rank, moe__tree_job_name(job), c->label, i,
                            p->bounds[i], i - 1, p->bounds[i - 1], p->count);
    }
    if (job->from > p->count || job->n > p->count - job->from)
        return moe_fail(MOE_ERR_INVALID_ARG,
                        "world rank %d: %s on communicator '%s': the window of %zu values from %zu is outside the "
                        "region of %zu", c->world_rank, moe__tree_job_name(job), c->label, job->n, job->from,
                        p->count);
    if (job->algo == MOE_TREE_RECURSIVE_DOUBLING && (job->phases != MOE__TREE_ALLREDUCE || job->n != p->count))
        return moe_fail(MOE_ERR_INVALID_ARG, "%s: recursive doubling has no halves", moe__tree_job_name(job));
    return MOE_OK;
}

/* ---- the schedule ---- */

typedef struct {
    size_t at, n; /* buf[at .. at + n) */
} span;

/* [lo, hi) of the region within the job's window, in buf's coordinates (n = 0 when they do not meet). */
static span in_window(const moe__tree_job *job, size_t lo, size_t hi) {
    const size_t wlo = job->from, whi = job->from + job->n;
    lo = lo > wlo ? lo : wlo, hi = hi < whi ? hi : whi;
    return lo < hi ? (span){lo - wlo, hi - lo} : (span){0, 0};
}

/* buf[keep] = (mine is the lower block ? buf[keep] + theirs : theirs + buf[keep]) */
static moe_status combine(const moe__tree_ops *ops, void *ctx, int mine_is_lower, char *keep, const char *theirs,
                          size_t count) {
    return mine_is_lower ? ops->add(ctx, keep, keep, theirs, count) : ops->add(ctx, keep, theirs, keep, count);
}

/* One step with `peer`: buf[give] goes to it and its copy of buf[keep] comes back, in rounds of at most `chunk` values
 * each way. The partner computes the same two spans, swapped, so the rounds pair up and every message's size agrees.
 * add: each received chunk lands in scratch and is added into buf[keep] (lower: this rank's block is the lower);
 * else it lands in buf[keep] itself. */
static moe_status exchange(const moe__tree_ops *ops, void *ctx, char *buf, size_t elem_nbytes, size_t chunk,
                           span give, span keep, int peer, int add, int lower, char *scratch) {
    for (size_t done = 0; done < give.n || done < keep.n; done += chunk) {
        const size_t send = give.n > done ? min_size(chunk, give.n - done) : 0;
        const size_t recv = keep.n > done ? min_size(chunk, keep.n - done) : 0;
        char *kept = buf + (keep.at + done) * elem_nbytes;
        MOE_TRY(ops->sendrecv(ctx, buf + (give.at + done) * elem_nbytes, send * elem_nbytes, add ? scratch : kept,
                              recv * elem_nbytes, peer));
        if (add && recv) MOE_TRY(combine(ops, ctx, lower, kept, scratch, recv));
    }
    return MOE_OK;
}

/* After step j this rank holds on [lo[j+1], hi[j+1]) ∩ window the node over its aligned block of 2^(j+1) ranks. */
static moe_status reduce_scatter(const moe__tree_ops *ops, void *ctx, int rank, const moe__tree_job *job,
                                 const size_t *lo, const size_t *hi, int steps, char *buf, size_t elem_nbytes,
                                 size_t chunk, char *scratch) {
    for (int j = 0; j < steps; j++) {
        const int lower = !(rank & (1 << j));
        const span keep = in_window(job, lo[j + 1], hi[j + 1]);
        const span give = lower ? in_window(job, hi[j + 1], hi[j]) : in_window(job, lo[j], lo[j + 1]);
        MOE_TRY(exchange(ops, ctx, buf, elem_nbytes, chunk, give, keep, rank ^ (1 << j), 1, lower, scratch));
    }
    return MOE_OK;
}

/* Step j again, backwards: the kept part goes to the partner, whose kept part lands beside it, copies only. */
static moe_status all_gather(const moe__tree_ops *ops, void *ctx, int rank, const moe__tree_job *job,
                             const size_t *lo, const size_t *hi, int steps, char *buf, size_t elem_nbytes,
                             size_t chunk) {
    for (int j = steps - 1; j >= 0; j--) {
        const int lower = !(rank & (1 << j)); /* by the bit: with an empty lower part both parts start at lo[j] */
        const span mine = in_window(job, lo[j + 1], hi[j + 1]);
        const span other = lower ? in_window(job, hi[j + 1], hi[j]) : in_window(job, lo[j], lo[j + 1]);
        MOE_TRY(exchange(ops, ctx, buf, elem_nbytes, chunk, mine, other, rank ^ (1 << j), 0, lower, NULL));
    }
    return MOE_OK;
}

static moe_status recursive_doubling(const moe__tree_ops *ops, void *ctx, int rank, int size, char *buf,
                                     size_t count, size_t elem_nbytes, char *scratch) {
    for (int bit = 1; bit < size; bit <<= 1) {
        MOE_TRY(ops->sendrecv(ctx, buf, count * elem_nbytes, scratch, count * elem_nbytes, rank ^ bit));
        MOE_TRY(combine(ops, ctx, !(rank & bit), buf, scratch, count));
    }
    return MOE_OK;
}

size_t moe__tree_scratch_count(const moe_comm *c, const moe__tree_job *job, size_t elem_nbytes) {
    if (c->size == 1) return 0;
    if (job->algo == MOE_TREE_RECURSIVE_DOUBLING) return min_size(job->n, piece_count(c, elem_nbytes));
    if (!(job->phases & MOE__TREE_REDUCE_SCATTER)) return 0;
    size_t lo[MAX_STEPS + 1], hi[MAX_STEPS + 1], largest = 0;
    const int steps = ranges(&job->part, c->size, c->rank, lo, hi);
    for (int j = 1; j <= steps; j++) {
        const size_t kept = in_window(job, lo[j], hi[j]).n;
        largest = kept > largest ? kept : largest;
    }
    return min_size(largest, chunk_count(c, elem_nbytes));
}

moe_status moe__tree_run(const moe__tree_ops *ops, void *ctx, const moe_comm *c, const moe__tree_job *job, void *buf,
                         size_t elem_nbytes, void *scratch) {
    if (c->size == 1 || job->n == 0) return MOE_OK;
    if (job->algo == MOE_TREE_RECURSIVE_DOUBLING) {
        const size_t piece = piece_count(c, elem_nbytes);
        for (size_t at = 0; at < job->n; at += piece)
            MOE_TRY(recursive_doubling(ops, ctx, c->rank, c->size, (char *)buf + at * elem_nbytes,
                                       min_size(job->n - at, piece), elem_nbytes, scratch));
        return MOE_OK;
    }
    size_t lo[MAX_STEPS + 1], hi[MAX_STEPS + 1];
    const int steps = ranges(&job->part, c->size, c->rank, lo, hi);
    const size_t chunk = chunk_count(c, elem_nbytes);
    if (job->phases & MOE__TREE_REDUCE_SCATTER)
        MOE_TRY(reduce_scatter(ops, ctx, c->rank, job, lo, hi, steps, buf, elem_nbytes, chunk, scratch));
    if (job->phases & MOE__TREE_ALLGATHER)
        MOE_TRY(all_gather(ops, ctx, c->rank, job, lo, hi, steps, buf, elem_nbytes, chunk));
    return MOE_OK;
}
