/* bench_allreduce.c — the fixed-tree all-reduce (moe_comm_allreduce_tree_real on the MPI transport) against raw
 * MPI_Allreduce, at the sizes of a model's gradient buffer.
 *
 * Under mpirun -np W (a power of two), for counts of floats from the table 1e3, 1e4, 1e5, 1e6, 4e6, 1.6e7 that lie
 * in [--min-count, --max-count], it times (a) mpi: one blocking MPI_Allreduce(MPI_IN_PLACE, MPI_FLOAT, MPI_SUM)
 * (Open MPI's own algorithm and order), (b) tree-hd: the tree all-reduce by reduce-scatter (recursive halving) +
 * all-gather (recursive doubling), (c) tree-rd: the tree all-reduce by recursive doubling of the whole buffer.
 * Every iteration starts from the same input (restored untimed), then MPI_Barrier, then the timed call; the time
 * of an iteration is its slowest rank's, and the table shows the median over --iters iterations after --warmup
 * untimed ones. algbw = 4 count / time, busbw = algbw * 2 (W-1) / W (nccl-tests' all-reduce factor), in GB/s.
 * "auto" names the algorithm the library's default picks at that size (tree_allreduce.h). After timing, the
 * two tree results must be bitwise equal to each other and to rank 0's (checked; exit 1 otherwise); "mpi_diff"
 * is the share of elements where MPI_Allreduce's bits differ from the tree's (information: its order is not
 * the tree's). Inputs: mixed magnitudes, (1 + u) 2^e with e in [-20, 20], seeded by rank. Table on rank 0,
 * then one "json: {...}" line per size.
 *
 *   meson setup build --buildtype=release && ninja -C build bench/bench_allreduce
 *   source scripts/mpi_env.sh && mpirun -np 4 build/bench/bench_allreduce \
 *       [--min-count 100000 --max-count 16000000 --warmup 2 --iters 10 --timeout 300]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alltoall/comm_mpi.h"
#include "alltoall/tree_allreduce.h" /* white box: which algorithm the default picks */
#include "bench/bench_util_mpi.h"
#include "core/rng.h"

typedef struct {
    long long min_count, max_count;
    int warmup, iters;
    double timeout_s;
} options;

static const bench_flag kFlags[] = {
    BENCH_SIZE("--min-count", options, min_count, 1, 1LL << 28, "smallest count of floats timed"),
    BENCH_SIZE("--max-count", options, max_count, 1, 1LL << 28, "largest count of floats timed"),
    BENCH_INT("--warmup", options, warmup, 0, 100000, "untimed iterations per size and method"),
    BENCH_INT("--iters", options, iters, 1, 100000, "timed iterations per size and method (median reported)"),
    BENCH_REAL("--timeout", options, timeout_s, 1, 86400, "seconds before a stuck exchange aborts the job"),
};

static void check(const void *opt) {
    const options *o = opt;
    if (o->max_count < o->min_count) bench_usage_error("--max-count must be at least --min-count", NULL);
}

static const bench_cli kCli = {
    .name = "bench_allreduce",
    .synopsis = "mpirun -np W bench_allreduce [flags]",
    .about = "the fixed-tree all-reduce (halving + doubling, recursive doubling) against MPI_Allreduce",
    .flags = kFlags,
    .num_flags = sizeof kFlags / sizeof kFlags[0],
    .notes = "counts take a K, M or G suffix (powers of 1024); the sizes timed are those of the table\n"
             "1e3 1e4 1e5 1e6 4e6 1.6e7 within [--min-count, --max-count]",
    .check = check,
};

static const long kCounts[] = {1000, 10000, 100000, 1000000, 4000000, 16000000};
enum { METHOD_MPI, METHOD_TREE_HD, METHOD_TREE_RD, METHODS };
static const char *const kMethodNames[METHODS] = {"mpi", "tree-hd", "tree-rd"};

typedef struct {
    moe_comm *c;
    float *input, *buf;
    long count;
} bench;

static void run_once(bench *b, int method) {
    if (method == METHOD_MPI) {
        MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, b->buf, (int)b->count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
        return;
    }
    moe_comm_set_tree_algorithm(b->c,
                                method == METHOD_TREE_HD ? MOE_TREE_HALVING_DOUBLING : MOE_TREE_RECURSIVE_DOUBLING);
    bench_check(moe_comm_allreduce_tree_real(b->c, b->buf, (size_t)b->count), "moe_comm_allreduce_tree_real");
}

/* Median over iterations of the slowest rank's seconds per call; times[iters] is scratch. */
static double time_method(bench *b, int method, const options *o, double *times, double *slowest) {
    for (int i = 0; i < o->warmup + o->iters; i++) {
        memcpy(b->buf, b->input, (size_t)b->count * sizeof(float));
        MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
        const double t0 = MPI_Wtime();
        run_once(b, method);
        if (i >= o->warmup) times[i - o->warmup] = MPI_Wtime() - t0;
    }
    MPI_CHECK(MPI_Allreduce(times, slowest, o->iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
    return bench_median(slowest, o->iters);
}

int main(int argc, char **argv) {
    int W;
    const int my_rank = bench_mpi_init(&argc, &argv, kCli.name, &W);
    options o = {.min_count = 100000, .max_count = 16000000, .warmup = 2, .iters = 10, .timeout_s = 300};
    bench_parse_flags(&kCli, argc, argv, &o);
    if (W & (W - 1)) bench_fail("the tree all-reduce needs a power-of-two number of ranks, not %d", W);

    MPI_Comm dup;
    MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &dup));
    bench b = {0};
    bench_check(moe_comm_create_mpi(dup, "world", o.timeout_s, &b.c), "moe_comm_create_mpi");
    long max_count = 0;
    for (size_t k = 0; k < sizeof kCounts / sizeof kCounts[0]; k++)
        if (kCounts[k] >= o.min_count && kCounts[k] <= o.max_count) max_count = kCounts[k];
    if (!max_count) bench_usage_error("no size of the table lies within [--min-count, --max-count]", NULL);
    const size_t max_nbytes = (size_t)max_count * sizeof(float);
    float *results[METHODS];
    b.input = malloc(max_nbytes), b.buf = malloc(max_nbytes);
    for (int m = 0; m < METHODS; m++) results[m] = malloc(max_nbytes);
    float *root = malloc(max_nbytes);
    double *times = malloc(2 * (size_t)o.iters * sizeof(double));
    if (!b.input || !b.buf || !root || !times || !results[0] || !results[1] || !results[2])
        bench_fail("out of memory (%zu bytes a buffer)", max_nbytes);
    moe_rng rng = moe_rng_seeded(1000 + (uint64_t)my_rank);
    for (long i = 0; i < max_count; i++) { /* moe_rng_uniform: [-1, 1) */
        const double u = (moe_rng_uniform(&rng) + 1) / 2, e = floor((moe_rng_uniform(&rng) + 1) / 2 * 41) - 20;
        b.input[i] = (float)((moe_rng_uniform(&rng) < 0 ? -1 : 1) * ldexp(1 + u, (int)e));
    }

    if (my_rank == 0) {
        printf("# bench_allreduce: W=%d warmup=%d iters=%d timeout=%gs transport=%s\n", W, o.warmup, o.iters,
               o.timeout_s, moe_comm_transport_name(b.c));
        printf("# time = median over iterations of the slowest rank, us; busbw = 4 count / time * 2(W-1)/W, GB/s;\n"
               "# mpi_diff = share of elements where MPI_Allreduce's bits differ from the tree's\n");
        printf("#%9s %9s %11s %11s %11s %9s %9s %9s %8s %8s %9s\n", "count", "auto", "mpi_us", "tree_hd_us",
               "tree_rd_us", "mpi_bus", "hd_bus", "rd_bus", "hd/mpi", "rd/mpi", "mpi_diff");
    }
    int failures = 0;
    for (size_t k = 0; k < sizeof kCounts / sizeof kCounts[0]; k++) {
        b.count = kCounts[k];
        if (b.count < o.min_count || b.count > o.max_count) continue;
        const size_t nbytes = (size_t)b.count * sizeof(float);
        double median_s[METHODS];
        for (int m = 0; m < METHODS; m++) {
            median_s[m] = time_method(&b, m, &o, times, times + o.iters);
            memcpy(results[m], b.buf, nbytes); /* the last timed call's result, from the same input */
        }
        /* the two tree algorithms agree bitwise, and every rank holds rank 0's bits */
        memcpy(root, results[METHOD_TREE_HD], nbytes);
        MPI_CHECK(MPI_Bcast(root, (int)b.count, MPI_FLOAT, 0, MPI_COMM_WORLD));
        if (memcmp(results[METHOD_TREE_HD], results[METHOD_TREE_RD], nbytes) ||
            memcmp(results[METHOD_TREE_HD], root, nbytes))
            fprintf(stderr, "rank %d: count %ld: the tree results differ between algorithms or from rank 0's\n",
                    my_rank, b.count), failures++;
        long mpi_diff = 0;
        for (long i = 0; i < b.count; i++)
            mpi_diff += memcmp(&results[METHOD_MPI][i], &results[METHOD_TREE_HD][i], sizeof(float)) != 0;
        if (my_rank == 0) {
            const double factor = 2.0 * (W - 1) / W, bytes = (double)nbytes;
            double bus[METHODS];
            for (int m = 0; m < METHODS; m++) bus[m] = bytes / median_s[m] * 1e-9 * factor;
            moe_comm_set_tree_algorithm(b.c, MOE_TREE_AUTO);
            const int rd = moe__tree_algorithm_for(b.c, (size_t)b.count, sizeof(float)) == MOE_TREE_RECURSIVE_DOUBLING;
            const char *pick = kMethodNames[rd ? METHOD_TREE_RD : METHOD_TREE_HD];
            printf(" %9ld %9s %11.1f %11.1f %11.1f %9.3f %9.3f %9.3f %8.3f %8.3f %8.2f%%\n", b.count, pick,
                   median_s[0] * 1e6, median_s[1] * 1e6, median_s[2] * 1e6, bus[0], bus[1], bus[2],
                   median_s[1] / median_s[0], median_s[2] / median_s[0], 100.0 * mpi_diff / b.count);
            printf("json: {\"bench\":\"allreduce\",\"world\":%d,\"count\":%ld,\"warmup\":%d,\"iters\":%d,"
                   "\"auto\":\"%s\",\"mpi_us\":%.3f,\"tree_hd_us\":%.3f,\"tree_rd_us\":%.3f,\"mpi_busbw_gbs\":%.4f,"
                   "\"tree_hd_busbw_gbs\":%.4f,\"tree_rd_busbw_gbs\":%.4f,\"mpi_diff_share\":%.6f}\n",
                   W, b.count, o.warmup, o.iters, pick, median_s[0] * 1e6, median_s[1] * 1e6, median_s[2] * 1e6,
                   bus[0], bus[1], bus[2], (double)mpi_diff / b.count);
            fflush(stdout);
        }
    }
    int total = 0;
    MPI_CHECK(MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
    if (my_rank == 0)
        printf("# validation: %s\n",
               total ? "FAILED (see stderr)" : "both tree algorithms gave rank 0's bits on every rank");
    moe_comm_destroy(b.c);
    for (int m = 0; m < METHODS; m++) free(results[m]);
    free(b.input), free(b.buf), free(root), free(times);
    MPI_CHECK(MPI_Finalize());
    return total ? 1 : 0;
}
