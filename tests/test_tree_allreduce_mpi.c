/* test_tree_allreduce_mpi.c — the fixed binary tree (alltoall/tree_reduce.h): the local sum, the cross-rank
 * all-reduce (moe_comm_allreduce_tree_real / _f64 on the MPI transport) and its halves (reduce-scatter, all-gather
 * over a moe_tree_partition, alltoall/comm.h), checked bitwise against the test's own one-process tree.
 *
 * Under mpirun -np W (meson: W = 1, 2, 4, 8): S = 16 leaves of mixed magnitudes (tests/test_tree_data.h); rank r
 * sums leaves [r S/W, (r+1) S/W) with the library's streaming accumulator, then all-reduces. For float (moe_real)
 * and double, counts 0, 1, 3, 7, 1000, 1001, 99999 and 2^20 (odd ones and ones below W included), and each
 * algorithm (auto, recursive doubling, halving + doubling), every rank's result must equal the oracle's tree over
 * all S leaves bit for bit, and one all-reduce must count as one completed exchange. That the check can fail: for
 * every data set the left-to-right sum of the leaves, and for W >= 4 the left-to-right sum of the ranks' subtrees
 * (what a rank-order chain would give), must differ from the tree somewhere. Also: the local accumulator's
 * refusals (6 leaves, a leaf too many) and array form, and, for W >= 4, a 3-rank communicator refused with
 * MOE_ERR_INVALID_CONFIG on each of its ranks before any communication; and the scratch the transports allocate
 * for the fixed tree: none on one rank, never more than before the halves existed for the all-reduce.
 *
 * The halves: moe_tree_partition_range against the test's own reading of comm.h's definition (a linear scan for the
 * nearest bound) for 1 .. 16 members, its ranges tiling the region in bit-reversed rank order; then for counts 0,
 * 1, 7, 1001 and 99999, partitions without bounds, with uneven "layer" bounds, with one bound at 1 (empty ranges
 * from 4 members on) and with none at all (one member holds the region), windows that are the whole region, four
 * layers reduced last to first, or a part of the largest range, and pieces of the default size and small ones (3- and
 * 10001-value chunks): after the reduce-scatters this rank's range ∩ each window holds the oracle's bits, after the
 * all-gathers every window holds the all-reduce's bits; with rank r contributing 2^r, exactly the elements of this
 * rank's range (moe_tree_partition_range) hold the full 2^W - 1 after reduce-scatter (the rest part-summed), and
 * all-gather copies each element from the rank whose range holds it. Windows outside the region, bounds that do not
 * ascend and a missing partition are refused with MOE_ERR_INVALID_ARG, before any communication. */
#include <stdlib.h>
#include <string.h>

#include "alltoall/comm_mpi.h"
#include "alltoall/comm_transport.h" /* white box: the count of completed exchanges */
#include "alltoall/tree_allreduce.h"  /* white box: the scratch the transports allocate */
#include "core/fail.h"
#include "tests/test_mpi.h"
#include "tests/test_tree_data.h"

static const size_t kCounts[] = {0, 1, 3, 7, 1000, 1001, 99999, 1u << 20};
static const moe_tree_algorithm kAlgos[] = {MOE_TREE_AUTO, MOE_TREE_RECURSIVE_DOUBLING, MOE_TREE_HALVING_DOUBLING};
static const char *const kAlgoNames[] = {"auto", "doubling", "halving+doubling"};
enum { SEED = 15 };

static void *alloc_values(moe_tree_dtype dtype, size_t count) {
    void *p = malloc(count ? count * test_tree_elem_nbytes(dtype) : 1);
    if (!p) test_mpi_require(MOE_ERR_OUT_OF_MEMORY, "test buffer");
    return p;
}

static const char *dtype_name(moe_tree_dtype dtype) { return dtype == MOE_TREE_F64 ? "double" : "float"; }

/* The data must be order-sensitive, or a bitwise check proves nothing. */
static void check_order_matters(moe_tree_dtype dtype, size_t count, const void *want, int W) {
    void *other = alloc_values(dtype, count);
    size_t first;
    test_tree_chain_of_subtrees(dtype, SEED, 1, count, other);
    CHECK(test_tree_count_diff(dtype, other, want, count, &first) > 0,
          "%s, %zu values: the left-to-right sum of the leaves equals the tree everywhere: the data cannot tell "
          "orders apart", dtype_name(dtype), count);
    if (W >= 4) {
        test_tree_chain_of_subtrees(dtype, SEED, TEST_TREE_LEAVES / W, count, other);
        CHECK(test_tree_count_diff(dtype, other, want, count, &first) > 0,
              "%s, %zu values: the rank-order chain of %d subtrees equals the tree everywhere", dtype_name(dtype),
              count, W);
    }
    free(other);
}

static void check_count(moe_comm *c, moe_tree_dtype dtype, size_t count) {
    const int W = moe_comm_size(c), r = moe_comm_rank(c), span = TEST_TREE_LEAVES / W;
    void *want = alloc_values(dtype, count), *mine = alloc_values(dtype, count), *buf = alloc_values(dtype, count);
    const size_t nbytes = count * test_tree_elem_nbytes(dtype);
    test_tree_oracle(dtype, SEED, 0, TEST_TREE_LEAVES, count, want);
    test_tree_local(dtype, SEED, r * span, span, count, mine);
    /* the local part alone: this rank's subtree is the oracle's node over the same leaves */
    void *node = alloc_values(dtype, count);
    size_t first = 0, bad;
    test_tree_oracle(dtype, SEED, r * span, (r + 1) * span, count, node);
    bad = test_tree_count_diff(dtype, mine, node, count, &first);
    CHECK(bad == 0, "rank %d %s count %zu: local tree over %d leaves: %zu values differ from the oracle, first at %zu",
          r, dtype_name(dtype), count, span, bad, first);
    if (count >= 1000) check_order_matters(dtype, count, want, W);

    /* whole, and in 3 or 4 pieces of count / 3 + 1 values (the last one shorter, odd sizes): the same bits */
    for (size_t a = 0; a < 2 * sizeof kAlgos / sizeof kAlgos[0]; a++) {
        const size_t algo = a % (sizeof kAlgos / sizeof kAlgos[0]);
        const size_t piece = a < sizeof kAlgos / sizeof kAlgos[0] ? 0 : count / 3 + 1;
        moe_comm_set_tree_algorithm(c, kAlgos[algo]);
        moe__comm_set_tree_piece_nbytes(c, piece * test_tree_elem_nbytes(dtype));
        if (nbytes) memcpy(buf, mine, nbytes);
        const long before = c->completed;
        moe_status st = dtype == MOE_TREE_F64 ? moe_comm_allreduce_tree_f64(c, buf, count)
                                              : moe_comm_allreduce_tree_real(c, buf, count);
        test_mpi_require(st, "tree all-reduce");
        CHECK(c->completed == before + 1, "%s: completed went from %ld to %ld over one all-reduce", kAlgoNames[algo],
              before, c->completed);
        bad = test_tree_count_diff(dtype, buf, want, count, &first);
        CHECK(bad == 0, "rank %d of %d, %s, pieces of %zu, %s, %zu values: %zu differ from the one-process tree, first "
              "at %zu", r, W, kAlgoNames[algo], piece, dtype_name(dtype), count, bad, first);
    }
    moe_comm_set_tree_algorithm(c, MOE_TREE_AUTO);
    moe__comm_set_tree_piece_nbytes(c, 0);
    free(want), free(mine), free(buf), free(node);
}

static void check_local_api(void) {
    moe_tree_acc acc;
    CHECK(moe_tree_acc_init(&acc, MOE_TREE_F32, 6, 4) == MOE_ERR_INVALID_CONFIG, "6 leaves accepted");
    CHECK(strstr(moe_failure_message(MOE_ERR_INVALID_CONFIG), "power of two"), "message: %s",
          moe_failure_message(MOE_ERR_INVALID_CONFIG));
    moe_tree_acc_free(&acc);
    float leaves[4][3], out[3], want[3];
    const void *ptrs[4];
    for (int l = 0; l < 4; l++) {
        test_tree_fill_leaf(MOE_TREE_F32, SEED, l, 3, leaves[l]);
        ptrs[l] = leaves[l];
    }
    CHECK_OK(moe_tree_acc_init(&acc, MOE_TREE_F32, 4, 3));
    for (int l = 0; l < 4; l++) {
        CHECK(moe_tree_acc_sum(&acc) == NULL, "a sum after %d of 4 leaves", l);
        CHECK_OK(moe_tree_acc_push(&acc, leaves[l]));
    }
    CHECK(moe_tree_acc_push(&acc, leaves[0]) == MOE_ERR_INVALID_ARG, "a fifth leaf accepted");
    test_tree_oracle(MOE_TREE_F32, SEED, 0, 4, 3, want);
    CHECK(moe_tree_acc_sum(&acc) && !memcmp(moe_tree_acc_sum(&acc), want, sizeof want), "accumulator of 4 leaves");
    moe_tree_acc_reset(&acc);
    CHECK(moe_tree_acc_sum(&acc) == NULL, "a sum right after reset");
    moe_tree_acc_free(&acc);
    CHECK_OK(moe_tree_reduce_local(MOE_TREE_F32, ptrs, 4, 3, out));
    CHECK(!memcmp(out, want, sizeof want), "moe_tree_reduce_local of 4 leaves");
    CHECK(moe_tree_reduce_local(MOE_TREE_F32, ptrs, 3, 3, out) == MOE_ERR_INVALID_CONFIG, "3 leaves accepted");
}

/* Ranks 0..2 of a world of 4 or more: a communicator of 3, which the tree cannot serve. */
static void check_not_power_of_two(int rank) {
    MPI_Comm three;
    if (MPI_Comm_split(MPI_COMM_WORLD, rank < 3 ? 0 : MPI_UNDEFINED, rank, &three) != MPI_SUCCESS)
        test_mpi_require(MOE_ERR_COMM, "MPI_Comm_split");
    if (three == MPI_COMM_NULL) return;
    moe_comm *c;
    test_mpi_require(moe_comm_create_mpi(three, "three", 10, &c), "3-rank comm");
    float x = 1;
    double y = 1;
    CHECK(moe_comm_allreduce_tree_real(c, &x, 1) == MOE_ERR_INVALID_CONFIG, "rank %d: 3 ranks accepted (float)", rank);
    const char *msg = moe_failure_message(MOE_ERR_INVALID_CONFIG);
    CHECK(strstr(msg, "power-of-two") && strstr(msg, "has 3"), "rank %d: message: %s", rank, msg);
    CHECK(moe_comm_allreduce_tree_f64(c, &y, 1) == MOE_ERR_INVALID_CONFIG, "rank %d: 3 ranks accepted (double)", rank);
    const moe_tree_partition p = {.count = 1};
    CHECK(moe_comm_reduce_scatter_tree_real(c, &x, &p, 0, 1) == MOE_ERR_INVALID_CONFIG &&
              strstr(moe_failure_message(MOE_ERR_INVALID_CONFIG), "power-of-two"),
          "rank %d: 3 ranks accepted by reduce-scatter", rank);
    CHECK(moe_comm_allgather_tree_real(c, &x, &p, 0, 1) == MOE_ERR_INVALID_CONFIG,
          "rank %d: 3 ranks accepted by all-gather", rank);
    CHECK(c->completed == 0, "rank %d: a refused all-reduce counted as an exchange", rank);
    moe_comm_destroy(c);
}

/* The scratch every transport sizes from moe__tree_scratch_count for an all-reduce (the NCCL transport's is device
 * memory): none on one rank, where the all-reduce copies nothing; the partner's whole piece (doubling) or, halving,
 * the part this rank keeps at step 0, at most half a piece: never more than the piece-by-piece schedule's
 * ceil(min(count, piece) / 2), and that on ranks with bit 0 set. */
static void check_scratch_count(const moe_comm *c, int W) {
    const size_t piece = MOE__TREE_PIECE_NBYTES / sizeof(float), half = piece - piece / 2;
    const size_t sizes[] = {1001, 3 * piece + 5}, want_piece[] = {1001, piece};
    for (int i = 0; i < 2; i++) {
        const size_t n = sizes[i], p = want_piece[i];
        moe__tree_job job = moe__tree_job_allreduce(c, n, sizeof(float));
        job.algo = MOE_TREE_RECURSIVE_DOUBLING;
        const size_t doubling = moe__tree_scratch_count(c, &job, sizeof(float));
        job.algo = MOE_TREE_HALVING_DOUBLING;
        const size_t halving = moe__tree_scratch_count(c, &job, sizeof(float));
        const size_t kept = moe_comm_rank(c) & 1 ? n - n / 2 : n / 2, want_halving = kept < half ? kept : half;
        if (W == 1) CHECK(doubling == 0 && halving == 0, "W=1: tree scratch %zu / %zu values, want none", doubling,
                          halving);
        else CHECK(doubling == p && halving == want_halving && halving <= p - p / 2,
                   "W=%d rank %d, %zu values: tree scratch %zu / %zu values, want %zu / %zu", W, moe_comm_rank(c), n,
                   doubling, halving, p, want_halving);
    }
}

/* ---- the halves ---- */

static size_t dist(size_t a, size_t b) { return a > b ? a - b : b - a; }

/* The test's own reading of comm.h's partition: the candidates lo, the bounds within [lo, hi], hi, scanned in
 * ascending order, the first nearest to the midpoint winning. */
static void oracle_range(const moe_tree_partition *p, int size, int rank, size_t *lo_out, size_t *hi_out) {
    size_t lo = 0, hi = p->count;
    for (int bit = 1; bit < size; bit <<= 1) {
        const size_t mid = lo + (hi - lo) / 2;
        size_t best = mid;
        if (p->bounds) {
            best = lo;
            for (size_t i = 0; i < p->num_bounds; i++)
                if (p->bounds[i] >= lo && p->bounds[i] <= hi && dist(p->bounds[i], mid) < dist(best, mid))
                    best = p->bounds[i];
            if (dist(hi, mid) < dist(best, mid)) best = hi;
        }
        if (rank & bit) lo = best;
        else hi = best;
    }
    *lo_out = lo, *hi_out = hi;
}

enum { MAX_BOUNDS = 8, PARTITIONS = 4, WINDOW_KINDS = 3, MAX_WINDOWS = 4 };
static const char *const kPartitionNames[PARTITIONS] = {"no-bounds", "layer-bounds", "bound-at-1", "no-interior"};

/* Partition `kind` of a region of count values (its bounds in `bounds`). */
static moe_tree_partition make_partition(int kind, size_t count, size_t bounds[MAX_BOUNDS]) {
    moe_tree_partition p = {.count = count, .bounds = bounds, .num_bounds = 0};
    if (kind == 0) p.bounds = NULL;
    if (kind == 1) { /* uneven layers: ascending, inside (0, count), no repeats */
        const size_t at[] = {count / 7, 2 * count / 7 + 3, count / 2 + 1, 5 * count / 6};
        for (int i = 0; i < 4; i++)
            if (at[i] > 0 && at[i] < count && (!p.num_bounds || at[i] > bounds[p.num_bounds - 1]))
                bounds[p.num_bounds++] = at[i];
    }
    if (kind == 2 && count > 1) bounds[p.num_bounds++] = 1;
    return p;
}

typedef struct {
    size_t from, n;
} window;

/* Windows `kind` of p's region over W ranks: the whole region; four layers cut at count/3, count/3 + 1, 3 count/4
 * (uneven, one of one value, some empty for small counts); or half of the largest range, inside it. */
static int make_windows(int kind, const moe_tree_partition *p, int W, window out[MAX_WINDOWS]) {
    const size_t n = p->count;
    if (kind == 0) return out[0] = (window){0, n}, 1;
    if (kind == 1) {
        const size_t cut[] = {0, n / 3, n / 3 + 1 < n ? n / 3 + 1 : n, 3 * n / 4 > n / 3 + 1 ? 3 * n / 4 : n, n};
        for (int k = 0; k < 4; k++) out[k] = (window){cut[k], cut[k + 1] > cut[k] ? cut[k + 1] - cut[k] : 0};
        return 4;
    }
    size_t best_lo = 0, best_len = 0;
    for (int r = 0; r < W; r++) {
        size_t lo, hi;
        moe_tree_partition_range(p, W, r, &lo, &hi);
        if (hi - lo > best_len) best_lo = lo, best_len = hi - lo;
    }
    return out[0] = (window){best_lo + best_len / 4, best_len ? (best_len / 2 ? best_len / 2 : 1) : 0}, 1;
}

static void check_partition_ranges(void) {
    const size_t counts[] = {0, 1, 7, 1001, 99999};
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++)
        for (int kind = 0; kind < PARTITIONS; kind++) {
            size_t bounds[MAX_BOUNDS];
            const moe_tree_partition p = make_partition(kind, counts[i], bounds);
            for (int size = 1; size <= 16; size *= 2) {
                int L = 0;
                while (1 << L < size) L++;
                size_t next = 0; /* where the next range in bit-reversed rank order must start */
                for (int k = 0; k < size; k++) {
                    int r = 0; /* k with its L bits reversed */
                    for (int b = 0; b < L; b++) r |= (k >> b & 1) << (L - 1 - b);
                    size_t lo, hi, want_lo, want_hi;
                    moe_tree_partition_range(&p, size, r, &lo, &hi);
                    oracle_range(&p, size, r, &want_lo, &want_hi);
                    CHECK(lo == want_lo && hi == want_hi, "%s, %zu values, %d members: rank %d holds [%zu, %zu), the "
                          "definition says [%zu, %zu)", kPartitionNames[kind], counts[i], size, r, lo, hi, want_lo,
                          want_hi);
                    CHECK(lo == next && hi >= lo, "%s, %zu values, %d members: rank %d's range [%zu, %zu) does not "
                          "follow the previous one's end %zu", kPartitionNames[kind], counts[i], size, r, lo, hi, next);
                    next = hi;
                }
                CHECK(next == counts[i], "%s, %d members: the ranges end at %zu of %zu", kPartitionNames[kind], size,
                      next, counts[i]);
            }
        }
}

/* The scratch of one reduce-scatter: the largest part this rank keeps within the window, at most half a piece. */
static void check_half_scratch(const moe_comm *c, const moe_tree_partition *p, window w, size_t piece) {
    const int W = moe_comm_size(c), r = moe_comm_rank(c);
    const size_t chunk = (piece ? piece : MOE__TREE_PIECE_NBYTES / sizeof(moe_real)) / 2 +
                         (piece ? piece : MOE__TREE_PIECE_NBYTES / sizeof(moe_real)) % 2;
    size_t largest = 0;
    for (int size = 2; size <= W; size *= 2) {
        size_t lo, hi;
        oracle_range(p, size, r % size, &lo, &hi);
        lo = lo > w.from ? lo : w.from, hi = hi < w.from + w.n ? hi : w.from + w.n;
        largest = hi > lo && hi - lo > largest ? hi - lo : largest;
    }
    moe__tree_job job = {.phases = MOE__TREE_REDUCE_SCATTER, .algo = MOE_TREE_HALVING_DOUBLING, .part = *p,
                         .from = w.from, .n = w.n};
    const size_t got = moe__tree_scratch_count(c, &job, sizeof(moe_real));
    CHECK(got == (largest < chunk ? largest : chunk), "rank %d: reduce-scatter scratch %zu values, want %zu", r, got,
          largest < chunk ? largest : chunk);
    job.phases = MOE__TREE_ALLGATHER;
    CHECK(moe__tree_scratch_count(c, &job, sizeof(moe_real)) == 0, "rank %d: scratch for an all-gather", r);
}

static moe_status half(moe_comm *c, int gather, moe_real *buf, const moe_tree_partition *p, window w) {
    const long before = c->completed;
    const moe_status st = gather ? moe_comm_allgather_tree_real(c, buf + w.from, p, w.from, w.n)
                                 : moe_comm_reduce_scatter_tree_real(c, buf + w.from, p, w.from, w.n);
    CHECK(st != MOE_OK || c->completed == before + 1, "completed went from %ld to %ld over one %s", before,
          c->completed, gather ? "all-gather" : "reduce-scatter");
    return st;
}

/* One partition, one set of windows: the sums' bits, then where the data lands. */
static void check_case(moe_comm *c, const moe_tree_partition *p, const char *what, const window *w, int nw,
                       const moe_real *mine, const moe_real *want, const moe_real *allreduced, size_t piece) {
    const int W = moe_comm_size(c), r = moe_comm_rank(c);
    const size_t n = p->count;
    moe_real *buf = alloc_values(MOE_TREE_REAL, n);
    size_t lo[16], hi[16], bad, first = 0;
    for (int s = 0; s < W; s++) moe_tree_partition_range(p, W, s, &lo[s], &hi[s]);
    /* the windows' reduce-scatters from the last to the first (a backward's layers), then their all-gathers */
    for (int k = nw - 1; k >= 0; k--) {
        check_half_scratch(c, p, w[k], piece);
        if (w[k].n) memcpy(buf + w[k].from, mine + w[k].from, w[k].n * sizeof *buf);
        test_mpi_require(half(c, 0, buf, p, w[k]), "reduce-scatter");
        const size_t a = lo[r] > w[k].from ? lo[r] : w[k].from;
        const size_t b = hi[r] < w[k].from + w[k].n ? hi[r] : w[k].from + w[k].n;
        bad = a < b ? test_tree_count_diff(MOE_TREE_REAL, buf + a, want + a, b - a, &first) : 0;
        CHECK(bad == 0, "rank %d of %d, %s, window [%zu, +%zu): after reduce-scatter %zu values of [%zu, %zu) differ "
              "from the one-process tree, first at %zu", r, W, what, w[k].from, w[k].n, bad, a, b, a + first);
    }
    for (int k = 0; k < nw; k++) test_mpi_require(half(c, 1, buf, p, w[k]), "all-gather");
    for (int k = 0; k < nw; k++) {
        bad = test_tree_count_diff(MOE_TREE_REAL, buf + w[k].from, allreduced + w[k].from, w[k].n, &first) +
              test_tree_count_diff(MOE_TREE_REAL, buf + w[k].from, want + w[k].from, w[k].n, &first);
        CHECK(bad == 0, "rank %d of %d, %s, window [%zu, +%zu): after all-gather %zu values differ from the "
              "all-reduce's or the one-process tree's", r, W, what, w[k].from, w[k].n, bad);
    }
    /* rank s contributes 2^s (exact sums): the full 2^W - 1 after reduce-scatter exactly on this rank's range */
    size_t wrong = 0;
    for (int k = 0; k < nw; k++) {
        for (size_t i = 0; i < w[k].n; i++) buf[w[k].from + i] = (moe_real)(1 << r);
        test_mpi_require(half(c, 0, buf, p, w[k]), "reduce-scatter");
        for (size_t x = w[k].from; x < w[k].from + w[k].n; x++)
            wrong += (buf[x] == (moe_real)((1 << W) - 1)) != (x >= lo[r] && x < hi[r]);
    }
    CHECK(wrong == 0, "rank %d of %d, %s: %zu elements where holding the full sum and lying in this rank's range "
          "[%zu, %zu) disagree", r, W, what, wrong, lo[r], hi[r]);
    /* rank s's buffer holds s + 1: all-gather copies each element from the rank whose range holds it */
    wrong = 0;
    for (int k = 0; k < nw; k++) {
        for (size_t i = 0; i < w[k].n; i++) buf[w[k].from + i] = (moe_real)(r + 1);
        test_mpi_require(half(c, 1, buf, p, w[k]), "all-gather");
        for (size_t x = w[k].from; x < w[k].from + w[k].n; x++) {
            int owner = 0;
            while (owner < W - 1 && !(x >= lo[owner] && x < hi[owner])) owner++;
            wrong += buf[x] != (moe_real)(owner + 1);
        }
    }
    CHECK(wrong == 0, "rank %d of %d, %s: all-gather took %zu elements from a rank whose range does not hold them",
          r, W, what, wrong);
    free(buf);
}

static void check_halves(moe_comm *c, size_t count) {
    const int W = moe_comm_size(c), r = moe_comm_rank(c), span = TEST_TREE_LEAVES / W;
    moe_real *want = alloc_values(MOE_TREE_REAL, count), *mine = alloc_values(MOE_TREE_REAL, count);
    moe_real *allreduced = alloc_values(MOE_TREE_REAL, count);
    test_tree_oracle(MOE_TREE_REAL, SEED, 0, TEST_TREE_LEAVES, count, want);
    test_tree_local(MOE_TREE_REAL, SEED, r * span, span, count, mine);
    if (count) memcpy(allreduced, mine, count * sizeof *mine);
    test_mpi_require(moe_comm_allreduce_tree_real(c, allreduced, count), "tree all-reduce");
    const size_t pieces[] = {0, count > 1001 ? 20001 : 5}; /* values: chunks of half of one */
    for (int pk = 0; pk < 2; pk++) {
        moe__comm_set_tree_piece_nbytes(c, pieces[pk] * sizeof(moe_real));
        for (int kind = 0; kind < PARTITIONS; kind++) {
            size_t bounds[MAX_BOUNDS];
            const moe_tree_partition p = make_partition(kind, count, bounds);
            for (int wk = 0; wk < WINDOW_KINDS; wk++) {
                window w[MAX_WINDOWS];
                const int nw = make_windows(wk, &p, W, w);
                char what[160];
                snprintf(what, sizeof what, "%s partition of %zu values, %d window(s) of kind %d, pieces of %zu",
                         kPartitionNames[kind], count, nw, wk, pieces[pk]);
                check_case(c, &p, what, w, nw, mine, want, allreduced, pieces[pk]);
            }
        }
    }
    moe__comm_set_tree_piece_nbytes(c, 0);
    free(want), free(mine), free(allreduced);
}

/* Refused locally, alike on every rank, before any communication (no exchange completed). */
static void check_half_refusals(moe_comm *c) {
    moe_real buf[16] = {0};
    const size_t descending[] = {5, 3}, beyond[] = {11};
    const moe_tree_partition ok = {.count = 10}, bad_order = {10, descending, 2}, bad_bound = {10, beyond, 1};
    const struct {
        const moe_tree_partition *p;
        size_t from, n;
        const char *text, *what;
    } cases[] = {
        {&ok, 11, 0, "outside", "a window starting past the region"},
        {&ok, 1, 10, "outside", "a window ending past the region"},
        {&ok, (size_t)-1, 2, "outside", "a window whose end overflows"},
        {&bad_order, 0, 10, "ascend", "descending bounds"},
        {&bad_bound, 0, 10, "ascend", "a bound past the region"},
        {NULL, 0, 10, "partition", "no partition"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int gather = 0; gather < 2; gather++) {
            const long before = c->completed;
            const moe_status st = gather ? moe_comm_allgather_tree_real(c, buf, cases[i].p, cases[i].from, cases[i].n)
                                         : moe_comm_reduce_scatter_tree_real(c, buf, cases[i].p, cases[i].from,
                                                                             cases[i].n);
            const char *msg = moe_failure_message(MOE_ERR_INVALID_ARG);
            CHECK(st == MOE_ERR_INVALID_ARG && strstr(msg, cases[i].text) && c->completed == before,
                  "%s (%s) on '%s': %s, message: %s", cases[i].what, gather ? "all-gather" : "reduce-scatter",
                  moe_comm_transport_name(c), moe_status_string(st), msg);
        }
}

/* The self transport: one rank, both halves leave buf as it is (and refuse what the MPI transport refuses). */
static void check_self(void) {
    moe_comm *c;
    test_mpi_require(moe_comm_create_self("self", &c), "self comm");
    moe_real buf[7] = {1, 2, 3, 4, 5, 6, 7}, want[7];
    memcpy(want, buf, sizeof buf);
    const size_t bounds[] = {3};
    const moe_tree_partition p = {7, bounds, 1};
    CHECK_OK(moe_comm_reduce_scatter_tree_real(c, buf + 2, &p, 2, 5));
    CHECK_OK(moe_comm_allgather_tree_real(c, buf + 2, &p, 2, 5));
    CHECK(!memcmp(buf, want, sizeof buf) && c->completed == 2, "self: the halves changed buf or were not counted");
    check_half_refusals(c);
    moe_comm_destroy(c);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int W, rank;
    MPI_Comm_size(MPI_COMM_WORLD, &W);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (TEST_TREE_LEAVES % W || (W & (W - 1))) {
        if (rank == 0) fprintf(stderr, "run on a power of two of ranks up to %d, not %d\n", TEST_TREE_LEAVES, W);
        MPI_Finalize();
        return 1;
    }
    check_local_api();
    moe_comm *c;
    test_mpi_require(moe_comm_create_mpi(test_mpi_dup_world(), "world", 120, &c), "world comm");
    for (int d = 0; d < 2; d++)
        for (size_t k = 0; k < sizeof kCounts / sizeof kCounts[0]; k++) {
            check_count(c, d ? MOE_TREE_F64 : MOE_TREE_REAL, kCounts[k]);
            if (rank == 0 && kCounts[k] >= 1000)
                printf("W=%d %s count %zu: local trees and the all-reduce (3 algorithms) checked\n", W,
                       d ? "double" : "float", kCounts[k]);
        }
    check_scratch_count(c, W);
    check_partition_ranges();
    const size_t half_counts[] = {0, 1, 7, 1001, 99999};
    for (size_t k = 0; k < sizeof half_counts / sizeof half_counts[0]; k++) {
        check_halves(c, half_counts[k]);
        if (rank == 0 && half_counts[k] >= 1000)
            printf("W=%d count %zu: reduce-scatter and all-gather over %d partitions x %d window sets x 2 piece sizes "
                   "checked\n", W, half_counts[k], PARTITIONS, WINDOW_KINDS);
    }
    check_half_refusals(c);
    moe_comm_destroy(c);
    check_self();
    if (W >= 4) check_not_power_of_two(rank);
    return test_mpi_finish("test_tree_allreduce_mpi");
}
