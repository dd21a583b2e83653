/* bench_alltoall.c — the expert-parallel row exchange against raw MPI_Alltoallv (nccl-tests' alltoallv shape).
 *
 * Under mpirun -np W, for total send sizes S from --min-bytes to --max-bytes (doubling) per rank, in rows of
 * --row-bytes (count = S / row_bytes rows per rank, the size column is count * row_bytes), and per pattern:
 *   uniform: every rank sends count/W rows to every peer, itself included (the first count % W peers
 *            get one row more);
 *   skewed:  every rank sends ceil(count/2) rows to rank 0 and spreads the other floor(count/2) evenly over
 *            ranks 1..W-1 (lower ranks get the remainder), so rank 0 receives half of all traffic
 *            (W * S / 2 bytes) and the others W * S / (2 (W-1)) each. For W = 2 that is the uniform split;
 *            for W = 1 everything goes to rank 0 itself.
 * it times round trips, each two exchanges: (a) raw: two blocking MPI_Alltoallv of those counts, there (send ->
 * recv) and back (recv -> a third buffer), each peer's block contiguous, in rows of an MPI_Type_contiguous(row_bytes,
 * MPI_BYTE); (b) moe: moe_dispatch_rows + moe_combine_rows of the library's MPI transport (point-to-point messages
 * polled against the watchdog, plus the block reorder; with one expert per rank there is none) on a plan from
 * moe_dispatch_plan_exchange with E = W experts, one per rank, between the same three kinds of buffer. raw_us and
 * moe_us are half a round trip.
 * Per size and pattern: --warmup untimed round trips of each, MPI_Barrier, then --iters timed ones of each,
 * alternating raw and moe (so that a noisy minute of a shared machine falls on both); the time of each is the median
 * over its timed round trips (robust to the preemptions of a VM), maxed over ranks (the slowest rank: nccl-tests'
 * -a 3), and the JSON line adds the means. algbw = S / time, busbw = algbw * (W-1)/W (nccl-tests' alltoall factor),
 * in GB/s (1e9). After timing, the raw and moe receive buffers are compared bytewise, and both round trips must
 * return the sent rows. Table on rank 0, then one "json: {...}" line per row.
 *
 *   meson setup build-bench --buildtype=release && ninja -C build-bench bench/bench_alltoall
 *   OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \
 *   OMPI_MCA_btl_vader_single_copy_mechanism=none mpirun -np 4 build-bench/bench/bench_alltoall \
 *       [--min-bytes 64K --max-bytes 64M --row-bytes 2048 --pattern both --warmup 5 --iters 20 --timeout 300]
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alltoall/dispatch.h"
#include "alltoall/parallel_mpi.h"
#include "bench/bench_util_mpi.h"

typedef struct {
    long long min_bytes, max_bytes, row_bytes;
    int pattern, warmup, iters; /* pattern: index into kPatterns */
    double timeout_s;
} options;

enum { PATTERN_UNIFORM, PATTERN_SKEWED, PATTERN_BOTH };
static const char *const kPatterns[] = {"uniform", "skewed", "both", NULL};

static const bench_flag kFlags[] = {
    BENCH_SIZE("--min-bytes", options, min_bytes, 1, 1LL << 30, "smallest total send size per rank"),
    BENCH_SIZE("--max-bytes", options, max_bytes, 1, 1LL << 30, "largest total send size per rank (sizes double)"),
    BENCH_SIZE("--row-bytes", options, row_bytes, 4, 1 << 24, "bytes of one row, a multiple of 4 (a float)"),
    BENCH_CHOICE("--pattern", options, pattern, kPatterns, "traffic pattern(s) to time"),
    BENCH_INT("--warmup", options, warmup, 0, 100000, "untimed iterations per size and pattern"),
    BENCH_INT("--iters", options, iters, 1, 100000, "timed iterations per size and pattern"),
    BENCH_REAL("--timeout", options, timeout_s, 1, 86400, "seconds before a stuck exchange aborts the job"),
};

/* Every rank parses the same arguments, so every rank reaches the same usage error (bench_util.h). */
static void check(const void *opt) {
    const options *o = opt;
    if (o->row_bytes % (long long)sizeof(moe_real))
        bench_usage_errorf("--row-bytes must be a multiple of sizeof(float) = %zu", sizeof(moe_real));
    if (o->min_bytes < o->row_bytes) bench_usage_error("--min-bytes must be at least --row-bytes (one row per rank)", NULL);
    if (o->max_bytes < o->min_bytes) bench_usage_error("--max-bytes must be at least --min-bytes", NULL);
}

static const bench_cli kCli = {
    .name = "bench_alltoall",
    .synopsis = "mpirun -np W bench_alltoall [flags]",
    .about = "the expert-parallel row exchange (moe_dispatch_rows + moe_combine_rows) against raw MPI_Alltoallv",
    .flags = kFlags,
    .num_flags = sizeof kFlags / sizeof kFlags[0],
    .notes = "sizes take a K, M or G suffix (powers of 1024)",
    .check = check,
};

/* rows[p]: what every rank sends to peer p (the same for every sender), for count rows per rank. */
static void pattern_rows(int skewed, long count, int W, int *rows) {
    if (!skewed || W == 1) {
        for (int p = 0; p < W; p++) rows[p] = (int)(count / W + (p < count % W));
        return;
    }
    long rest = count / 2;
    rows[0] = (int)(count - rest);
    for (int p = 1; p < W; p++) rows[p] = (int)(rest / (W - 1) + (p - 1 < rest % (W - 1)));
}

typedef struct {
    int W, d, row_bytes;
    int *send_rows, *recv_rows, *sdispl, *rdispl;
    MPI_Datatype row;
    moe_real *send, *raw_recv, *raw_back, *staging, *moe_recv, *back;
    moe_comm *ep;
    moe_dispatch_plan plan;
} bench;

/* One round trip: there and back. */
static void run_once(bench *b, int moe) {
    if (!moe) {
        MPI_CHECK(MPI_Alltoallv(b->send, b->send_rows, b->sdispl, b->row, b->raw_recv, b->recv_rows, b->rdispl,
                                b->row, MPI_COMM_WORLD));
        MPI_CHECK(MPI_Alltoallv(b->raw_recv, b->recv_rows, b->rdispl, b->row, b->raw_back, b->send_rows, b->sdispl,
                                b->row, MPI_COMM_WORLD));
        return;
    }
    bench_check(moe_dispatch_rows(b->ep, &b->plan, b->send, (size_t)b->row_bytes, b->staging, b->moe_recv), "moe_dispatch_rows");
    bench_check(moe_combine_rows(b->ep, &b->plan, b->moe_recv, (size_t)b->row_bytes, b->staging, b->back), "moe_combine_rows");
}

/* Seconds of one exchange (half a round trip) of raw [0] and moe [1]: medians and means over the timed round
 * trips of this rank, each maxed over ranks. */
typedef struct {
    double median[2], mean[2];
} timing;

static timing time_both(bench *b, const options *o) {
    double *t = malloc(2 * (size_t)o->iters * sizeof *t);
    if (!t) bench_fail("out of memory");
    for (int i = 0; i < o->warmup; i++) run_once(b, 0), run_once(b, 1);
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    for (int i = 0; i < o->iters; i++)
        for (int moe = 0; moe < 2; moe++) {
            const double t0 = MPI_Wtime();
            run_once(b, moe);
            t[moe * o->iters + i] = (MPI_Wtime() - t0) / 2;
        }
    double mine[4];
    for (int moe = 0; moe < 2; moe++) {
        double *x = t + moe * o->iters, sum = 0;
        for (int i = 0; i < o->iters; i++) sum += x[i];
        mine[2 + moe] = sum / o->iters;
        mine[moe] = bench_median(x, o->iters); /* sorts x */
    }
    free(t);
    double slowest[4];
    MPI_CHECK(MPI_Allreduce(mine, slowest, 4, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
    return (timing){{slowest[0], slowest[1]}, {slowest[2], slowest[3]}};
}

static moe_real *alloc_rows(long rows, int d) {
    size_t n = (size_t)(rows > 0 ? rows : 1) * d;
    moe_real *p = malloc(n * sizeof *p);
    if (!p) bench_fail("out of memory (%zu bytes)", n * sizeof *p);
    memset(p, 0, n * sizeof *p); /* touch the pages before timing */
    return p;
}

int main(int argc, char **argv) {
    int W;
    const int my_rank = bench_mpi_init(&argc, &argv, kCli.name, &W);
    options o = {.min_bytes = 64LL << 10, .max_bytes = 64LL << 20, .row_bytes = 2048, .pattern = PATTERN_BOTH,
                 .warmup = 5, .iters = 20, .timeout_s = 300};
    bench_parse_flags(&kCli, argc, argv, &o);
    const int patterns = o.pattern + 1; /* bit 0: uniform, bit 1: skewed */
    const int row_bytes = (int)o.row_bytes;

    bench b = {.W = W, .d = row_bytes / (int)sizeof(moe_real), .row_bytes = row_bytes};
    int *ints = malloc(4 * (size_t)W * sizeof(int));
    if (!ints) bench_fail("out of memory");
    b.send_rows = ints, b.recv_rows = ints + W, b.sdispl = ints + 2 * W, b.rdispl = ints + 3 * W;
    MPI_CHECK(MPI_Type_contiguous(row_bytes, MPI_BYTE, &b.row));
    MPI_CHECK(MPI_Type_commit(&b.row));
    moe_parallel *par;
    bench_check(moe_parallel_create_mpi(MPI_COMM_WORLD, W, o.timeout_s, &par), "moe_parallel_create_mpi (ep = W)");
    b.ep = moe_parallel_ep(par);
    bench_check(moe_dispatch_plan_alloc(&b.plan, W, 1, 0, 1), "moe_dispatch_plan_alloc");

    /* Buffers for the largest size: what this rank receives is W times what one peer sends it. */
    const long max_count = (long)(o.max_bytes / row_bytes);
    long max_recv = 0;
    for (int pat = 0; pat < 2; pat++)
        if (patterns >> pat & 1) {
            pattern_rows(pat, max_count, W, b.send_rows);
            max_recv = (long)W * b.send_rows[my_rank] > max_recv ? (long)W * b.send_rows[my_rank] : max_recv;
        }
    b.send = alloc_rows(max_count, b.d), b.back = alloc_rows(max_count, b.d), b.raw_back = alloc_rows(max_count, b.d);
    b.raw_recv = alloc_rows(max_recv, b.d), b.staging = alloc_rows(max_recv, b.d), b.moe_recv = alloc_rows(max_recv, b.d);
    for (size_t i = 0; i < (size_t)max_count * b.d; i++) b.send[i] = (moe_real)((my_rank * 7919 + i) % 65521);

    if (my_rank == 0) {
        printf("# bench_alltoall: W=%d row_bytes=%d (%d floats) warmup=%d iters=%d timeout=%gs transport=%s\n", W,
               row_bytes, b.d, o.warmup, o.iters, o.timeout_s, moe_comm_transport_name(b.ep));
        printf("# size = bytes sent per rank; count = rows per rank; time = one exchange, max over ranks of the median; "
               "bw in GB/s; busbw = algbw*(W-1)/W\n");
        printf("# skewed: rank 0 receives half of all bytes, ranks 1..W-1 share the rest (W=2: same as uniform)\n");
        printf("#%12s %9s %8s %10s %9s %9s %10s %9s %8s\n", "size", "count", "pattern", "raw_us", "raw_algbw",
               "raw_busbw", "moe_us", "moe_busbw", "moe/raw");
    }
    int failures = 0;
    for (long long bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= 2) {
        const long count = (long)(bytes / row_bytes);
        const double size = (double)count * row_bytes, factor = (double)(W - 1) / W;
        for (int pat = 0; pat < 2; pat++) {
            if (!(patterns >> pat & 1)) continue;
            pattern_rows(pat, count, W, b.send_rows);
            long s = 0, r = 0;
            for (int p = 0; p < W; p++) {
                b.recv_rows[p] = b.send_rows[my_rank]; /* every peer sends me what I would send to myself */
                b.sdispl[p] = (int)s, b.rdispl[p] = (int)r;
                s += b.send_rows[p], r += b.recv_rows[p];
            }
            /* one expert per rank: num_tokens_per_expert is the per-peer row count */
            bench_check(moe_dispatch_plan_exchange(b.ep, b.send_rows, NULL, NULL, &b.plan), "moe_dispatch_plan_exchange");
            for (int p = 0; p < W; p++)
                if (b.plan.recv_rows[p] != b.recv_rows[p])
                    fprintf(stderr, "rank %d: plan says %d rows from rank %d, pattern says %d\n", my_rank,
                            b.plan.recv_rows[p], p, b.recv_rows[p]), failures++;

            const timing tm = time_both(&b, &o);
            const double raw_s = tm.median[0], moe_s = tm.median[1];

            /* the moe path delivers the same bytes as MPI_Alltoallv and combine returns what was sent */
            size_t rbytes = (size_t)r * row_bytes, sbytes = (size_t)s * row_bytes;
            if (memcmp(b.raw_recv, b.moe_recv, rbytes) || memcmp(b.back, b.send, sbytes) ||
                memcmp(b.raw_back, b.send, sbytes))
                fprintf(stderr, "rank %d: size %.0f %s: moe rows differ from MPI_Alltoallv's\n", my_rank, size,
                        pat ? "skewed" : "uniform"), failures++;

            if (my_rank == 0) {
                const char *name = pat ? "skewed" : "uniform";
                double raw_alg = size / raw_s * 1e-9, moe_alg = size / moe_s * 1e-9;
                printf(" %12.0f %9ld %8s %10.1f %9.3f %9.3f %10.1f %9.3f %8.3f\n", size, count, name, raw_s * 1e6,
                       raw_alg, raw_alg * factor, moe_s * 1e6, moe_alg * factor, moe_s / raw_s);
                printf("json: {\"bench\":\"alltoall\",\"world\":%d,\"size_bytes\":%.0f,\"count\":%ld,\"row_bytes\":%d,"
                       "\"pattern\":\"%s\",\"warmup\":%d,\"iters\":%d,\"raw_us\":%.3f,\"raw_algbw_gbs\":%.4f,"
                       "\"raw_busbw_gbs\":%.4f,\"moe_us\":%.3f,\"moe_algbw_gbs\":%.4f,\"moe_busbw_gbs\":%.4f,"
                       "\"ratio_moe_raw\":%.4f,\"raw_mean_us\":%.3f,\"moe_mean_us\":%.3f}\n",
                       W, size, count, row_bytes, name, o.warmup, o.iters, raw_s * 1e6, raw_alg, raw_alg * factor,
                       moe_s * 1e6, moe_alg, moe_alg * factor, moe_s / raw_s, tm.mean[0] * 1e6, tm.mean[1] * 1e6);
                fflush(stdout);
            }
        }
    }
    int total = 0;
    MPI_CHECK(MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
    if (my_rank == 0) printf("# validation: %s\n", total ? "FAILED (see stderr)" : "moe rows == MPI_Alltoallv rows, "
                                                                                    "combine returned the sent rows");
    moe_dispatch_plan_free(&b.plan);
    moe_parallel_destroy(par);
    MPI_CHECK(MPI_Type_free(&b.row));
    free(ints), free(b.send), free(b.back), free(b.raw_back), free(b.raw_recv), free(b.staging), free(b.moe_recv);
    MPI_CHECK(MPI_Finalize());
    return total ? 1 : 0;
}
