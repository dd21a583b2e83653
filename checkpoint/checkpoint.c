/* checkpoint.c — saving and loading checkpoints (layout and format in checkpoint.h): the table of tensors in
 * file order, a save's steps (the tensor files are checkpoint/write.c's, written by every rank), reading the tensor
 * files (each rank reads what it holds). The manifest, listing and pruning are checkpoint/dir.c's; config.json and the
 * fingerprint checkpoint/config.c's. */
#include "checkpoint/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fail.h"
#include "checkpoint/fp8.h"
#include "checkpoint/companions.h"
#include "checkpoint/internal.h"
#include "models/fileio.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/safetensors_shards.h"
#include "checkpoint/json_float.h"

_Static_assert(sizeof(moe_real) == sizeof(float), "checkpoints hold float32 parameters");

/* ---- the tensors of a model, in file order ---------------------------------------------------- */

int moe__checkpoint_stage_of(const moe_checkpoint_run *run, int layer) {
    moe_pipeline_split split = moe_model_stage_of(run->model)->split;
    split.pp = run->ranks.pp_size, split.chunks = moe_model_stage_of(run->model)->chunks;
    return moe_model_pipeline_stage_of(run->config, &split, layer);
}

/* A tensor of the files; a tensor-parallel one (split: its rows or cols are this rank's block, `part` of `parts`)
 * whole. */
static void add(moe__ckpt_table *tab, const char *name, int ndim, long rows, long cols, int expert, int stage,
                long local_offset, moe_tensor_split split, int parts, int part) {
    moe__ckpt_tensor *t = &tab->t[tab->count++];
    const size_t local_count = (size_t)rows * (cols ? cols : 1);
    if (split == MOE_SPLIT_NONE) parts = 1, part = 0;
    rows *= split == MOE_SPLIT_ROWS ? parts : 1;
    cols *= split == MOE_SPLIT_COLS ? parts : 1;
    *t = (moe__ckpt_tensor){.ndim = ndim, .shape = {rows, cols}, .count = (size_t)rows * (cols ? cols : 1),
                            .expert = expert, .stage = stage, .local_offset = local_offset, .split = split,
                            .parts = parts, .part = part, .local_count = local_count};
    snprintf(t->name, sizeof t->name, "%s", name);
}

void moe__ckpt_block_from_whole(const moe__ckpt_tensor *t, const moe_real *whole, moe_real *block) {
    if (t->split != MOE_SPLIT_COLS) { /* whole, or rows: one contiguous range */
        memmove(block, whole + (size_t)t->part * t->local_count, t->local_count * sizeof(moe_real));
        return;
    }
    const size_t rows = (size_t)t->shape[0], w = (size_t)t->shape[1] / t->parts;
    for (size_t r = 0; r < rows; r++) /* memmove: put_tensor cuts the block out in place */
        memmove(block + r * w, whole + r * t->shape[1] + (size_t)t->part * w, w * sizeof(moe_real));
}

void moe__ckpt_whole_from_blocks(const moe__ckpt_tensor *t, const moe_real *blocks, moe_real *whole) {
    if (t->split != MOE_SPLIT_COLS) {
        memcpy(whole, blocks, t->count * sizeof(moe_real));
        return;
    }
    const size_t rows = (size_t)t->shape[0], w = (size_t)t->shape[1] / t->parts;
    for (int p = 0; p < t->parts; p++)
        for (size_t r = 0; r < rows; r++)
            memcpy(whole + r * t->shape[1] + (size_t)p * w, blocks + ((size_t)p * rows + r) * w, w * sizeof(moe_real));
}

int moe__checkpoint_table(const moe_checkpoint_run *run, moe__ckpt_table *tab) {
    const moe_model *m = run->model;
    const moe_model_config *c = run->config;
    const int E = c->moe.num_experts, EL = moe_model_num_local_experts(m), first = run->ranks.ep_rank * EL;
    int count, held;
    moe_model_tensor *mt;
    if (moe_model_whole_tensors(m, &mt, &count) != MOE_OK) return 0;
    const moe_model_tensor *mine = moe_model_tensors(m, &held);
    long *offset = malloc((size_t)(count ? count : 1) * sizeof(long)); /* by whole-table index: here, or -1 */
    tab->t = calloc((size_t)count * E + 1, sizeof(moe__ckpt_tensor));
    if (!tab->t || !offset) return free(mt), free(offset), free(tab->t), tab->t = NULL, 0;
    for (int i = 0; i < count; i++) offset[i] = -1;
    for (int i = 0; i < held; i++) offset[mine[i].index] = (long)mine[i].offset;
    tab->count = 0;
    char name[sizeof tab->t->name];
    for (int layer = -1; layer <= c->num_layers; layer++)
        for (int experts = 0; experts < 2; experts++)
            for (int i = 0; i < count; i++) {
                const moe_model_tensor *t = &mt[i];
                if (t->layer != layer || !t->experts != !experts) continue;
                const int stage = moe__checkpoint_stage_of(run, layer);
                if (!experts) {
                    const int tp = run->ranks.tp_size > 1 ? run->ranks.tp_size : 1;
                    add(tab, t->name, t->ndim, t->rows, t->cols, -1, stage, offset[i], t->split, t->parts,
                        moe_model_tensor_part(t, tp, run->ranks.tp_rank));
                    continue;
                }
                const size_t per_expert = (size_t)t->rows * t->cols;
                for (int j = 0; j < E; j++) {
                    snprintf(name, sizeof name, t->name, j);
                    const long local =
                        offset[i] >= 0 && j >= first && j < first + EL ? (long)(offset[i] + (j - first) * per_expert)
                                                                       : -1;
                    add(tab, name, t->ndim, t->rows, t->cols, j, stage, local, MOE_SPLIT_NONE, 1, 0);
                }
            }
    free(mt), free(offset);
    return 1;
}

/* Every rank agrees on the outcome of a step that only some ranks (or only rank 0) performed. */
static moe_status agree(const moe_checkpoint_run *run, moe_status st) {
    return moe_comm_agree(moe_parallel_world(run->par), st);
}

/* A checkpoint's file work holds the other ranks at its next exchange for as long as the disk takes (any rank's: rank
 * 0's mkdir on a busy disk as much as a rank's tensor files), so each collective function below runs every exchange,
 * on every communicator of the layout (the tensor group's gathers and ZeRO's moment gathers too), under
 * --checkpoint-timeout instead of the exchange watchdog: begin_io sets it and end_io puts the watchdog back and says,
 * on a timeout, which limit it was. */
static double begin_io(const moe_checkpoint_run *run) { return moe_parallel_set_timeout(run->par, run->timeout_s); }

static moe_status end_io(const moe_checkpoint_run *run, double watchdog, moe_status st, const char *what) {
    moe_parallel_set_timeout(run->par, watchdog);
    if (st == MOE_ERR_TIMEOUT)
        return moe_fail_context(st, "%s: a rank did not finish within --checkpoint-timeout %g s", what, run->timeout_s);
    return st;
}

/* ---- writing ---------------------------------------------------------------------------------- */

/* World rank 0: config.json and the manifest, with the configuration this run trained with (what --resume
 * inherits), once every tensor file is whole. */
static moe_status write_config_and_manifest(const moe_checkpoint_run *run, const char *dir, int step) {
    char *path = moe_path_join(dir, moe__checkpoint_files[1]);
    if (!path) return MOE_ERR_OUT_OF_MEMORY;
    json_t *config = moe__checkpoint_config_json(run->config);
    if (run->save_dtype) /* the dtype the weights are stored in, which transformers' torch_dtype="auto" loads as */
        json_object_set_new(config, "torch_dtype", json_string("bfloat16"));
    moe_status st = moe__checkpoint_carry_companions(run->companion_dir, dir, config);
    if (st == MOE_OK && (json_dump_file(config, path, JSON_INDENT(2) | JSON_SORT_KEYS | MOE_JSON_FLOATS) != 0 ||
                         moe_fsync_path(path) != 0))
        st = moe_fail(MOE_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    json_decref(config);
    free(path);
    if (st == MOE_OK)
        st = moe__checkpoint_manifest_write(dir, run->run_id, run->parent_run_id, step, run->run_config(run->owner),
                                            run->run_machine ? run->run_machine(run->owner) : NULL);
    return st;
}

/* Every rank: the step directory written whole under a temporary name (world rank 0 makes it, every rank stores its
 * part of the tensor files, rank 0 adds config.json and the manifest), then published and the run's old ones pruned
 * by rank 0 (checkpoint/dir.c). */
moe_status moe_checkpoint_save(moe_checkpoint_run view, const char *root, int step, int keep_last) {
    const moe_checkpoint_run *run = &view;
    const int rank0 = run->ranks.world_rank == 0;
    const double watchdog = begin_io(run);
    char name[64];
    snprintf(name, sizeof name, ".tmp-step-%08d", step);
    char *tmp = moe_path_join(root, name);
    moe__ckpt_table tab = {0};
    moe_status st = tmp && moe__checkpoint_table(run, &tab) ? MOE_OK : MOE_ERR_OUT_OF_MEMORY;
    if (st == MOE_OK && rank0) {
        if (mkdir(root, 0755) != 0 && errno != EEXIST) /* moe_checkpoint_prepare made it; a caller may not have */
            st = moe_fail(MOE_ERR_IO, "%s: cannot create: %s", root, strerror(errno));
        if (st == MOE_OK) moe__checkpoint_clean_leftovers(root);
        if (st == MOE_OK && mkdir(tmp, 0755) != 0)
            st = errno == EEXIST /* what an interrupted save left, which the clean-up could not remove */
                     ? moe_fail(MOE_ERR_IO, "%s: an interrupted save's leftover that holds more than files (a "
                                "directory): remove it", tmp)
                     : moe_fail(MOE_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    }
    st = agree(run, st);
    char step_text[32], position[32], fingerprint[512];
    snprintf(step_text, sizeof step_text, "%d", step);
    snprintf(position, sizeof position, "%ld", (long)step * run->micro_batches);
    moe__checkpoint_fingerprint(run, fingerprint, sizeof fingerprint);
    /* no run id here: the file stays byte-identical across layouts and runs; the manifest binds it to its run */
    enum { MAX_DATA_META = 16 };
    moe_safetensors_meta state_meta[4 + MAX_DATA_META] = {{"format", "moe-train-state-1"}, {"step", step_text},
                                                          {"micro_batches_done", position}, {"fingerprint", fingerprint}};
    const int num_meta = 4 + (run->data_meta ? run->data_meta(run->owner, step, state_meta + 4, MAX_DATA_META) : 0);
    if (st == MOE_OK) st = moe__checkpoint_write_tensors(run, &tab, tmp, state_meta, num_meta);
    if (st == MOE_OK && rank0) st = write_config_and_manifest(run, tmp, step);
    if (st == MOE_OK && rank0) st = moe__checkpoint_publish(root, tmp, step, run->run_id);
    if (st != MOE_OK && rank0 && tmp) moe__checkpoint_remove_dir(tmp);
    if (st == MOE_OK && rank0) st = moe__checkpoint_prune(root, run->run_id, keep_last);
    free(tmp), free(tab.t);
    return end_io(run, watchdog, agree(run, st), "checkpoint save");
}

int moe_checkpoint_none_yet(const char *root) {
    DIR *d = opendir(root);
    if (!d) return errno == ENOENT;
    int none = 1;
    for (struct dirent *e; none && (e = readdir(d)) != NULL;) { /* step-<digits>: not a step-notes.txt (a review) */
        const char *digits = e->d_name + 5;
        none = strncmp(e->d_name, "step-", 5) || !*digits || strspn(digits, "0123456789") != strlen(digits);
    }
    closedir(d);
    return none;
}

moe_status moe_checkpoint_latest(const char *root, char **out, FILE *notes) {
    *out = NULL;
    moe__checkpoint_entry *list;
    int count;
    moe__checkpoint_skipped skipped;
    MOE_TRY(moe__checkpoint_list(root, &list, &count, notes, &skipped));
    moe_status st = MOE_OK;
    if (skipped.step > (count ? list[count - 1].manifest.step : -1))
        st = moe__checkpoint_refuse_skipped(root, &skipped,
                                            count ? "it is the newest step directory: --resume would go back to an "
                                                    "older step, and the run's saves would reach this one's"
                                                  : "it is the only step directory, so there is no checkpoint to "
                                                    "resume from, and the run's saves would reach its step");
    else if (!count) st = moe_fail(MOE_ERR_IO, "%s: no checkpoint (step-NNNNNNNN) to resume from", root);
    /* the highest step; where that is a bf16 export (not resumable), its run's newest f32 checkpoint, from which the
     * run goes on (continue_run) and saves over its exports' steps again (a probe, 2026-12-07: resume refused the
     * export, and the f32 checkpoint because of the export) */
    int pick = count - 1;
    for (int i = count - 2; st == MOE_OK && list[pick].manifest.is_export && i >= 0; i--)
        if (!strcmp(list[i].manifest.run_id, list[count - 1].manifest.run_id) && !list[i].manifest.is_export) {
            if (notes)
                fprintf(notes, "resume: %s is a bf16 export, which cannot be resumed: resuming %s, its run's newest "
                        "f32 checkpoint (the run saves over the exports after it as it reaches their steps)\n",
                        list[count - 1].path, list[i].path);
            pick = i;
        }
    if (st == MOE_OK && !(*out = strdup(list[pick].path))) st = MOE_ERR_OUT_OF_MEMORY;
    moe__checkpoint_list_free(list, count);
    return st;
}

/* ---- loading ---------------------------------------------------------------------------------- */

/* Where a tensor read from a checkpoint goes: `what` names the values in messages ("the loaded weights"), moment -1
 * is the weights, 0 and 1 the moments. */
typedef struct {
    const moe_checkpoint_run *run;
    const char *what;
    int moment;
    moe__checkpoint_file_layout file; /* the weights' files: RoPE's rows, layers skipped, FP8 blocks (0s: ours) */
} tensor_sink;

/* Whether name is a tensor of a layer the sink skips (model.layers.I. with L <= I < L + extra_layers). */
static int skipped_layer(const tensor_sink *to, const char *name) {
    int layer, at = 0;
    const int L = to->run->config->num_layers, extra = to->file.extra_layers;
    return extra > 0 && sscanf(name, "model.layers.%d.%n", &layer, &at) == 1 && at > 0 && layer >= L &&
           layer < L + extra;
}

/* DeepSeek's checkpoints hold the RoPE part of q (each head's last qk_rope_dim rows of q_proj / q_b_proj) and of k
 * (kv_a_proj_with_mqa's last qk_rope_dim rows) with each rotated pair in adjacent rows (x0, x1), (x2, x3), ...;
 * transformers rotates them in place, which equals rotate-half RoPE (ours) on the rows reordered evens first, then
 * odds (and back: the file's row 2i is ours i, its 2i + 1 ours R/2 + i). The same reordering of q's and k's rows keeps
 * every q.k, so the model computes the same function. */
moe_status moe__checkpoint_reorder_rope_rows(const moe_model_config *c, const moe__ckpt_tensor *t, moe_real *buf,
                                              int to_interleaved) {
    const char *name = t->name;
    const int R = c->qk_rope_dim, hd = moe_model_head_dim(c);
    const size_t cols = (size_t)t->shape[1];
    int heads = 0, stride = 0, first = 0; /* blocks of `stride` rows whose rows [first, first + R) are RoPE's */
    if (strstr(name, "self_attn.q_proj.weight") || strstr(name, "self_attn.q_b_proj.weight"))
        heads = c->num_heads, stride = hd, first = hd - R;
    else if (strstr(name, "self_attn.kv_a_proj_with_mqa.weight"))
        heads = 1, stride = c->kv_lora_rank + R, first = c->kv_lora_rank;
    if (!heads || R < 2 || t->ndim != 2 || (size_t)heads * stride != (size_t)t->shape[0]) return MOE_OK;
    moe_real *pair = malloc((size_t)R * cols * sizeof(moe_real));
    if (!pair) return MOE_ERR_OUT_OF_MEMORY;
    for (int h = 0; h < heads; h++) {
        moe_real *rows = buf + ((size_t)h * stride + first) * cols;
        for (int i = 0; i < R / 2; i++) { /* ours i and R/2 + i, the file's 2i and 2i + 1 */
            const size_t ours[2] = {(size_t)i, (size_t)(R / 2 + i)}, file[2] = {(size_t)(2 * i), (size_t)(2 * i + 1)};
            for (int k = 0; k < 2; k++)
                memcpy(pair + (to_interleaved ? file[k] : ours[k]) * cols,
                       rows + (to_interleaved ? ours[k] : file[k]) * cols, cols * sizeof(moe_real));
        }
        memcpy(rows, pair, (size_t)R * cols * sizeof(moe_real));
    }
    free(pair);
    return MOE_OK;
}

/* One tensor read into buf: finite (second moments >= 0 too), then into this rank's memory (a tensor-parallel one's
 * block of it, moved to buf's start first). */
static moe_status put_tensor(const tensor_sink *to, const moe__ckpt_tensor *t, moe_real *buf) {
    for (size_t j = 0; j < t->count; j++) {
        if (!isfinite(buf[j]))
            return moe_fail(MOE_ERR_NONFINITE, "%s: %s[%zu] is the first NaN or Inf (world rank %d)", to->what, t->name,
                            j, to->run->ranks.world_rank);
        /* a mean of squares: a negative one (valid checksums) would make the next update NaN and blame the weights */
        if (to->moment == 1 && buf[j] < 0)
            return moe_fail(MOE_ERR_BAD_FILE, "exp_avg_sq.%s[%zu] is %g: a second moment is a mean of squares and "
                            "cannot be negative (a corrupt or edited training state)", t->name, j, (double)buf[j]);
    }
    if (t->split != MOE_SPLIT_NONE) moe__ckpt_block_from_whole(t, buf, buf); /* in place: blocks move forward */
    if (to->moment >= 0)
        return to->run->moment_range_set(to->run->owner, to->moment, (size_t)t->local_offset, t->local_count, buf);
    return moe_runtime_upload(moe_model_runtime(to->run->model), moe_model_params(to->run->model) + t->local_offset,
                              buf, t->local_count * sizeof(moe_real));
}

/* A tied model's file that holds lm_head.weight too: 1 when it equals the embedding value for value (of the same
 * shape), as a converter that writes both leaves it (transformers ties it silently: a probe, 2026-12-07, found it
 * refused), so nothing is left to choose; 0 otherwise, or when the two cannot be read. */
static int head_equals_embedding(moe_safetensors_set *set, const char *prefix) {
    char head[160], embed[160];
    snprintf(head, sizeof head, "%slm_head.weight", prefix);
    snprintf(embed, sizeof embed, "%smodel.embed_tokens.weight", prefix);
    moe_safetensors_file *hf = moe_safetensors_set_file(set, head), *ef = moe_safetensors_set_file(set, embed);
    const moe_safetensors_tensor *h = hf ? moe_safetensors_find(hf, head) : NULL;
    const moe_safetensors_tensor *e = ef ? moe_safetensors_find(ef, embed) : NULL;
    if (!h || !e || h->ndim != 2 || e->ndim != 2 || h->shape[0] != e->shape[0] || h->shape[1] != e->shape[1]) return 0;
    const size_t n = (size_t)h->shape[0] * (size_t)h->shape[1];
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    int same = a && b && moe_safetensors_read(hf, head, 2, h->shape, a) == MOE_OK &&
               moe_safetensors_read(ef, embed, 2, e->shape, b) == MOE_OK;
    for (size_t i = 0; i < n && same; i++) same = a[i] == b[i];
    free(a), free(b);
    moe_failure_clear(); /* a read that failed here is the refusal's to explain, not this check's */
    return same;
}

/* Reads the table's tensors (named prefix + name) that this rank holds, one at a time through buf (room for the
 * largest), into their place (put_tensor); checks that every tensor of the table exists with its shape in a dtype
 * the reader converts, and (unless extra_ok) that the files hold no tensor the model does not know. *lossy (may be
 * NULL): 1 when a tensor is stored in less than F32 (BF16, F16). */
static moe_status read_tensors(moe_safetensors_set *set, const char *dir, const moe__ckpt_table *tab, const char *prefix,
                               const tensor_sink *to, moe_real *buf, int extra_ok, int *lossy) {
    char name[160];
    for (int i = 0; i < tab->count; i++) {
        const moe__ckpt_tensor *t = &tab->t[i];
        snprintf(name, sizeof name, "%s%s", prefix, t->name);
        moe_safetensors_file *f = moe_safetensors_set_file(set, name);
        if (!f && set->index.num_shards)
            return moe_fail(MOE_ERR_BAD_FILE, "%s: tensor %s is missing (in no shard of the index)", dir, name);
        if (!f) f = &set->files[0]; /* its read names the missing tensor and the file */
        const moe_safetensors_tensor *stored = moe_safetensors_find(f, name);
        const int fp8 = stored && moe_safetensors_dtype_parse(stored->dtype) == MOE_SAFETENSORS_F8_E4M3;
        moe_real *w = t->local_offset < 0 ? NULL : buf; /* NULL: not this rank's, only checked */
        MOE_TRY(w ? moe_safetensors_read(f, name, t->ndim, t->shape, w)
                  : moe_safetensors_check(f, name, t->ndim, t->shape));
        if (fp8)
            MOE_TRY(moe_fail_context(moe__checkpoint_fp8_scale(set, name, &to->file.fp8, t->ndim, t->shape, w), "%s",
                                     dir));
        if (w && to->file.rope_interleaved) MOE_TRY(moe__checkpoint_reorder_rope_rows(to->run->config, t, w, 0));
        if (w) MOE_TRY(put_tensor(to, t, w));
        if (lossy) *lossy |= strcmp(moe_safetensors_find(f, name)->dtype, "F32") != 0;
    }
    for (int k = 0; k < set->num_files && !extra_ok; k++)
        for (int i = 0; i < set->files[k].num_tensors; i++) {
            const char *have = set->files[k].tensors[i].name;
            char weight[MOE_SAFETENSORS_MAX_NAME]; /* a block scale is known with its weight */
            if (to->file.fp8.rows && moe__checkpoint_fp8_scale_of(have, weight, sizeof weight)) {
                /* a scale beside a weight stored otherwise would go unused (a probe: ignored silently before) */
                moe_safetensors_file *wf = moe_safetensors_set_file(set, weight);
                const moe_safetensors_tensor *wt = wf ? moe_safetensors_find(wf, weight) : NULL;
                if (wt && moe_safetensors_dtype_parse(wt->dtype) != MOE_SAFETENSORS_F8_E4M3)
                    return moe_fail(MOE_ERR_BAD_FILE, "%s: tensor %s is a block scale, but %s is stored as %s, not "
                                    "F8_E4M3: the scale would be ignored", set->files[k].path, have, weight, wt->dtype);
                have = weight;
            }
            int known = moe__checkpoint_is_hf_bias(to->run->config, have) || skipped_layer(to, have);
            for (int j = 0; j < tab->count && !known; j++) {
                snprintf(name, sizeof name, "%s%s", prefix, tab->t[j].name);
                known = !strcmp(name, have);
            }
            if (!known && to->run->config->tie_embeddings && !strcmp(have, "lm_head.weight")) {
                if (head_equals_embedding(set, prefix)) continue;
                return moe_fail(MOE_ERR_BAD_FILE, "%s: unexpected tensor lm_head.weight: config.json says "
                                "tie_word_embeddings true (the head is the embedding), and the file holds a head "
                                "of its own, not equal to it: which one the model computes with is not said",
                                set->files[k].path);
            }
            if (!known)
                return moe_fail(MOE_ERR_BAD_FILE, "%s: unexpected tensor %s (a different model, or wrong names)",
                                set->files[k].path, have);
        }
    return MOE_OK;
}

/* A buffer for the largest tensor of the table (a load's only memory beyond the model's). */
static moe_real *tensor_buffer(const moe__ckpt_table *tab) {
    size_t largest = 1;
    for (int i = 0; i < tab->count; i++) largest = tab->t[i].count > largest ? tab->t[i].count : largest;
    return malloc(largest * sizeof(moe_real));
}

/* Every file the weights come from (the model or its shards and index, config.json) is one the manifest lists. */
static moe_status check_covered(const char *dir, const moe__checkpoint_manifest *m, const moe_safetensors_set *set) {
    MOE_TRY(moe__checkpoint_manifest_covers(dir, m, moe__checkpoint_files[1]));
    for (int i = 0; i < set->num_files; i++) MOE_TRY(moe__checkpoint_manifest_covers(dir, m, set->names[i]));
    return set->index.num_shards ? moe__checkpoint_manifest_covers(dir, m, "model.safetensors.index.json") : MOE_OK;
}

/* The config (with `policy`, the routing policy too: a resumed run continues the saved one), the manifest's files
 * (read by the caller), then the weights (their checksums as they are read), which must be finite. *lossy: 1 when
 * they were stored in less than F32. */
static moe_status load_weights(const moe_checkpoint_run *run, const moe__ckpt_table *tab, const char *dir,
                               const moe__checkpoint_manifest *manifest, int policy, int *lossy) {
    MOE_TRY(moe__checkpoint_check_config(dir, run->config, policy));
    moe_status st = moe__checkpoint_manifest_verify(dir, manifest);
    moe_real *buf = tensor_buffer(tab);
    moe_safetensors_set set;
    if (st == MOE_OK) st = buf ? moe_safetensors_set_open(dir, "model", &set) : MOE_ERR_OUT_OF_MEMORY;
    if (st == MOE_OK) {
        tensor_sink to = {.run = run, .what = "the loaded weights", .moment = -1};
        st = check_covered(dir, manifest, &set);
        if (st == MOE_OK) st = moe__checkpoint_file_layout_read(dir, &to.file);
        if (st == MOE_OK) st = read_tensors(&set, dir, tab, "", &to, buf, 0, lossy);
        moe_safetensors_set_close(&set);
    }
    free(buf);
    return st;
}

/* The routers' selection biases (expert_bias.layers.I, or a DeepSeek-V3's model.layers.I.mlp.gate.
 * e_score_correction_bias) from whichever file of the set holds them, each finite. With `compare`, a DeepSeek-V3's
 * weights on --resume, whose training state gave the biases: compared with those instead (transformers reads the
 * weights' copy, the resumed run the state's: the two must be one). */
static moe_status read_biases(const moe_checkpoint_run *run, const moe_safetensors_set *set, int hf, int compare) {
    const moe_model_config *c = run->config;
    long E = c->moe.num_experts;
    moe_real *other = compare ? malloc((size_t)E * sizeof *other) : NULL;
    if (compare && !other) return MOE_ERR_OUT_OF_MEMORY;
    moe_status st = MOE_OK;
    char name[96];
    for (int l = 0; l < c->num_layers && st == MOE_OK; l++) {
        moe_real *bias = moe_model_expert_bias(run->model, l), *into = compare ? other : bias;
        if (!bias) continue;
        if (hf) moe__checkpoint_hf_bias_name(l, name, sizeof name);
        else snprintf(name, sizeof name, "expert_bias.layers.%d", l);
        moe_safetensors_file *holder = moe_safetensors_set_file(set, name);
        if (!holder) holder = &set->files[0]; /* its read names the missing tensor and the file */
        st = moe_safetensors_read(holder, name, 1, &E, into);
        for (long e = 0; e < E && st == MOE_OK; e++)
            if (!isfinite(into[e]))
                st = moe_fail(MOE_ERR_NONFINITE, "%s: %s[%ld] is %g: a selection bias must be finite", holder->path,
                              name, e, (double)into[e]);
        if (st == MOE_OK && compare && memcmp(other, bias, (size_t)E * sizeof *bias))
            st = moe_fail(MOE_ERR_BAD_FILE, "%s: %s differs from the training state's expert_bias.layers.%d, which the "
                          "run resumes with (an edited checkpoint)", holder->path, name, l);
    }
    free(other);
    return st;
}

/* Sigmoid routing selects by score + bias: the biases are part of the function, kept in the training state (which
 * a --save-dtype bf16 export writes with the biases alone), a file the manifest must list; a DeepSeek-V3 keeps them in
 * its weights too (what transformers reads), and those are read (its own files have no training state). */
static moe_status load_selection_biases(const moe_checkpoint_run *run, const char *dir) {
    if (run->config->moe.score_func != MOE_SCORE_SIGMOID) return MOE_OK;
    const int hf = run->config->family == MOE_MODEL_FAMILY_DEEPSEEK_V3;
    const char *file = hf ? moe__checkpoint_files[0] : moe__checkpoint_files[2];
    moe__checkpoint_manifest manifest;
    moe_safetensors_set set;
    moe_status st = moe__checkpoint_manifest_read(dir, &manifest);
    if (st == MOE_OK) {
        st = hf ? MOE_OK : moe__checkpoint_manifest_covers(dir, &manifest, file); /* the weights': checked with them */
        moe__checkpoint_manifest_free(&manifest);
    }
    if (st == MOE_OK && (st = moe_safetensors_set_open(dir, hf ? "model" : "train_state", &set)) == MOE_OK)
        st = read_biases(run, &set, hf, 0), moe_safetensors_set_close(&set);
    if (st == MOE_OK || st == MOE_ERR_OUT_OF_MEMORY) return st;
    char why[1024];
    snprintf(why, sizeof why, "%s", moe_failure_message(st));
    return moe_fail(st, "sigmoid routing's selection biases are part of the model, kept in %s: %s", file, why);
}

void moe__checkpoint_hf_bias_name(int layer, char *name, size_t n) {
    snprintf(name, n, "model.layers.%d.mlp.gate.e_score_correction_bias", layer);
}

int moe__checkpoint_is_hf_bias(const moe_model_config *c, const char *name) {
    char want[96];
    for (int l = 0; c->family == MOE_MODEL_FAMILY_DEEPSEEK_V3 && l < c->num_layers; l++) {
        moe__checkpoint_hf_bias_name(l, want, sizeof want);
        if (moe_model_layer_is_moe(c, l) && !strcmp(name, want)) return 1;
    }
    return 0;
}

moe_status moe_checkpoint_load_weights(moe_checkpoint_run view, const char *dir) {
    const moe_checkpoint_run *run = &view;
    moe__ckpt_table tab = {0};
    int lossy = 0; /* --init-from takes BF16 and F16 weights: a fresh start, nothing to be exact to */
    const double watchdog = begin_io(run);
    moe__checkpoint_manifest manifest;
    moe_status st = moe__checkpoint_table(run, &tab) ? moe__checkpoint_manifest_read(dir, &manifest) : MOE_ERR_OUT_OF_MEMORY;
    if (st == MOE_OK) {
        st = load_weights(run, &tab, dir, &manifest, 0, &lossy);
        moe__checkpoint_manifest_free(&manifest);
    }
    if (st == MOE_OK) st = load_selection_biases(run, dir);
    free(tab.t);
    return end_io(run, watchdog, agree(run, st), "loading the weights");
}

/* The training state: its file listed by the manifest (whose checksum of its header binds it to the manifest's run),
 * from the step the manifest says. */
static moe_status load_state(const moe_checkpoint_run *run, const moe__ckpt_table *tab, const char *dir,
                             const moe__checkpoint_manifest *manifest, int *step) {
    char want[512];
    char *path = moe_path_join(dir, moe__checkpoint_files[2]);
    if (!path) return MOE_ERR_OUT_OF_MEMORY;
    moe_safetensors_set set;
    moe_status st = moe__checkpoint_manifest_covers(dir, manifest, moe__checkpoint_files[2]);
    if (st == MOE_OK) st = moe_safetensors_set_open(dir, "train_state", &set);
    if (st != MOE_OK) return free(path), st;
    moe_safetensors_file f = set.files[0]; /* metadata and biases: the first (and, as saved, only) file */
    const char *format = moe_safetensors_metadata(&f, "format"), *fp = moe_safetensors_metadata(&f, "fingerprint"),
               *saved = moe_safetensors_metadata(&f, "step");
    moe__checkpoint_fingerprint(run, want, sizeof want);
    if (!format || strcmp(format, "moe-train-state-1"))
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: not a moe-train training state", path);
    else if (!fp || !moe__checkpoint_fingerprint_matches(fp, want))
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: training state from another run: saved for [%s], this run is [%s]", path,
                      fp ? fp : "?", want);
    else
        st = moe__checkpoint_parse_step(saved, path, step);
    if (st == MOE_OK && manifest->step >= 0 && *step != manifest->step)
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: the training state of step %d, in a checkpoint of step %d (manifest.json): "
                      "a file of another step", path, *step, manifest->step);
    if (st == MOE_OK && run->data_restore) st = run->data_restore(run->owner, *step, &f, path);
    moe_real *buf = tensor_buffer(tab);
    if (!buf) st = MOE_ERR_OUT_OF_MEMORY;
    static const char *const which_name[2] = {"the loaded first moments", "the loaded second moments"};
    for (int which = 0; which < 2 && st == MOE_OK; which++) {
        const tensor_sink to = {.run = run, .what = which_name[which], .moment = which};
        st = moe_fail_context(read_tensors(&set, dir, tab, which ? "exp_avg_sq." : "exp_avg.", &to, buf, 1, NULL), "%s",
                              path);
    }
    free(buf);
    if (st == MOE_OK) st = read_biases(run, &set, 0, 0);
    moe_safetensors_set_close(&set);
    free(path);
    if (st == MOE_OK && run->config->family == MOE_MODEL_FAMILY_DEEPSEEK_V3 &&
        run->config->moe.score_func == MOE_SCORE_SIGMOID && (st = moe_safetensors_set_open(dir, "model", &set)) == MOE_OK)
        st = read_biases(run, &set, 1, 1), moe_safetensors_set_close(&set);
    return st;
}

/* dirname of a step directory: where its siblings (and its run's newer checkpoints) live */
static char *parent_of(const char *dir) {
    char *p = strdup(dir);
    if (!p) return NULL;
    for (size_t n = strlen(p); n > 1 && p[n - 1] == '/'; n--) p[n - 1] = 0;
    char *slash = strrchr(p, '/');
    if (!slash) return strcpy(p, ".");
    if (slash == p) slash[1] = 0;
    else *slash = 0;
    return p;
}

/* The run goes on under the checkpoint's run id when the checkpoint is that run's newest in its directory but for its
 * bf16 exports (which it then saves over as it reaches their steps); resumed from an older one it becomes a new run
 * (a fork: parent = that run), so that pruning never deletes the newer checkpoints of the run it left. */
static moe_status continue_run(const moe_checkpoint_run *run, const char *dir, const moe__checkpoint_manifest *m) {
    char *root = parent_of(dir);
    moe__checkpoint_entry *list = NULL;
    int count = 0, newer = 0;
    moe_status st = root ? moe__checkpoint_list(root, &list, &count, NULL, NULL) : MOE_ERR_OUT_OF_MEMORY;
    for (int i = 0; i < count && st == MOE_OK; i++) /* the run's bf16 exports are no state to keep apart from */
        newer += !strcmp(list[i].manifest.run_id, m->run_id) && list[i].manifest.step > m->step &&
                 !list[i].manifest.is_export;
    moe__checkpoint_list_free(list, count);
    free(root);
    if (st != MOE_OK) return st;
    if (!newer && strcmp(m->run_id, "legacy")) {
        snprintf(run->run_id, MOE_RUN_ID_NBYTES, "%s", m->run_id);
        snprintf(run->parent_run_id, MOE_RUN_ID_NBYTES, "%s", m->parent_run_id);
    } else { /* a new run id of this run's own (made when the run began) with the checkpoint's as parent */
        snprintf(run->parent_run_id, MOE_RUN_ID_NBYTES, "%s", m->run_id);
    }
    return MOE_OK;
}

moe_status moe_checkpoint_resume(moe_checkpoint_run view, const char *dir, int *step) {
    const moe_checkpoint_run *run = &view;
    moe__ckpt_table tab = {0};
    moe__checkpoint_manifest manifest = {.files = NULL};
    const double watchdog = begin_io(run);
    moe_status st = moe__checkpoint_table(run, &tab) ? moe__checkpoint_manifest_read(dir, &manifest) : MOE_ERR_OUT_OF_MEMORY;
    int lossy = 0;
    if (st == MOE_OK) st = load_weights(run, &tab, dir, &manifest, 1, &lossy);
    if (st == MOE_OK && lossy)
        st = moe_fail(MOE_ERR_BAD_FILE, "%s holds weights stored in less than F32 (a --save-dtype bf16 export, or "
                      "another tool's checkpoint): resuming needs the run's fp32 masters. Start from these weights with "
                      "--init-from %s (a fresh optimizer), or resume from an f32 checkpoint", dir, dir);
    if (st == MOE_OK) st = load_state(run, &tab, dir, &manifest, step);
    if (st == MOE_OK) st = continue_run(run, dir, &manifest);
    moe__checkpoint_manifest_free(&manifest);
    free(tab.t);
    return end_io(run, watchdog, agree(run, st), "resuming");
}

/* ---- the directory before training ------------------------------------------------------------- */

/* ROOT exists as a directory (made if missing) that this process can write into. */
static moe_status check_writable(const char *root) {
    struct stat sb;
    if (stat(root, &sb) != 0) {
        if (errno != ENOENT) return moe_fail(MOE_ERR_IO, "--checkpoint-dir %s: %s", root, strerror(errno));
        if (mkdir(root, 0755) != 0 && errno != EEXIST) /* EEXIST: another job made it meanwhile */
            return moe_fail(MOE_ERR_IO, "--checkpoint-dir %s: cannot create it: %s", root, strerror(errno));
    } else if (!S_ISDIR(sb.st_mode)) {
        return moe_fail(MOE_ERR_IO, "--checkpoint-dir %s exists and is not a directory", root);
    }
    char name[64];
    snprintf(name, sizeof name, ".write-probe-%ld", (long)getpid()); /* this process's own: no race with another's */
    char *probe = moe_path_join(root, name);
    if (!probe) return MOE_ERR_OUT_OF_MEMORY;
    FILE *f = fopen(probe, "wb");
    const int opened = f != NULL, why = errno;
    moe_status st = opened && fclose(f) == 0 && unlink(probe) == 0
                        ? MOE_OK
                        : moe_fail(MOE_ERR_IO, "--checkpoint-dir %s is not writable: %s", root,
                                   strerror(opened ? errno : why));
    free(probe);
    return st;
}

/* ROOT holds no other run's checkpoints but the parent's, none of another run after resumed_step, and no step
 * directory that cannot be identified after resumed_step (a save reaching it would fail: issue 49). */
static moe_status check_runs(const moe_checkpoint_run *run, const char *root, int resumed_step) {
    moe__checkpoint_entry *list = NULL;
    int count = 0;
    moe__checkpoint_skipped skipped;
    moe_status st = moe__checkpoint_list(root, &list, &count, NULL, &skipped); /* the resume warned of older ones */
    char where[128];
    snprintf(where, sizeof where, "its step is after the one this run starts from (%d), so its saves would reach it",
             resumed_step);
    if (st == MOE_OK && skipped.step > resumed_step) st = moe__checkpoint_refuse_skipped(root, &skipped, where);
    for (int i = count - 1; i >= 0 && st == MOE_OK; i--) { /* newest first: the one to name */
        const moe__checkpoint_manifest *m = &list[i].manifest;
        if (!strcmp(m->run_id, run->run_id)) continue;
        if (strcmp(m->run_id, run->parent_run_id))
            st = moe_fail(MOE_ERR_INVALID_CONFIG,
                          "--checkpoint-dir %s already holds another run's checkpoints (newest: %s, run %s): continue "
                          "it with --resume, or save into another --checkpoint-dir",
                          root, list[i].path, m->run_id);
        else if (m->step > resumed_step)
            st = moe_fail(MOE_ERR_INVALID_CONFIG,
                          "this run resumed run %s at step %d, and --checkpoint-dir %s holds that run's newer "
                          "checkpoint %s (step %d): this run's saves would reach its steps, and a save never replaces "
                          "another run's checkpoint. Save this run into another --checkpoint-dir (or resume the newest "
                          "checkpoint to continue that run)",
                          m->run_id, resumed_step, root, list[i].path, m->step);
    }
    moe__checkpoint_list_free(list, count);
    return st;
}

moe_status moe_checkpoint_prepare(moe_checkpoint_run view, const char *root, int resumed_step,
                                  moe_checkpoint_lock **lock) {
    const moe_checkpoint_run *run = &view;
    *lock = NULL;
    const double watchdog = begin_io(run);
    moe_status st = MOE_OK;
    if (run->ranks.world_rank == 0) {
        st = check_writable(root);
        if (st == MOE_OK) st = moe__checkpoint_lock(root, run->run_id, lock);
        if (st == MOE_OK) st = check_runs(run, root, resumed_step);
    }
    /* saves that a rank here could not load back (a load keeps every shard open): refused now, not at the first save */
    moe__ckpt_table tab = {0};
    const int shards = moe__checkpoint_table(run, &tab) ? moe__checkpoint_model_shards(run, &tab) : -1;
    free(tab.t);
    if (st == MOE_OK)
        st = shards < 0 ? MOE_ERR_OUT_OF_MEMORY : moe_safetensors_room_for_shards(shards, "--save-shard-size");
    st = agree(run, st);
    if (st != MOE_OK) moe_checkpoint_unlock(*lock), *lock = NULL;
    return end_io(run, watchdog, st, "checking --checkpoint-dir");
}
