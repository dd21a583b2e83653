/* test_data.c — the data sets of train/dataloader.h and the order of train/data_order.h, exactly: the permutation is
 * a bijection for many sizes (1, 2, primes, powers of two and their neighbours), the same for the same (seed, epoch)
 * and another for another epoch or seed; windows map to the right shard and offset across uint16 and uint32 shards;
 * a list, patterns and their sorting; a shuffled epoch reads every window once; refusals name the path or the
 * pattern: an empty match, a missing file, a bad header, a short shard, a token outside the vocabulary (with its
 * offset), a shard truncated after it was opened; a token count past 2^31 - 1 (a sparse 8 GiB shard).
 *   meson test -C build test_data */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/fail.h"
#include "models/fileio.h"
#include "tests/test_util.h"
#include "train/data_order.h"
#include "train/dataloader.h"

static char dir[64];

static char *path_in(const char *name) { return moe_path_join(dir, name); }

static void permutation(void) {
    static const int64_t sizes[] = {1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 17, 31, 32, 33, 63, 64, 65, 97, 100, 127, 128,
                                    255, 256, 257, 1000, 1023, 1024, 1025, 4099, 65536, 65537, 100003};
    int tested = 0;
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        const int64_t M = sizes[k];
        unsigned char *seen = malloc((size_t)M);
        int64_t *first = malloc((size_t)M * sizeof(int64_t));
        for (uint64_t seed = 0; seed < 3; seed++)
            for (int64_t epoch = 0; epoch < 3; epoch++) {
                memset(seen, 0, (size_t)M);
                int64_t differs_from_first = 0, moved = 0;
                for (int64_t j = 0; j < M; j++) {
                    const int64_t w = moe_data_permute(seed * 7919, epoch, M, j);
                    CHECK(w >= 0 && w < M, "M %lld: perm(%lld) = %lld outside", (long long)M, (long long)j,
                          (long long)w);
                    if (w < 0 || w >= M) break;
                    CHECK(!seen[w], "M %lld seed %llu epoch %lld: %lld taken twice", (long long)M,
                          (unsigned long long)seed, (long long)epoch, (long long)w);
                    seen[w] = 1;
                    CHECK(w == moe_data_permute(seed * 7919, epoch, M, j), "not a function of (seed, epoch, j)");
                    if (seed == 0 && epoch == 0) first[j] = w;
                    else differs_from_first += first[j] != w;
                    moved += w != j;
                    CHECK(moe_data_window(1, seed * 7919, M, epoch * M + j) == w, "window of a shuffled sequence");
                    CHECK(moe_data_window(0, seed * 7919, M, epoch * M + j) == j, "window of an in-order sequence");
                }
                /* another epoch or seed gives another permutation (for a size with more than a handful) */
                if (M >= 16 && (seed || epoch))
                    CHECK(differs_from_first > 0, "M %lld: seed %llu epoch %lld repeats seed 0 epoch 0's order",
                          (long long)M, (unsigned long long)seed, (long long)epoch);
                if (M >= 16) CHECK(moved > M / 2, "M %lld: only %lld windows moved", (long long)M, (long long)moved);
                tested++;
            }
        free(seen), free(first);
    }
    /* pinned: the order is part of a run's bits, and of docs/DATA.md's "smallest power of four >= M" (mutation testing,
     * 2026-12-08: a domain of 4^(h+1) for M a power of four was still a permutation, another one, and passed) */
    static const int64_t golden16[16] = {4, 12, 6, 10, 3, 0, 7, 14, 9, 15, 5, 11, 13, 1, 8, 2};
    static const int64_t golden64[16] = {2, 59, 31, 22, 48, 4, 32, 40, 33, 7, 11, 46, 6, 23, 45, 9}; /* its first 16 */
    for (int64_t j = 0; j < 16; j++) {
        CHECK(moe_data_permute(1337, 0, 16, j) == golden16[j], "M 16, seed 1337: perm(%lld) = %lld, pinned %lld",
              (long long)j, (long long)moe_data_permute(1337, 0, 16, j), (long long)golden16[j]);
        CHECK(moe_data_permute(1337, 0, 64, j) == golden64[j], "M 64, seed 1337: perm(%lld) = %lld, pinned %lld",
              (long long)j, (long long)moe_data_permute(1337, 0, 64, j), (long long)golden64[j]);
    }
    /* a large M: a sample of the positions lands inside, and distinct */
    const int64_t big = ((int64_t)1 << 40) + 12345;
    int64_t a = moe_data_permute(1, 0, big, 0), b = moe_data_permute(1, 0, big, 1);
    CHECK(a >= 0 && a < big && b >= 0 && b < big && a != b, "M = 2^40 + 12345");
    printf("permutation: a bijection for %d (size, seed, epoch), another per epoch and seed\n", tested);
}

/* Shard files: tokens encode (shard, position) as shard * 10000 + position (the uint32 shard's pass 65535). */
enum { S = 4 };

static char *make_shard(const char *name, int shard, long n, int wide) {
    char *p = path_in(name);
    uint32_t *t32 = malloc((size_t)n * sizeof(uint32_t));
    unsigned short *t16 = malloc((size_t)n * sizeof(unsigned short));
    for (long i = 0; i < n; i++) t32[i] = (uint32_t)(shard * 10000 + i), t16[i] = (unsigned short)t32[i];
    CHECK_OK(wide ? moe_token_file_write_u32(p, t32, n) : moe_token_file_write(p, t16, n));
    free(t32), free(t16);
    return p;
}

static void windows(void) {
    /* floor((N - 1) / S) windows: shard 1 (uint16) 13 tokens -> 3, shard 7 (uint32) 9 -> 2, shard 3 (uint16) 5 -> 1 */
    char *a = make_shard("shard_a.bin", 1, 13, 0), *b = make_shard("shard_b.bin", 7, 9, 1),
         *c = make_shard("shard_c.bin", 3, 5, 0);
    char spec[512];
    snprintf(spec, sizeof spec, "%s/shard_[bc].bin,%s", dir, a); /* a pattern, sorted, then a file */
    moe_token_data *d = NULL;
    CHECK_OK(moe_token_data_open(spec, 80000, S, &d));
    if (!d) return;
    CHECK(moe_token_data_num_shards(d) == 3 && moe_token_data_num_windows(d) == 6, "3 shards, 6 windows: %d, %lld",
          moe_token_data_num_shards(d), (long long)moe_token_data_num_windows(d));
    const int order[3] = {7, 3, 1}; /* b, c (the pattern's matches sorted), then a */
    const int64_t counts[3] = {2, 1, 3}, firsts[3] = {0, 2, 3};
    const int widths[3] = {4, 2, 2};
    for (int i = 0; i < 3; i++) {
        const moe_token_shard s = moe_token_data_shard(d, i);
        CHECK(s.num_windows == counts[i] && s.first_window == firsts[i] && s.width == widths[i],
              "shard %d: %lld windows from %lld, width %d", i, (long long)s.num_windows, (long long)s.first_window,
              s.width);
    }
    int inputs[8 * S], targets[8 * S];
    CHECK_OK(moe_token_data_sequences(d, (moe_data_order){0}, 0, 8, inputs, targets)); /* 6 windows, then 2 wrapped */
    for (int n = 0; n < 8; n++) {
        const int w = n % 6, shard = w < 2 ? 0 : w < 3 ? 1 : 2;
        const int offset = (w - (int)firsts[shard]) * S;
        int where;
        int64_t at;
        moe_token_data_locate(d, w, &where, &at);
        CHECK(where == shard && at == offset, "window %d in shard %d at %lld", w, where, (long long)at);
        for (int i = 0; i < S; i++) {
            CHECK(inputs[n * S + i] == order[shard] * 10000 + offset + i, "sequence %d input %d: %d", n, i,
                  inputs[n * S + i]);
            CHECK(targets[n * S + i] == order[shard] * 10000 + offset + i + 1, "sequence %d target %d: %d", n, i,
                  targets[n * S + i]);
        }
    }
    /* two shuffled epochs: each reads every window once (by its first token), in another order */
    int firsts_seen[2][6];
    for (int e = 0; e < 2; e++) {
        CHECK_OK(moe_token_data_sequences(d, (moe_data_order){1, 42}, 6 * e, 6, inputs, targets));
        int hit[6] = {0};
        for (int n = 0; n < 6; n++) {
            firsts_seen[e][n] = inputs[n * S];
            for (int w = 0; w < 6; w++) {
                const int shard = w < 2 ? 0 : w < 3 ? 1 : 2, offset = (w - (int)firsts[shard]) * S;
                hit[w] += inputs[n * S] == order[shard] * 10000 + offset;
            }
        }
        for (int w = 0; w < 6; w++) CHECK(hit[w] == 1, "epoch %d read window %d %d times", e, w, hit[w]);
    }
    CHECK(memcmp(firsts_seen[0], firsts_seen[1], sizeof firsts_seen[0]) != 0, "epochs 0 and 1 in the same order");
    printf("windows: 3 shards (uint32 and uint16) of 2, 1 and 3 windows, in order, wrapped and shuffled\n");
    /* the identity: the same list again is the same; another order is another */
    moe_token_data *again = NULL, *other = NULL;
    char swapped[512];
    snprintf(swapped, sizeof swapped, "%s,%s/shard_[bc].bin", a, dir);
    CHECK_OK(moe_token_data_open(spec, 80000, S, &again));
    CHECK_OK(moe_token_data_open(swapped, 80000, S, &other));
    if (again && other) {
        CHECK(moe_token_data_identity(again) == moe_token_data_identity(d), "the same list, another identity");
        CHECK(moe_token_data_identity(other) != moe_token_data_identity(d), "another order, the same identity");
    }
    moe_token_data_close(again), moe_token_data_close(other);
    /* a token outside the vocabulary, named with its shard and offset when read */
    moe_token_data *narrow = NULL;
    CHECK_OK(moe_token_data_open(spec, 65536, S, &narrow)); /* opening reads no token */
    if (narrow) {
        CHECK_OK(moe_token_data_sequences(narrow, (moe_data_order){0}, 2, 1, inputs, targets)); /* shard c: fine */
        test_expect_refusal("a uint32 token past the vocabulary", moe_token_data_sequences(narrow, (moe_data_order){0}, 1, 1,
                       inputs, targets), "shard_b.bin: token 70004 at token offset 4 is outside the vocabulary");
    }
    moe_token_data_close(narrow);
    /* a shard truncated after it was opened: a message naming it, no SIGBUS; the other shards still read */
    CHECK(truncate(a, 1024 + 2 * 6) == 0, "truncate");
    test_expect_refusal("a shard truncated while open", moe_token_data_sequences(d, (moe_data_order){0}, 4, 1, inputs,
                   targets), "shard_a.bin: the file ends at 1036 bytes, before tokens 4 to 8");
    CHECK_OK(moe_token_data_sequences(d, (moe_data_order){0}, 0, 3, inputs, targets));
    moe_token_data_close(d);
    free(a), free(b), free(c);
}

/* an empty shard holds no window at any sequence length (the fuzzer, 2026-12-07: -1 at --seq-len 1, so the windows
 * of every shard after it were counted from one too low) */
static void empty_shard(void) {
    char *empty = make_shard("empty.bin", 5, 0, 0), *c = make_shard("shard_c5.bin", 3, 5, 0), spec[512];
    snprintf(spec, sizeof spec, "%s,%s", empty, c);
    moe_token_data *d = NULL;
    CHECK_OK(moe_token_data_open(spec, 80000, 1, &d));
    if (d) {
        const moe_token_shard e = moe_token_data_shard(d, 0), s = moe_token_data_shard(d, 1);
        CHECK(e.num_windows == 0 && s.first_window == 0 && s.num_windows == 4 && moe_token_data_num_windows(d) == 4,
              "an empty shard before one of 5 tokens at --seq-len 1: %lld windows, then %lld from %lld (%lld in all)",
              (long long)e.num_windows, (long long)s.num_windows, (long long)s.first_window,
              (long long)moe_token_data_num_windows(d));
    }
    moe_token_data_close(d);
    test_expect_refusal("an empty shard alone at --seq-len 1", moe_token_data_open(empty, 80000, 1, &d),
                        "only 0 tokens in 1 file(s), fewer than one sequence of 1 + 1");
    free(empty), free(c);
}

static void refusals(void) {
    char spec[512];
    moe_token_data *d = NULL;
    /* a file whose name holds a pattern's character is that file (a probe, 2026-12-07: "no file matches") */
    char *literal = make_shard("shard[1].bin", 0, 9, 0);
    CHECK_OK(moe_token_data_open(literal, 256, S, &d));
    CHECK(d && moe_token_data_num_shards(d) == 1, "shard[1].bin: not opened as itself");
    moe_token_data_close(d), d = NULL, free(literal);
    snprintf(spec, sizeof spec, "%s/none_*.bin", dir);
    test_expect_refusal("an empty pattern", moe_token_data_open(spec, 256, S, &d), "none_*.bin: no file matches");
    snprintf(spec, sizeof spec, "%s/missing.bin", dir);
    test_expect_refusal("a missing file", moe_token_data_open(spec, 256, S, &d), "missing.bin: cannot open");
    char *good = make_shard("good.bin", 0, 9, 0), *bad = path_in("bad.bin"), *tiny = make_shard("tiny.bin", 0, 4, 0);
    FILE *f = fopen(bad, "wb");
    fputs("not a token file, but long enough? no: shorter than a header", f), fclose(f);
    snprintf(spec, sizeof spec, "%s,%s", good, bad);
    test_expect_refusal("a bad shard after a good one", moe_token_data_open(spec, 256, S, &d), "bad.bin: truncated");
    /* a shard shorter than a window (prepare_data.py's last shard may be) holds none: taken, between others and last,
     * and every window is located in the shards that hold it; a data set of no window at all is refused */
    snprintf(spec, sizeof spec, "%s,%s,%s,%s", good, tiny, good, tiny);
    CHECK_OK(moe_token_data_open(spec, 256, S, &d));
    CHECK(moe_token_data_num_shards(d) == 4 && moe_token_data_num_windows(d) == 4,
          "good, tiny, good, tiny: %d shards, %lld windows (want 4, 4)", moe_token_data_num_shards(d),
          (long long)moe_token_data_num_windows(d));
    for (int64_t w = 0; w < moe_token_data_num_windows(d); w++) {
        int shard;
        int64_t offset;
        moe_token_data_locate(d, w, &shard, &offset);
        CHECK(shard == (w < 2 ? 0 : 2) && offset == (w % 2) * S, "window %lld in shard %d at %lld", (long long)w,
              shard, (long long)offset);
    }
    moe_token_data_close(d);
    d = NULL;
    snprintf(spec, sizeof spec, "%s,%s", tiny, tiny);
    test_expect_refusal("only shards shorter than a window", moe_token_data_open(spec, 256, S, &d),
                   "only 8 tokens in 2 file(s), fewer than one sequence of 4 + 1 in each");
    snprintf(spec, sizeof spec, "%s,", good);
    test_expect_refusal("an empty entry", moe_token_data_open(spec, 256, S, &d), "an empty entry");
    CHECK(d == NULL, "a refused data set is NULL");
    free(good), free(bad), free(tiny);
}

/* A uint32 shard of 2^31 + 7 tokens (a sparse file of 8 GiB: its body a hole, every token 0): llm.c's int32 count
 * field read unsigned, the shard's last window read from past 8 GiB. */
static void past_int32_count(void) {
    char *big = path_in("big.bin");
    const uint32_t n = (1u << 31) + 7;
    unsigned char header[1024] = {0};
    const uint32_t fields[3] = {MOE_TOKEN_FILE_MAGIC_U32, MOE_TOKEN_FILE_VERSION_U32, n};
    for (int i = 0; i < 3; i++)
        for (int b = 0; b < 4; b++) header[4 * i + b] = (unsigned char)(fields[i] >> (8 * b));
    FILE *f = fopen(big, "wb");
    CHECK(f && fwrite(header, 1, sizeof header, f) == sizeof header && fclose(f) == 0, "writing %s", big);
    CHECK(truncate(big, 1024 + 4 * (off_t)n) == 0, "making %s sparse", big);
    moe_token_data *d = NULL;
    CHECK_OK(moe_token_data_open(big, 256, S, &d));
    if (d) {
        const int64_t windows = moe_token_data_num_windows(d);
        CHECK(windows == (int64_t)(n - 1) / S, "a shard of %u tokens has %lld windows", n, (long long)windows);
        int inputs[S], targets[S];
        CHECK_OK(moe_token_data_sequences(d, (moe_data_order){0}, windows - 1, 1, inputs, targets));
        CHECK(inputs[0] == 0 && targets[S - 1] == 0, "the hole reads as token 0");
        moe_token_data_close(d);
    }
    unlink(big), free(big);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/moe-data-XXXXXX");
    if (!mkdtemp(dir)) return 1;
    permutation();
    windows();
    empty_shard();
    refusals();
    past_int32_count();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return test_finish("test_data");
}
