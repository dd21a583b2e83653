/* train/checkpoint_run.c — a trainer's view for checkpoints (train/checkpoint_run.h).
 *   from train/trainer.h: the moments by range (ZeRO's gathers inside), the data position;  from train/config.h: the
 *   options as JSON;  from train/dataloader.h: the data set's identity */
#include "train/checkpoint_run.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "core/fail.h"
#include "train/config.h"
#include "train/machine.h"

static moe_status moment_range(void *owner, int which, size_t offset, size_t count, moe_real *dst) {
    return moe_trainer_moment_range(owner, which, offset, count, dst);
}

static moe_status moment_range_set(void *owner, int which, size_t offset, size_t count, const moe_real *src) {
    return moe_trainer_moment_range_set(owner, which, offset, count, src);
}

/* as decided, not "auto": the record --resume continues exactly */
static json_t *run_config(const void *owner) {
    return moe_train_options_json(&((const moe_trainer *)owner)->opt, 0);
}

static json_t *run_machine(const void *owner) {
    (void)owner;
    return moe_run_machine_json();
}

/* The data metadata's keys, in the order data_meta writes them. */
enum { D_SHUFFLE, D_SEED, D_WINDOWS_DONE, D_EPOCH, D_INDEX, D_NUM_SHARDS, D_NUM_WINDOWS, D_IDENTITY, D_SHARD_HASHES,
       D_SHARD_CONTENTS, D_COUNT };
static const char *const data_keys[D_COUNT] = {"data_shuffle", "data_seed", "data_windows_done", "data_epoch",
                                              "data_index", "data_num_shards", "data_num_windows", "data_identity",
                                              "data_shard_hashes", "data_shard_contents"};
/* beside them, the trainer's other count: the AdamW updates applied (moe_trainer's optimizer_updates) */
static const char kUpdatesKey[] = "optimizer_updates";

/* The saved data position after `step`: the global window counter where step + 1 begins, as (epoch, index) of this
 * data set too, with the set's identity (each shard's hash of its basename and token count, 16 hex digits each). */
static int data_meta(void *owner, int step, moe_safetensors_meta *meta, int max) {
    moe_trainer *t = owner;
    const int n = moe_token_data_num_shards(t->train);
    const int64_t done = moe_trainer_first_sequence(t, step + 1, 0), M = moe_token_data_num_windows(t->train);
    if (max < D_COUNT + 1) return 0;
    free(t->data_meta_text);
    const size_t fixed = 24 * D_COUNT, nbytes = fixed + 2 * 17 * (size_t)n + 1;
    if (!(t->data_meta_text = malloc(nbytes))) return 0; /* the metadata is then missing: a resume says so */
    char *at = t->data_meta_text, *end = at + nbytes;
    char *value[D_COUNT];
    const int64_t numbers[D_IDENTITY] = {t->order.shuffle, (int64_t)t->order.seed, done, done / M, done % M, n, M};
    for (int k = 0; k < D_IDENTITY; k++) value[k] = at, at += snprintf(at, (size_t)(end - at), "%" PRId64, numbers[k]) + 1;
    value[D_IDENTITY] = at;
    at += snprintf(at, (size_t)(end - at), "%016" PRIx64, moe_token_data_identity(t->train)) + 1;
    for (int k = D_SHARD_HASHES; k <= D_SHARD_CONTENTS; k++) { /* each shard's identity, then its content's hash */
        value[k] = at;
        *at = 0;
        for (int i = 0; i < n; i++) {
            const moe_token_shard s = moe_token_data_shard(t->train, i);
            at += snprintf(at, (size_t)(end - at), "%s%016" PRIx64, i ? "," : "", k == D_SHARD_HASHES ? s.hash
                                                                                                   : s.content);
        }
        at++; /* past the list's terminating zero */
    }
    for (int k = 0; k < D_COUNT; k++) meta[k] = (moe_safetensors_meta){data_keys[k], value[k]};
    snprintf(at, (size_t)(end - at), "%" PRId64, t->optimizer_updates);
    meta[D_COUNT] = (moe_safetensors_meta){kUpdatesKey, at};
    return D_COUNT + 1;
}

/* The saved value of key: 0 with *out set; 1 when the state has no such key (saved before it was written); -1 when it
 * is not a whole number in int64's range (a damaged or edited state). */
static int saved_number(const moe_safetensors_file *state, const char *key, int64_t *out) {
    const char *text = moe_safetensors_metadata(state, key);
    if (!text) return 1;
    char *end = NULL;
    errno = 0;
    const long long v = strtoll(text, &end, 10);
    if (end == text || *end || errno == ERANGE || isspace((unsigned char)*text)) return -1;
    *out = v;
    return 0;
}

/* Every number the data position is saved as is one or absent: a damaged value is refused by name, never read as a
 * checkpoint from before data positions. */
static moe_status check_saved_numbers(const moe_safetensors_file *state, const char *path) {
    const char *keys[D_IDENTITY + 2] = {"micro_batches_done", kUpdatesKey};
    for (int k = 0; k < D_IDENTITY; k++) keys[k + 2] = data_keys[k];
    for (int k = 0; k < D_IDENTITY + 2; k++) {
        int64_t v;
        if (saved_number(state, keys[k], &v) < 0)
            return moe_fail(MOE_ERR_BAD_FILE, "%s: %s '%s' is not a whole number within 2^63 (a damaged training "
                            "state)", path, keys[k], moe_safetensors_metadata(state, keys[k]));
    }
    return MOE_OK;
}

/* What differs between the saved data set and this run's, as a phrase into why ("" when nothing differs that the
 * checkpoint records). */
static void data_differences(const moe_trainer *t, const moe_safetensors_file *state, int64_t shuffle, char *why,
                             size_t nbytes) {
    const moe_token_data *d = t->train;
    const int n = moe_token_data_num_shards(d);
    const int64_t M = moe_token_data_num_windows(d);
    int64_t saved_shards = -1, saved_windows = -1;
    const char *hashes = moe_safetensors_metadata(state, data_keys[D_SHARD_HASHES]),
               *contents = moe_safetensors_metadata(state, data_keys[D_SHARD_CONTENTS]); /* NULL before 2026-12-07 */
    size_t at = 0;
    *why = 0;
#define SAY(...) (at += (size_t)snprintf(why + at, at < nbytes ? nbytes - at : 0, __VA_ARGS__), at = at < nbytes ? at : nbytes)
    if (shuffle != t->order.shuffle)
        SAY("--shuffle was %" PRId64 ", now %d; ", shuffle, t->order.shuffle);
    if (saved_number(state, data_keys[D_NUM_SHARDS], &saved_shards) != 0 || !hashes) return; /* an older checkpoint */
    saved_number(state, data_keys[D_NUM_WINDOWS], &saved_windows);
    if (saved_shards != n) SAY("the list had %" PRId64 " shards, now %d; ", saved_shards, n);
    for (int i = 0; i < n && i < saved_shards; i++) {
        char mine[17];
        snprintf(mine, sizeof mine, "%016" PRIx64, moe_token_data_shard(d, i).hash);
        const char *theirs = hashes + (size_t)17 * i;
        if (strlen(hashes) < (size_t)17 * i + 16 || strncmp(theirs, mine, 16)) {
            const moe_token_shard s = moe_token_data_shard(d, i);
            SAY("shard %d (now %s, %" PRId64 " tokens) is not the saved list's shard %d (another file name or token "
                "count); ", i + 1, s.path, s.num_tokens, i + 1);
            break;
        }
        snprintf(mine, sizeof mine, "%016" PRIx64, moe_token_data_shard(d, i).content);
        if (contents && (strlen(contents) < (size_t)17 * i + 16 || strncmp(contents + (size_t)17 * i, mine, 16))) {
            SAY("shard %d (now %s) holds other tokens than the saved list's shard of that name and size (its first or "
                "last 4 KiB differ); ", i + 1, moe_token_data_shard(d, i).path);
            break;
        }
    }
    if (!*why && saved_windows != M) SAY("the data set had %" PRId64 " windows, now %" PRId64 "; ", saved_windows, M);
#undef SAY
    if (at >= 2 && why[at - 2] == ';') why[at - 2] = 0;
}

/* Takes the saved data position; refuses a changed data set unless --allow-data-change 1. */
static moe_status data_restore(void *owner, int step, const moe_safetensors_file *state, const char *path) {
    moe_trainer *t = owner;
    MOE_TRY(check_saved_numbers(state, path));
    int64_t updates;
    if (saved_number(state, kUpdatesKey, &updates) != 0) updates = step; /* saved before the count: each step updated */
    if (updates < 0 || updates > step)
        return moe_fail(MOE_ERR_BAD_FILE, "%s: %s %" PRId64 " is not between 0 and the step %d (a damaged training "
                        "state)", path, kUpdatesKey, updates, step);
    t->optimizer_updates = updates;
    if (!t->train) return MOE_OK; /* --eval-only: no training data, no position to continue */
    int64_t done, shuffle = 0, micro_done;
    if (saved_number(state, data_keys[D_WINDOWS_DONE], &done) != 0) { /* a checkpoint from before data positions */
        if (saved_number(state, "micro_batches_done", &micro_done) != 0) micro_done = (int64_t)step * t->opt.micro_batches;
        done = micro_done * t->opt.batch;
    } else if (saved_number(state, data_keys[D_SHUFFLE], &shuffle) != 0) {
        return moe_fail(MOE_ERR_BAD_FILE, "%s: data_windows_done without data_shuffle: a damaged training state", path);
    }
    if (done < 0) return moe_fail(MOE_ERR_BAD_FILE, "%s: data_windows_done %" PRId64 " is negative", path, done);
    if (done > INT64_MAX / 2) /* the run's reads count on from it: no room left (steps x batch < 2^62) */
        return moe_fail(MOE_ERR_BAD_FILE, "%s: data_windows_done %" PRId64 " is beyond any run's (a damaged training "
                        "state)", path, done);
    char why[768];
    data_differences(t, state, shuffle, why, sizeof why);
    const int64_t M = moe_token_data_num_windows(t->train);
    if (*why && !t->opt.allow_data_change)
        return moe_fail(MOE_ERR_BAD_FILE, "%s: the training data differs from the checkpoint's: %s. Give the run's "
                        "--train-data and --shuffle, or --allow-data-change 1 to continue at window counter %" PRId64
                        " over the new data set", path, why, done);
    t->data_windows_done = done, t->data_step = step;
    t->data_note[0] = 0;
    int64_t listed;
    if (saved_number(state, data_keys[D_NUM_SHARDS], &listed) != 0)
        snprintf(t->data_note, sizeof t->data_note, "note: %s records no data set identity (saved before data "
                 "positions were): the shard list is not checked; continuing at window counter %" PRId64, path, done);
    if (*why)
        snprintf(t->data_note, sizeof t->data_note, "note: the training data differs from the checkpoint's (%s); "
                 "--allow-data-change 1: continuing at window counter %" PRId64 " (epoch %" PRId64 ", window %" PRId64
                 " of %" PRId64 ") in the new data set's %s", why, done, done / M, done % M, M,
                 t->order.shuffle ? "permutation" : "order");
    return MOE_OK;
}

moe_checkpoint_run moe_trainer_checkpoint_run(moe_trainer *t) {
    const moe_train_options *o = &t->opt;
    return (moe_checkpoint_run){.model = t->model, .par = t->par, .ranks = t->ranks, .config = &o->model,
                                .batch = o->batch, .micro_batches = o->micro_batches, .seed = o->seed,
                                .save_dtype = o->save_dtype, .save_shard_nbytes = o->save_shard_nbytes,
                                .timeout_s = o->checkpoint_timeout_s, .run_id = t->run_id,
                                .parent_run_id = t->parent_run_id,
                                .companion_dir = *t->source_dir ? t->source_dir : NULL,
                                .notes = t->notes, .owner = t,
                                .moments_sharded = o->zero > 0, .moment_range = moment_range,
                                .moment_range_set = moment_range_set, .run_config = run_config,
                                .run_machine = run_machine, .data_meta = data_meta, .data_restore = data_restore};
}
