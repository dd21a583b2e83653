/* bench_data.c — what reading the training data costs a step (issue 52), with a cold page cache and a warm one,
 * read when the step begins (sync) or on the reading thread while the step before computes (prefetch; what
 * moe-train does, train/batch_reader.h). It writes --shards uint16 shards of --shard-tokens tokens into a fresh
 * directory under /tmp, then for each (cache, mode) runs --steps steps: each reads --batch windows of --seq-len + 1
 * tokens (shuffled across the shards, as --shuffle 1) and then "computes" for --compute-ms (a busy wait standing for
 * the model). Cold: before the run every shard's pages are dropped from the page cache (posix_fadvise DONTNEED on
 * the fsynced files: no privilege needed, nothing else's cache touched; a virtual disk may still be served from the
 * host's cache). It prints the median step time and the median time a step waits for its data, then the same as
 * one JSON line. The directory is removed at the end.
 *   ninja -C build bench/bench_data && build/bench/bench_data --shards 8 --shard-tokens 64M --steps 20 */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/bench_util.h"
#include "train/batch_reader.h"
#include "train/dataloader.h"

typedef struct {
    int shards;
    long long shard_tokens;
    int seq_len, batch, steps;
    double compute_ms;
} options;

static const bench_flag flags[] = {
    BENCH_INT("--shards", options, shards, 1, 4096, "shards written"),
    BENCH_SIZE("--shard-tokens", options, shard_tokens, 1024, 1LL << 31, "tokens per shard (uint16: 2 bytes each)"),
    BENCH_INT("--seq-len", options, seq_len, 1, 1 << 20, "tokens per sequence (a window is one more)"),
    BENCH_INT("--batch", options, batch, 1, 1 << 20, "sequences a step reads"),
    BENCH_INT("--steps", options, steps, 1, 1 << 20, "steps per (cache, mode)"),
    BENCH_REAL("--compute-ms", options, compute_ms, 0, 1e6, "the step's compute, a busy wait"),
};

static void busy_wait_ms(double ms) {
    const double until = bench_now_ms() + ms;
    while (bench_now_ms() < until) {
    }
}

/* Drops the shards' pages from the page cache. */
static void drop_cache(char **paths, int n) {
    for (int i = 0; i < n; i++) {
        const int fd = open(paths[i], O_RDONLY);
        if (fd < 0) bench_fail("%s: cannot open", paths[i]);
        fdatasync(fd);
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
    }
}

int main(int argc, char **argv) {
    options o = {.shards = 4, .shard_tokens = 16LL << 20, .seq_len = 1024, .batch = 16, .steps = 20, .compute_ms = 20};
    const bench_cli cli = {"bench_data", "bench_data [flags]",
                           "step time with the training data read from a cold or a warm page cache, when the step "
                           "begins or while the step before computes",
                           flags, sizeof flags / sizeof *flags, NULL, NULL};
    bench_parse_flags(&cli, argc, argv, &o);
    if ((o.shard_tokens - 1) / o.seq_len < 1) bench_usage_error("--shard-tokens holds no window of --seq-len + 1", NULL);
    char dir[] = "/tmp/bench-data-XXXXXX";
    if (!mkdtemp(dir)) bench_fail("cannot make a directory under /tmp");
    char **paths = calloc((size_t)o.shards, sizeof *paths);
    unsigned short *tokens = malloc((size_t)o.shard_tokens * sizeof(unsigned short));
    if (!paths || !tokens) bench_fail("out of memory");
    for (long long i = 0; i < o.shard_tokens; i++) tokens[i] = (unsigned short)(i * 2654435761u >> 16);
    size_t spec_nbytes = 64;
    for (int s = 0; s < o.shards; s++) {
        paths[s] = malloc(64);
        snprintf(paths[s], 64, "%s/shard_%04d.bin", dir, s);
        bench_check(moe_token_file_write(paths[s], tokens, (long)o.shard_tokens), "writing a shard");
        spec_nbytes += strlen(paths[s]) + 1;
    }
    free(tokens);
    char *spec = malloc(spec_nbytes);
    snprintf(spec, spec_nbytes, "%s/shard_*.bin", dir);
    moe_token_data *d;
    bench_check(moe_token_data_open(spec, 65536, o.seq_len, &d), "opening the shards");
    int *buf[2];
    for (int b = 0; b < 2; b++) buf[b] = malloc(2 * (size_t)o.batch * o.seq_len * sizeof(int));
    double *step_ms = malloc((size_t)o.steps * sizeof(double)), *wait_ms = malloc((size_t)o.steps * sizeof(double));
    const moe_data_order order = {1, 1337};
    double result[2][2][2]; /* [cold][prefetch][step, wait] */
    printf("%d shards of %lld tokens (%.0f MiB), %d windows of %d + 1 tokens a step, %.1f ms of compute a step\n",
           o.shards, o.shard_tokens, o.shards * (double)o.shard_tokens * 2 / (1 << 20), o.batch, o.seq_len,
           o.compute_ms);
    printf("%-6s %-9s %12s %12s\n", "cache", "mode", "step ms", "data wait ms");
    int64_t next_first = 0; /* every run reads windows no run read before: cold stays cold */
    for (int cold = 1; cold >= 0; cold--)
        for (int prefetch = 0; prefetch < 2; prefetch++) {
            if (cold) drop_cache(paths, o.shards);
            else { /* warm: read this run's windows once first */
                for (int s = 0; s < o.steps; s++)
                    bench_check(moe_batch_read(d, order, &(int64_t){next_first + (int64_t)s * o.batch}, NULL, 1,
                                               o.batch, buf[0]), "reading");
            }
            moe_batch_prefetch p = {0};
            int cur = 0;
            for (int s = 0; s < o.steps; s++) {
                const int64_t first = next_first + (int64_t)s * o.batch, next = first + o.batch;
                const double t0 = bench_now_ms();
                if (!prefetch || s == 0)
                    bench_check(moe_batch_read(d, order, &first, NULL, 1, o.batch, buf[cur]), "reading");
                else
                    bench_check(moe_batch_prefetch_wait(&p), "reading on the thread");
                const double t1 = bench_now_ms();
                if (prefetch && s + 1 < o.steps)
                    bench_check(moe_batch_prefetch_start(&p, d, order, &next, NULL, 1, o.batch, buf[1 - cur]),
                                "starting the thread");
                busy_wait_ms(o.compute_ms);
                if (prefetch) cur = 1 - cur;
                step_ms[s] = bench_now_ms() - t0, wait_ms[s] = t1 - t0;
            }
            bench_check(moe_batch_prefetch_wait(&p), "reading on the thread");
            next_first += (int64_t)o.steps * o.batch;
            result[cold][prefetch][0] = bench_median(step_ms, o.steps);
            result[cold][prefetch][1] = bench_median(wait_ms, o.steps);
            printf("%-6s %-9s %12.2f %12.2f\n", cold ? "cold" : "warm", prefetch ? "prefetch" : "sync",
                   result[cold][prefetch][0], result[cold][prefetch][1]);
        }
    printf("{");
    bench_json_flags(&o);
    printf(",\"cold_sync_step_ms\":%.3f,\"cold_prefetch_step_ms\":%.3f,\"warm_sync_step_ms\":%.3f,"
           "\"warm_prefetch_step_ms\":%.3f,\"cold_sync_wait_ms\":%.3f,\"cold_prefetch_wait_ms\":%.3f}\n",
           result[1][0][0], result[1][1][0], result[0][0][0], result[0][1][0], result[1][0][1], result[1][1][1]);
    moe_token_data_close(d);
    for (int s = 0; s < o.shards; s++) unlink(paths[s]), free(paths[s]);
    rmdir(dir);
    free(paths), free(spec), free(buf[0]), free(buf[1]), free(step_ms), free(wait_ms);
    return 0;
}
