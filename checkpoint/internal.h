/* checkpoint/internal.h — for checkpoint/'s own .c files only: the pieces of a checkpoint beside the tensors.
 *   checkpoint/config.c  config.json, the run's fingerprint, the saved step
 *   checkpoint.c         the table of a model's tensors in file order (what saving and loading walk)
 *   checkpoint/write.c   a step's tensor files, written by every rank at once
 *   checkpoint/dir.c     the manifest of a step directory, listing, latest, durable publication, pruning
 *   checkpoint/lock.c    one job at a time on a checkpoint directory */
#ifndef MOE_CHECKPOINT_INTERNAL_H
#define MOE_CHECKPOINT_INTERNAL_H

#include <jansson.h>
#include <stdio.h>

#include "checkpoint/checkpoint.h"
#include "checkpoint/fp8.h"
#include "checkpoint/safetensors.h"

/* ---- checkpoint/config.c ---- */
json_t *moe__checkpoint_config_json(const moe_model_config *c);
/* Compares the architecture in DIR/config.json with the model; names the first field that differs. */
moe_status moe__checkpoint_check_config(const char *dir, const moe_model_config *c, int policy);
/* Everything that must match to continue a run: the architecture, routing, data order and seed. */
void moe__checkpoint_fingerprint(const moe_checkpoint_run *run, char *out, size_t n);
/* 1 when a training state's saved fingerprint continues the run whose fingerprint is want (an older form included). */
int moe__checkpoint_fingerprint_matches(const char *saved, const char *want);
/* A saved step: digits only, 0 to INT_MAX; anything else is MOE_ERR_BAD_FILE naming path. */
moe_status moe__checkpoint_parse_step(const char *text, const char *path, int *step);

/* How DIR's weight files hold the model beyond its tensors' names and shapes, from its config.json (read once). */
typedef struct {
    int rope_interleaved; /* RoPE's rows in DeepSeek's interleaved order: a DeepSeek-V3's file with rope_interleave
                             true or absent (transformers' default), or any DeepSeek-V2's (always interleaved) */
    int extra_layers;     /* a DeepSeek-V3's num_nextn_predict_layers: its multi-token prediction modules, stored as
                             layers L, L + 1, ..., skipped on load as transformers skips them */
    moe_fp8_blocks fp8;   /* quantization_config's blocks of F8_E4M3 tensors (checkpoint/fp8.h; 0, 0: none) */
} moe__checkpoint_file_layout;
/* A quantization_config that cannot be read (another method, format or block shape) is refused naming the key. */
moe_status moe__checkpoint_file_layout_read(const char *dir, moe__checkpoint_file_layout *out);

/* ---- checkpoint.c: the tensors of a model, in file order ---- */
/* A DeepSeek-V3's selection bias of MoE layer `layer` in its weights: "model.layers.L.mlp.gate.e_score_correction_bias"
 * (written beside the weights for that family, checkpoint/write.c); whether name is one of c's. */
void moe__checkpoint_hf_bias_name(int layer, char *name, size_t n);
int moe__checkpoint_is_hf_bias(const moe_model_config *c, const char *name);

typedef struct {
    char name[112];
    int ndim;
    long shape[2];
    size_t count;      /* elements */
    int expert;        /* global expert id, or -1 for a dense tensor */
    int stage;         /* the pipeline stage that holds it (models/model.h's moe_model_pipeline_stage_of) */
    long local_offset; /* in this rank's buffer [dense | local experts] (and its moments'), -1 if another rank holds it */
    /* a tensor-parallel one (models/model.h's split, ROWS or COLS): this rank holds block `part` of `parts` along it,
     * local_count values at local_offset; the file holds the whole tensor (shape and count above) */
    int split, parts, part;
    size_t local_count;
} moe__ckpt_tensor;

/* DeepSeek's interleaved RoPE rows (moe__checkpoint_file_layout) and rotate-half's, in place on the whole tensor
 * t in buf: to_interleaved 0 reorders a file's rows for the model (on load), 1 the model's for a file (on save, a
 * DeepSeek-V2's). A tensor without RoPE rows is left as it is. */
moe_status moe__checkpoint_reorder_rope_rows(const moe_model_config *c, const moe__ckpt_tensor *t, moe_real *buf,
                                              int to_interleaved);

/* The tensor-parallel block of t that this rank holds, from the whole tensor in whole (row-major) into block, and back
 * (checkpoint.c). */
void moe__ckpt_block_from_whole(const moe__ckpt_tensor *t, const moe_real *whole, moe_real *block);
void moe__ckpt_whole_from_blocks(const moe__ckpt_tensor *t, const moe_real *blocks, moe_real *whole);

typedef struct {
    moe__ckpt_tensor *t; /* malloc'ed */
    int count;
} moe__ckpt_table;

/* Every tensor of the whole model, wherever it is held (another pipeline stage, another EP rank): the embedding,
 * then each layer's dense tensors followed by its experts (every w1, then every w3, then every w2, by global id), then
 * the final norm and lm_head. 0 when out of memory. */
int moe__checkpoint_table(const moe_checkpoint_run *run, moe__ckpt_table *tab);

/* ---- checkpoint/write.c ---- */
/* The tensor files of a step directory DIR (made by the caller): model.safetensors (or its shards and index, by
 * --save-shard-size) and train_state.safetensors with state_meta, written by every rank at once, each tensor by one
 * rank that holds it, byte for byte what one process would write. Non-finite values are refused (the writer names
 * the tensor). Collective, under the caller's timeout (the checkpoint's). DIR must be on a file system every rank
 * sees (checked: else MOE_ERR_IO naming the rank and host). */
moe_status moe__checkpoint_write_tensors(const moe_checkpoint_run *run, const moe__ckpt_table *tab, const char *dir,
                                         const moe_safetensors_meta *state_meta, int num_state_meta);
/* The files model.safetensors is saved in at the run's --save-shard-size (its shards; 1: one file); -1 when out of
 * memory. */
int moe__checkpoint_model_shards(const moe_checkpoint_run *run, const moe__ckpt_table *tab);

/* ---- checkpoint/dir.c ---- */
enum { MOE__CHECKPOINT_FILES = 3 };
extern const char *const moe__checkpoint_files[MOE__CHECKPOINT_FILES]; /* model, config, train state */

/* What a file's checksum in the manifest covers: nothing (a manifest older than the checksums), the whole file
 * (every file but the safetensors ones), or a safetensors file's header, which holds the CRC-32C of each tensor's
 * bytes (checked as they are read): so the manifest binds every byte of the directory. */
enum { MOE__CRC_NONE = 0, MOE__CRC_WHOLE, MOE__CRC_HEADER };

typedef struct {
    char name[256];  /* a plain file name in the step directory */
    long long nbytes;
    int crc_kind;    /* MOE__CRC_* */
    unsigned crc;
} moe__checkpoint_file;

/* manifest.json of a step directory: who wrote it and what it holds: every file of the directory but the
 * manifest itself (the model, or its shards and index; config.json; train_state.safetensors when saved). A
 * directory without one (written before manifests existed, or by another tool) reads as run "legacy", saved at
 * time 0, listing nothing (num_files -1). */
typedef struct {
    char run_id[MOE_RUN_ID_NBYTES], parent_run_id[MOE_RUN_ID_NBYTES];
    int step;
    long long saved_at_ns;
    moe__checkpoint_file *files; /* [num_files], malloc'ed: moe__checkpoint_manifest_free */
    int num_files;
    int is_export;               /* 1: its run saved with --save-dtype other than f32 (weights only: not resumable) */
} moe__checkpoint_manifest;

/* Writes DIR/manifest.json listing every regular file of DIR with its size and checksum (MOE__CRC_HEADER for the
 * safetensors files, MOE__CRC_WHOLE for the others), and config: the configuration the run trained with
 * (moe_checkpoint_run's run_config; stolen; NULL is out of memory), and machine: what computed it (run_machine's;
 * stolen; NULL: not recorded), and fsyncs it.
 * The configuration lives here rather than in train_state.safetensors, which stays byte-identical across layouts
 * (ep, ZeRO-1 and threads are options) and machines. */
moe_status moe__checkpoint_manifest_write(const char *dir, const char *run_id, const char *parent_run_id, int step,
                                          json_t *config, json_t *machine);
/* Reads DIR/manifest.json; a missing one gives the legacy manifest (MOE_OK). Refused (MOE_ERR_BAD_FILE): a run
 * id that is not 16 hex digits (the parent's may also be "" or "legacy"), a step outside 0..INT_MAX, a listed
 * name that is not a plain file name, a listed size that is not a byte count, a checksum that is not 8 hex digits
 * or names an unlisted file. */
moe_status moe__checkpoint_manifest_read(const char *dir, moe__checkpoint_manifest *m);
void moe__checkpoint_manifest_free(moe__checkpoint_manifest *m);
/* The files the manifest lists against DIR: a truncated, grown, missing or altered file (a safetensors header other
 * than the one saved: another step's or run's file, a relabelled dtype) is MOE_ERR_BAD_FILE naming it. */
moe_status moe__checkpoint_manifest_verify(const char *dir, const moe__checkpoint_manifest *m);
/* A file the loader reads must be one the manifest lists (a legacy manifest lists nothing and is not asked):
 * MOE_ERR_BAD_FILE naming it otherwise. */
moe_status moe__checkpoint_manifest_covers(const char *dir, const moe__checkpoint_manifest *m, const char *name);

typedef struct {
    char *path; /* ROOT/step-NNNNNNNN */
    moe__checkpoint_manifest manifest;
} moe__checkpoint_entry;

/* The step directories a listing passed over (a manifest that cannot be read, or an empty directory): how many,
 * and the one of the highest step (by its name), with why, for a message that names it. */
typedef struct {
    int count;
    long step; /* -1 when none */
    char path[1024];
    char why[512];
} moe__checkpoint_skipped;

/* The step directories of root, oldest first: by step, the save time breaking ties (a wrong clock never makes an
 * older step the newest). An unreadable root lists none. A step directory whose manifest cannot be read, or an
 * empty one, is left out with a warning line on notes (NULL: none) naming it and why, and counted in *skipped
 * (NULL: not asked): never fatal to the others, never deleted. */
moe_status moe__checkpoint_list(const char *root, moe__checkpoint_entry **out, int *count, FILE *notes,
                                moe__checkpoint_skipped *skipped);
void moe__checkpoint_list_free(moe__checkpoint_entry *entries, int count);
/* MOE_ERR_INVALID_CONFIG naming skipped's highest step directory, why it cannot be used, why that stops the run
 * (`where`, e.g. "it is the newest step directory: ...") and what to do: a save never replaces a directory it
 * cannot identify. */
moe_status moe__checkpoint_refuse_skipped(const char *root, const moe__checkpoint_skipped *skipped,
                                          const char *where);

/* Makes TMP (a complete, fsynced step directory) ROOT/step-NNNNNNNN: an older directory of the same step, saved by
 * run_id, is moved aside first, and deleted only after the rename and an fsync of ROOT; one of another run (or one
 * that cannot be identified) is never replaced (MOE_ERR_INVALID_CONFIG naming it). */
moe_status moe__checkpoint_publish(const char *root, const char *tmp, int step, const char *run_id);
/* Deletes all but the newest keep_last checkpoints (by step) of run_id in root (other runs' and unreadable ones are
 * never touched): each is renamed out of the way first, then emptied, so a kill leaves no half-deleted step
 * directory. */
moe_status moe__checkpoint_prune(const char *root, const char *run_id, int keep_last);
/* Removes what interrupted saves and prunes left in root (.tmp-*, .old-*, .trash-*). */
void moe__checkpoint_clean_leftovers(const char *root);
/* Removes a directory and the files in it (nothing recursive beyond that). */
void moe__checkpoint_remove_dir(const char *dir); /* a link: the link alone */

/* ---- checkpoint/lock.c ---- */
/* Takes ROOT/.lock (flock, exclusive, not waiting) for this process and writes the holder's run id, host, pid and
 * start time into it. Held by another process: MOE_ERR_INVALID_CONFIG naming that holder. */
moe_status moe__checkpoint_lock(const char *root, const char *run_id, moe_checkpoint_lock **out);

#endif
