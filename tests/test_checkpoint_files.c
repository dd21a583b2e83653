/* test_checkpoint_files.c — the parsers of checkpoint and input files against the bad bytes of issue 12,
 * without MPI:
 *  - a saved step is digits only, 0 to INT_MAX ("-1", "abc", "99999999999", " 5", "+5", "5x" refused);
 *  - safetensors: a round trip; a flipped data byte names the corrupt tensor (its CRC-32C); a checksum
 *    removed while the others stay is refused; overlapping data_offsets, a gap and trailing bytes are refused;
 *  - a FIFO or a directory given as a safetensors file, a token file, a routing trace or a config.json is
 *    refused at once with what it is (a FIFO used to block in fopen forever: an alarm guards the test);
 *  - config.json without num_hidden_layers, or with a tie_word_embeddings that is not a boolean, is refused by name;
 *  - paths of any length are joined whole;
 *  - dtypes: BF16 written rounded to nearest even and read back exactly, a finite value that would round to Inf in
 *    bf16 refused at save; F16 (hand-made file) read exactly, subnormal 2^-24 included, Inf and NaN passed through
 *    for the loader's finite check; an unsupported dtype and a tensor named twice in a header refused;
 *  - shards: written (greedy split, index) and read back through the index; refused: a missing shard, an index
 *    naming a tensor its shard lacks, a tensor in two shards, a truncated shard, both a single file and an index,
 *    a shard name outside the directory, a duplicate key in the index;
 *  - token files: uint32 tokens (magic 20240801, version 7) past 65536 load exactly, a token >= vocab is refused
 *    by value and position, a wrong version for the magic and a truncated file are refused; uint16 files still load;
 *  - byte counts for --save-shard-size: 5GB, 500MiB, plain digits; 0, spaces, units alone, overflow refused. */
#define _GNU_SOURCE /* memmem */
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fail.h"
#include "checkpoint/internal.h"
#include "train/dataloader.h"
#include "models/fileio.h"
#include "train/routing_trace.h"
#include "kernels/cast.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/safetensors_shards.h"
#include "tests/test_util.h"

static char dir[64];

static char *path_in(const char *name) { return moe_path_join(dir, name); }

static void saved_steps(void) {
    const char *good[] = {"0", "12", "2147483647"};
    const int value[] = {0, 12, 2147483647};
    for (int i = 0; i < 3; i++) {
        int step = -1;
        CHECK(moe__checkpoint_parse_step(good[i], "f", &step) == MOE_OK && step == value[i], "step '%s'", good[i]);
    }
    const char *bad[] = {"", "-1", "-5", "abc", "99999999999", "2147483648", " 5", "+5", "5x", "1e3"};
    for (int i = 0; i < 10; i++) {
        int step = 7;
        moe_status st = moe__checkpoint_parse_step(bad[i], "train_state.safetensors", &step);
        CHECK(st == MOE_ERR_BAD_FILE && step == 7, "step '%s' accepted (%d)", bad[i], step);
    }
    int step = 7;
    CHECK(moe__checkpoint_parse_step(NULL, "f", &step) == MOE_ERR_BAD_FILE, "a missing step accepted");
}

static long read_all(const char *path, char **data) {
    FILE *f = fopen(path, "rb");
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    *data = malloc((size_t)n);
    if (fread(*data, 1, (size_t)n, f) != (size_t)n) n = -1;
    fclose(f);
    return n;
}

/* A copy of `from` with the first `old` replaced by `new` (same length) or, old NULL, byte `at` flipped. */
static char *edited(const char *from, const char *name, const char *old, const char *new, long at) {
    char *data, *path = path_in(name);
    long n = read_all(from, &data);
    if (old) {
        char *hit = memmem(data, (size_t)n, old, strlen(old));
        CHECK(hit != NULL, "'%s' not in %s", old, from);
        if (hit) memcpy(hit, new, strlen(new));
    } else {
        data[n + at] ^= 0x10; /* at < 0: from the end, in the data section */
    }
    FILE *f = fopen(path, "wb");
    fwrite(data, 1, (size_t)n, f);
    fclose(f);
    free(data);
    return path;
}

static moe_status read_both(const char *path) {
    moe_safetensors_file f;
    MOE_TRY(moe_safetensors_open(path, &f));
    float out[4];
    const long shape[1] = {4};
    moe_status st = moe_safetensors_read(&f, "a", 1, shape, out);
    if (st == MOE_OK) st = moe_safetensors_read(&f, "b", 1, shape, out);
    moe_safetensors_close(&f);
    return st;
}

static void safetensors(void) {
    const float a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8};
    const moe_safetensors_entry e[2] = {{"a", 1, {4}, a, MOE_SAFETENSORS_F32}, {"b", 1, {4}, b, MOE_SAFETENSORS_F32}};
    char *good = path_in("good.safetensors");
    CHECK_OK(moe_safetensors_write(good, e, 2, NULL, 0));
    CHECK_OK(read_both(good));
    char *flipped = edited(good, "flipped.safetensors", NULL, NULL, -3); /* a byte of b, the last tensor */
    test_expect_refusal("a flipped data byte", read_both(flipped), "tensor b is corrupt");
    char *unchecked = edited(good, "unchecked.safetensors", "crc32c:b", "crc32x:b", 0);
    test_expect_refusal("one checksum removed", read_both(unchecked), "tensor b has no checksum although");
    char *overlap = edited(good, "overlap.safetensors", "[16,32]", "[12,28]", 0);
    test_expect_refusal("overlapping data_offsets", read_both(overlap), "tensors a and b overlap");
    /* bytes that belong to no tensor, after them or between them (the format packs them; a probe, 2026-12-07) */
    char *trailing = path_in("trailing.safetensors"), *gap = edited(good, "gap.safetensors", "[16,32]", "[20,36]", 0);
    const char four[4] = {0};
    char *paths[2] = {trailing, gap};
    for (int i = 0; i < 2; i++) {
        char *data;
        const long n = read_all(i == 0 ? good : gap, &data);
        FILE *f = fopen(paths[i], "wb");
        fwrite(data, 1, (size_t)n, f), fwrite(four, 1, sizeof four, f);
        fclose(f);
        free(data);
    }
    test_expect_refusal("4 bytes after the last tensor", read_both(trailing),
                        "4 bytes after the last tensor's data belong to no tensor");
    test_expect_refusal("a gap of 4 bytes", read_both(gap), "4 bytes of data before tensor b belong to no tensor");
    free(good), free(flipped), free(unchecked), free(overlap), free(trailing), free(gap);
}

/* A safetensors file of one tensor "t" of `count` 2-byte values with the given dtype, written by hand. */
static char *hand_made(const char *name, const char *dtype, const uint16_t *values, int count) {
    char header[256], *path = path_in(name);
    int n = snprintf(header, sizeof header, "{\"t\":{\"dtype\":\"%s\",\"shape\":[%d],\"data_offsets\":[0,%d]}}", dtype,
                     count, 2 * count);
    while (n % 8) header[n++] = ' ';
    FILE *f = fopen(path, "wb");
    unsigned char size_le[8] = {(unsigned char)n};
    fwrite(size_le, 1, 8, f), fwrite(header, 1, (size_t)n, f);
    for (int i = 0; i < count; i++) fputc(values[i] & 255, f), fputc(values[i] >> 8, f);
    fclose(f);
    return path;
}

static moe_status read_t(const char *path, int count, float *out) {
    moe_safetensors_file f;
    MOE_TRY(moe_safetensors_open(path, &f));
    const long shape[1] = {count};
    moe_status st = moe_safetensors_read(&f, "t", 1, shape, out);
    moe_safetensors_close(&f);
    return st;
}

static void dtypes(void) {
    /* BF16: rounded to nearest even on the way out, read back exactly */
    const float x[5] = {1.0f, -2.5f, 1.00390625f /* 1 + 2^-8: a tie, to even 1 */, 3.0e-39f /* subnormal */, 1e30f};
    const moe_safetensors_entry e[1] = {{"t", 1, {5}, x, MOE_SAFETENSORS_BF16}};
    char *bf16 = path_in("bf16.safetensors");
    CHECK_OK(moe_safetensors_write(bf16, e, 1, NULL, 0));
    float back[5];
    CHECK_OK(read_t(bf16, 5, back));
    for (int i = 0; i < 5; i++)
        CHECK(back[i] == moe_bf16_round(x[i]), "bf16 value %d: %g read back as %g, want %g", i, x[i], back[i],
              moe_bf16_round(x[i]));
    CHECK(back[2] == 1.0f, "1 + 2^-8 rounds to 1 (ties to even)");
    const float huge[1] = {3.4e38f}; /* above the largest bf16 (3.3895e38): rounds to Inf */
    const moe_safetensors_entry h[1] = {{"big", 1, {1}, huge, MOE_SAFETENSORS_BF16}};
    char *overflow = path_in("overflow.safetensors");
    test_expect_refusal("a value past the largest bf16", moe_safetensors_write(overflow, h, 1, NULL, 0),
                   "big[0] = 3.4e+38 does not fit in bf16");
    /* F16 by hand: 1, -2, 2^-24 (the smallest subnormal), 65504, then +Inf and NaN */
    const uint16_t half[6] = {0x3C00, 0xC000, 0x0001, 0x7BFF, 0x7C00, 0x7E00};
    char *f16 = hand_made("f16.safetensors", "F16", half, 6);
    float got[6];
    CHECK_OK(read_t(f16, 6, got));
    CHECK(got[0] == 1 && got[1] == -2 && got[2] == ldexpf(1, -24) && got[3] == 65504, "f16 values: %g %g %g %g",
          got[0], got[1], got[2], got[3]);
    CHECK(isinf(got[4]) && isnan(got[5]), "f16 Inf and NaN pass through to the finite check (%g, %g)", got[4], got[5]);
    char *bf16_by_hand = hand_made("bf16hand.safetensors", "BF16", (const uint16_t[]){0x3F80, 0x0001}, 2);
    CHECK_OK(read_t(bf16_by_hand, 2, got));
    CHECK(got[0] == 1 && got[1] == ldexpf(1, -133), "bf16 by hand: %g %g", got[0], got[1]);
    char *i16 = hand_made("i16.safetensors", "I16", half, 6);
    test_expect_refusal("dtype I16", read_t(i16, 6, got), "has dtype I16; supported are F32, BF16, F16 and F8_E4M3");
    /* a header naming "t" twice (JSON allows it; a reader that keeps either would load the wrong bytes) */
    char *twice = path_in("twice.safetensors");
    const char header[] = "{\"t\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4]},"
                          "\"t\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[4,8]}}";
    FILE *f = fopen(twice, "wb");
    unsigned char size_le[8] = {(unsigned char)(sizeof header - 1)};
    fwrite(size_le, 1, 8, f), fwrite(header, 1, sizeof header - 1, f), fwrite(half, 2, 4, f);
    fclose(f);
    test_expect_refusal("a tensor named twice in a header", read_t(twice, 2, back), "duplicate object key");
    free(bf16), free(overflow), free(f16), free(bf16_by_hand), free(i16), free(twice);
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    fputs(text, f);
    fclose(f);
}

/* Opens the set in `sub` and reads a, b, c; returns the first failure. */
static moe_status read_set(const char *sub) {
    char *d = path_in(sub);
    moe_safetensors_set set;
    moe_status st = moe_safetensors_set_open(d, "model", &set);
    free(d);
    if (st != MOE_OK) return st;
    const char *names[3] = {"a", "b", "c"};
    const long shape[1] = {4};
    for (int i = 0; i < 3 && st == MOE_OK; i++) {
        float out[4];
        moe_safetensors_file *f = moe_safetensors_set_file(&set, names[i]);
        st = f ? moe_safetensors_read(f, names[i], 1, shape, out) : moe_fail(MOE_ERR_BAD_FILE, "%s missing", names[i]);
        CHECK(st != MOE_OK || out[0] == (float)(4 * i + 1), "tensor %s read as %g", names[i], out[0]);
    }
    moe_safetensors_set_close(&set);
    return st;
}

/* A fresh copy of the sharded directory "shards" as `sub`. */
static char *copy_shards(const char *sub) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s/%s' && cp -r '%s/shards' '%s/%s'", dir, sub, dir, dir, sub);
    CHECK(system(cmd) == 0, "%s", cmd);
    return path_in(sub);
}

static void shards(void) {
    const float a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8}, c[4] = {9, 10, 11, 12};
    const moe_safetensors_entry e[3] = {{"a", 1, {4}, a, MOE_SAFETENSORS_F32}, {"b", 1, {4}, b, MOE_SAFETENSORS_F32},
                                        {"c", 1, {4}, c, MOE_SAFETENSORS_F32}};
    char *d = path_in("shards"), *one = path_in("one");
    mkdir(d, 0700), mkdir(one, 0700);
    int files = 0;
    CHECK_OK(moe_safetensors_write_shards(d, "model", e, 3, NULL, 0, 40, &files)); /* a+b = 32 bytes, then c */
    CHECK(files == 3, "2 shards and the index: %d files", files);
    CHECK_OK(read_set("shards"));
    CHECK_OK(moe_safetensors_write_shards(one, "model", e, 3, NULL, 0, 48, &files));
    CHECK(files == 1, "everything in one shard is one model.safetensors: %d files", files);
    CHECK_OK(read_set("one"));
    char *s1 = path_in("shards/model-00001-of-00002.safetensors"), *s2 = path_in("shards/model-00002-of-00002.safetensors");
    CHECK(access(s1, F_OK) == 0 && access(s2, F_OK) == 0, "shard files named as transformers names them");
    free(copy_shards("missing"));
    char *p = path_in("missing/model-00002-of-00002.safetensors");
    unlink(p), free(p);
    test_expect_refusal("a missing shard", read_set("missing"), "shard model-00002-of-00002.safetensors (one of the 2 that");
    free(copy_shards("extra"));
    p = path_in("extra/model.safetensors.index.json");
    write_text(p, "{\"metadata\":{},\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\",\"b\":"
                  "\"model-00001-of-00002.safetensors\",\"c\":\"model-00002-of-00002.safetensors\",\"d\":"
                  "\"model-00002-of-00002.safetensors\"}}");
    free(p);
    test_expect_refusal("an index naming a missing tensor", read_set("extra"), "names tensor d in");
    free(copy_shards("twice"));
    p = path_in("twice/model-00002-of-00002.safetensors");
    const moe_safetensors_entry ca[2] = {e[0], e[2]};
    CHECK_OK(moe_safetensors_write(p, ca, 2, NULL, 0));
    free(p);
    test_expect_refusal("a tensor in two shards", read_set("twice"), "holds tensor a, which the index");
    free(copy_shards("truncated"));
    p = path_in("truncated/model-00001-of-00002.safetensors");
    CHECK(truncate(p, 60) == 0, "truncate");
    free(p);
    test_expect_refusal("a truncated shard", read_set("truncated"), "truncated");
    free(copy_shards("both"));
    p = path_in("both/model.safetensors");
    CHECK_OK(moe_safetensors_write(p, e, 3, NULL, 0));
    free(p);
    test_expect_refusal("a single file and an index", read_set("both"), "which one is the model");
    free(copy_shards("outside"));
    p = path_in("outside/model.safetensors.index.json");
    write_text(p, "{\"weight_map\":{\"a\":\"../one/model.safetensors\"}}");
    test_expect_refusal("a shard outside the directory", read_set("outside"), "must be a file name ending in .safetensors");
    write_text(p, "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\",\"a\":\"model-00002-of-00002.safetensors\"}}");
    test_expect_refusal("a duplicate key in the index", read_set("outside"), "duplicate");
    write_text(p, "[1, 2]");
    test_expect_refusal("an index that is not an object", read_set("outside"), "needs a non-empty \"weight_map\"");
    free(p), free(d), free(one), free(s1), free(s2);
}

/* The first window's S + 1 = 3 tokens of a data set, or its refusal. */
static moe_status first_window(const char *path, int vocab, int *tokens) {
    moe_token_data *d;
    MOE_TRY(moe_token_data_open(path, vocab, 2, &d));
    int inputs[2], targets[2];
    moe_status st = moe_token_data_sequences(d, (moe_data_order){0}, 0, 1, inputs, targets);
    if (st == MOE_OK) tokens[0] = inputs[0], tokens[1] = inputs[1], tokens[2] = targets[1];
    moe_token_data_close(d);
    return st;
}

static void token_files(void) {
    const uint32_t wide[6] = {70000, 0, 65535, 65536, 12, 4000000000u};
    char *u32 = path_in("u32.bin"), *u16 = path_in("u16.bin");
    int got[3];
    CHECK_OK(moe_token_file_write_u32(u32, wide, 5)); /* without 4e9 */
    CHECK_OK(first_window(u32, 70001, got));
    for (int i = 0; i < 3; i++) CHECK((uint32_t)got[i] == wide[i], "token %d: %d", i, got[i]);
    test_expect_refusal("a uint32 token past the vocabulary", first_window(u32, 70000, got),
                   "token 70000 at token offset 0 is outside the vocabulary (size 70000)");
    CHECK_OK(moe_token_file_write_u32(u32, wide + 3, 3)); /* 65536, 12, 4e9 */
    test_expect_refusal("a token of 4e9 (past INT_MAX)", first_window(u32, 2147483647, got),
                   "u32.bin: token 4000000000 at token offset 2 is outside");
    CHECK_OK(moe_token_file_write_u32(u32, wide, 6));
    char *v1 = path_in("u32v1.bin");
    CHECK_OK(moe_token_file_write_u32(v1, wide, 5));
    FILE *f = fopen(v1, "r+b");
    fseek(f, 4, SEEK_SET), fputc(1, f), fclose(f); /* version 1 with the uint32 magic */
    test_expect_refusal("uint32 magic, version 1", first_window(v1, 70001, got),
                   "unsupported version 1 for magic 20240801 (expected 7)");
    CHECK(truncate(u32, 1024 + 4 * 6 - 2) == 0, "truncate");
    test_expect_refusal("a truncated uint32 file", first_window(u32, 70001, got),
                   "announces 6 tokens but the file holds 22 bytes of uint32 tokens");
    const unsigned short narrow[4] = {1, 65535, 7, 0};
    CHECK_OK(moe_token_file_write(u16, narrow, 4));
    CHECK_OK(first_window(u16, 65536, got));
    CHECK(got[1] == 65535 && got[2] == 7, "uint16 tokens");
    free(u32), free(u16), free(v1);
}

static void byte_counts(void) {
    const char *good[] = {"5GB", "500MiB", "1048576", "1KB", "2TiB", "7B"};
    const long long value[] = {5000000000LL, 500LL << 20, 1048576, 1000, 2LL << 40, 7};
    for (int i = 0; i < 6; i++) {
        long long n = -1;
        CHECK(moe_parse_nbytes(good[i], &n) == 0 && n == value[i], "'%s' read as %lld", good[i], n);
    }
    const char *bad[] = {"", "0", "0GB", "5 GB", "GB", "-1", "5gb", "1.5GB", "99999999999999999999", "5000000TB", "5GBB"};
    for (int i = 0; i < 11; i++) {
        long long n = 0;
        CHECK(moe_parse_nbytes(bad[i], &n) != 0, "'%s' accepted as %lld", bad[i], n);
    }
}

static void not_regular_files(void) {
    char *fifo = path_in("fifo"), *folder = path_in("folder");
    CHECK(mkfifo(fifo, 0600) == 0 && mkdir(folder, 0700) == 0, "mkfifo/mkdir");
    alarm(20); /* a hang is a failure, not a stuck test */
    const char *paths[2] = {fifo, folder}, *kinds[2] = {"is a FIFO (named pipe)", "is a directory"};
    for (int i = 0; i < 2; i++) {
        moe_safetensors_file f;
        moe_token_data *tokens;
        moe_routing_trace trace;
        test_expect_refusal("safetensors", moe_safetensors_open(paths[i], &f), kinds[i]);
        test_expect_refusal("token file", moe_token_data_open(paths[i], 256, 16, &tokens), kinds[i]);
        test_expect_refusal("routing trace", moe_routing_trace_open(&trace, paths[i], 8, 2, 2, 16, 1), kinds[i]);
    }
    /* config.json as a FIFO, in a checkpoint directory */
    char *ckpt = path_in("ckpt"), *config;
    CHECK(mkdir(ckpt, 0700) == 0, "mkdir");
    config = moe_path_join(ckpt, "config.json");
    CHECK(mkfifo(config, 0600) == 0, "mkfifo");
    moe_model_config c = moe_model_config_default();
    test_expect_refusal("config.json", moe__checkpoint_check_config(ckpt, &c, 1), "is a FIFO (named pipe)");
    alarm(0);
    free(fifo), free(folder), free(ckpt), free(config);
}

/* config.json of the default model with one key edited (value NULL: removed), checked against that model. */
static moe_status check_edited_config(const char *key, json_t *value) {
    moe_model_config c = moe_model_config_default();
    char *ckpt = path_in("edited"), *path;
    mkdir(ckpt, 0700);
    path = moe_path_join(ckpt, "config.json");
    json_t *j = moe__checkpoint_config_json(&c);
    if (value) json_object_set_new(j, key, value);
    else json_object_del(j, key);
    CHECK(json_dump_file(j, path, 0) == 0, "writing %s", path);
    json_decref(j);
    moe_status st = moe__checkpoint_check_config(ckpt, &c, 1);
    free(ckpt), free(path);
    return st;
}

static void config_keys(void) {
    CHECK_OK(check_edited_config("unused_key", json_true())); /* the unedited config passes */
    test_expect_refusal("config.json without num_hidden_layers", check_edited_config("num_hidden_layers", NULL),
                   "num_hidden_layers is missing");
    test_expect_refusal("tie_word_embeddings \"yes\"", check_edited_config("tie_word_embeddings", json_string("yes")),
                   "tie_word_embeddings must be true or false");
}

static void long_paths(void) {
    char *deep = malloc(3001);
    memset(deep, 'd', 3000);
    deep[3000] = 0;
    char *joined = moe_path_join(deep, "step-00000001");
    CHECK(joined && strlen(joined) == 3000 + 1 + 13 && !strcmp(joined + 3001, "step-00000001"), "a long path was cut");
    free(deep), free(joined);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/moe-files-XXXXXX");
    if (!mkdtemp(dir)) return 1;
    saved_steps();
    safetensors();
    not_regular_files();
    config_keys();
    long_paths();
    dtypes();
    shards();
    byte_counts();
    token_files();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return test_finish("test_checkpoint_files");
}
