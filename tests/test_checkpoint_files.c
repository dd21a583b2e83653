/* test_checkpoint_files.c — the parsers of checkpoint and input files against the bad bytes of issue 12,
 * without MPI:
 *  - a saved step is digits only, 0 to INT_MAX ("-1", "abc", "99999999999", " 5", "+5", "5x" refused);
 *  - safetensors: a round trip; a flipped data byte names the corrupt tensor (its CRC-32C); a checksum
 *    removed while the others stay is refused; overlapping data_offsets are refused;
 *  - a FIFO or a directory given as a safetensors file, a token file, a routing trace or a config.json is
 *    refused at once with what it is (a FIFO used to block in fopen forever: an alarm guards the test);
 *  - config.json without num_hidden_layers, or with a tie_word_embeddings that is not a boolean, is refused by name;
 *  - paths of any length are joined whole. */
#define _GNU_SOURCE /* memmem */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fail.h"
#include "models/checkpoint_internal.h"
#include "models/dataloader.h"
#include "models/fileio.h"
#include "models/routing_trace.h"
#include "models/safetensors.h"
#include "tests/test_util.h"

static char dir[64];

static char *path_in(const char *name) { return moe_path_join(dir, name); }

/* st must fail with a message containing expect. */
static void expect_refusal(const char *what, moe_status st, const char *expect) {
    CHECK(st != MOE_OK, "%s: accepted", what);
    if (st == MOE_OK) return;
    CHECK(strstr(moe_failure_message(st), expect) != NULL, "%s: message '%s' lacks '%s'", what,
          moe_failure_message(st), expect);
    printf("%-34s refused: %s\n", what, moe_failure_message(st));
}

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
    const moe_safetensors_entry e[2] = {{"a", 1, {4}, a}, {"b", 1, {4}, b}};
    char *good = path_in("good.safetensors");
    CHECK_OK(moe_safetensors_write(good, e, 2, NULL, 0));
    CHECK_OK(read_both(good));
    char *flipped = edited(good, "flipped.safetensors", NULL, NULL, -3); /* a byte of b, the last tensor */
    expect_refusal("a flipped data byte", read_both(flipped), "tensor b is corrupt");
    char *unchecked = edited(good, "unchecked.safetensors", "crc32c:b", "crc32x:b", 0);
    expect_refusal("one checksum removed", read_both(unchecked), "tensor b has no checksum although");
    char *overlap = edited(good, "overlap.safetensors", "[16,32]", "[12,28]", 0);
    expect_refusal("overlapping data_offsets", read_both(overlap), "tensors a and b overlap");
    free(good), free(flipped), free(unchecked), free(overlap);
}

static void not_regular_files(void) {
    char *fifo = path_in("fifo"), *folder = path_in("folder");
    CHECK(mkfifo(fifo, 0600) == 0 && mkdir(folder, 0700) == 0, "mkfifo/mkdir");
    alarm(20); /* a hang is a failure, not a stuck test */
    const char *paths[2] = {fifo, folder}, *kinds[2] = {"is a FIFO (named pipe)", "is a directory"};
    for (int i = 0; i < 2; i++) {
        moe_safetensors_file f;
        moe_token_file tokens;
        moe_routing_trace trace;
        expect_refusal("safetensors", moe_safetensors_open(paths[i], &f), kinds[i]);
        expect_refusal("token file", moe_token_file_load(paths[i], 256, 16, &tokens), kinds[i]);
        expect_refusal("routing trace", moe_routing_trace_open(&trace, paths[i], 8, 2, 2, 16, 1), kinds[i]);
    }
    /* config.json as a FIFO, in a checkpoint directory */
    char *ckpt = path_in("ckpt"), *config;
    CHECK(mkdir(ckpt, 0700) == 0, "mkdir");
    config = moe_path_join(ckpt, "config.json");
    CHECK(mkfifo(config, 0600) == 0, "mkfifo");
    moe_model_config c = moe_model_config_default();
    expect_refusal("config.json", moe__checkpoint_check_config(ckpt, &c), "is a FIFO (named pipe)");
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
    moe_status st = moe__checkpoint_check_config(ckpt, &c);
    free(ckpt), free(path);
    return st;
}

static void config_keys(void) {
    CHECK_OK(check_edited_config("unused_key", json_true())); /* the unedited config passes */
    expect_refusal("config.json without num_hidden_layers", check_edited_config("num_hidden_layers", NULL),
                   "num_hidden_layers is missing");
    expect_refusal("tie_word_embeddings \"yes\"", check_edited_config("tie_word_embeddings", json_string("yes")),
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
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return test_finish("test_checkpoint_files");
}
