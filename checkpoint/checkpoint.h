/* checkpoint.h — checkpoints that outlive layouts.
 *
 * A checkpoint is a directory:
 *   model.safetensors        the whole model in Hugging Face Mixtral names and shapes; experts by global
 *                            id, so the file does not depend on ep or the world size; F32, or BF16 with
 *                            --save-dtype bf16 (an export, refused by resume); with --save-shard-size,
 *                            model-0000i-of-0000n.safetensors and model.safetensors.index.json instead
 *                            (checkpoint/safetensors_shards.h)
 *   config.json              Mixtral's config.json plus a "moe_train" object for what Mixtral has no key for
 *                            (docs/CHECKPOINTS.md). With every FFN an MoE layer, softmax routing renormalised
 *                            (any k) and no capacity limit, it says MixtralForCausalLM and the directory loads
 *                            in transformers as one; any other model says MoeTrainMixtralVariantForCausalLM
 *                            (model_type moe_train_mixtral_variant) with a moe_train_note saying why, so that
 *                            no tool computes another function from the weights
 *   train_state.safetensors  AdamW moments (exp_avg.NAME, exp_avg_sq.NAME), the routers' selection biases
 *                            (expert_bias.layers.I), and metadata: step, data position, the AdamW updates
 *                            applied, and a fingerprint
 *                            of everything that must match to continue the same run. A bf16 export has none,
 *                            or under sigmoid routing one with the selection biases alone
 *   manifest.json            the run that wrote it (run id, parent run id), the step, when, every file of the
 *                            directory with its size (a CRC-32C of the JSON ones; a load reads no file it does
 *                            not list), and the configuration the run trained with (train/config.h;
 *                            what --resume inherits)
 * Both safetensors files carry every tensor's CRC-32C; a load verifies the sizes and the checksums and
 * names what is corrupt, and refuses non-finite weights or moments. A save refuses non-finite values.
 *
 * Saves go to ROOT/step-NNNNNNNN and are durable and atomic: written into ROOT/.tmp-step-NNNNNNNN, every
 * file and the directory fsynced, renamed, ROOT fsynced; an interrupted save leaves the earlier
 * checkpoints as they were. Pruning deletes only this run's own older checkpoints, after the new one is
 * durable, each renamed out of the way before it is emptied. Loading never writes.
 * Nothing gathers the model: every rank writes the tensors it holds into the files (each tensor by one of its holders,
 * at its place: the files are byte for byte those one process would write, on any layout; a tensor-parallel tensor's
 * blocks gathered over its tensor group, one tensor at a time) and reads only what it holds; a save takes one tensor's
 * memory per rank beyond the model (checkpoint/write.c). So the checkpoint directory must be on a file system every
 * rank sees (a save checks it). All functions are collective over the run's layout; while ranks write or read, every
 * exchange waits under --checkpoint-timeout, not the exchange watchdog. On failure every rank returns the same status
 * and the message names the file and the tensor or field; but a rank that timed out returns MOE_ERR_TIMEOUT while the
 * others may still be waiting, in that exchange or a later one (end the job then: train/train.c).
 *
 * Checkpoints stand below the trainer (train/ includes this folder, never the reverse): what they read from a run
 * and write back into it is moe_checkpoint_run below, which the trainer fills (train/checkpoint_run.h). */
#ifndef MOE_CHECKPOINT_H
#define MOE_CHECKPOINT_H

#include <jansson.h>
#include <stdio.h>

#include "checkpoint/safetensors.h"
#include "models/model.h"

enum { MOE_RUN_ID_NBYTES = 24 }; /* a run id in a manifest: 16 hex digits, or "legacy" */

/* A run as a checkpoint sees it: the model, the layout, the few settings a save and a load read, the run's identity,
 * and the optimizer state through two functions of the owner (so that how the trainer shards its moments stays the
 * trainer's business). The pointers are the run's own: a load writes the weights, moments and biases in place and a
 * resume may take over the checkpoint's run id. */
typedef struct {
    moe_model *model;               /* parameters and selection biases, saved and loaded in place                  */
    const moe_parallel *par;        /* whose world agrees on every outcome                                         */
    moe_ranks ranks;
    const moe_model_config *config; /* the architecture: config.json, and the tensor table's shapes and experts    */
    int batch, micro_batches, seed; /* with config, the fingerprint a resume must match; micro_batches also gives the
                                       data position saved (step * micro_batches)                                  */
    int save_dtype;                 /* 0: F32 (the masters), 1: BF16 (an export: not resumable)                    */
    long long save_shard_nbytes;    /* 0: one model.safetensors; else the shards' size                            */
    float timeout_s;                /* how long a rank waits for the others in a save or load (--checkpoint-timeout) */
    char *run_id, *parent_run_id;   /* [MOE_RUN_ID_NBYTES] each; parent "" for a fresh run                        */
    const char *companion_dir;      /* the checkpoint the run started from (--init-from, --resume), whose tokenizer
                                       and generation files and token ids a save carries along
                                       (checkpoint/companions.h); NULL: none                                       */
    FILE *notes;                    /* warnings that stop nothing (an unreadable old checkpoint); NULL: nowhere    */
    /* The AdamW moments (which 0: first, 1: second), one range [offset, offset + count) of the unsharded layout
     * [dense | experts] at a time, lying in one region; moment_range to the host dst, moment_range_set from the host
     * src (keeping what this rank holds). With moments_sharded (ZeRO) moment_range is collective over the region's
     * group: every rank of it calls with the same range. */
    void *owner;
    int moments_sharded;
    moe_status (*moment_range)(void *owner, int which, size_t offset, size_t count, moe_real *dst);
    moe_status (*moment_range_set)(void *owner, int which, size_t offset, size_t count, const moe_real *src);
    /* The configuration the run trained with, for the manifest (what --resume inherits): a new JSON object, NULL when
     * out of memory. */
    json_t *(*run_config)(const void *owner);
    /* What computed the run (the CPU, the GEMM library and its instruction set, the build), for the manifest's
     * "machine": a new JSON object; NULL: not recorded. A resume reads it back to say when it runs elsewhere. */
    json_t *(*run_machine)(const void *owner);
    /* The data position and the data set's identity, kept in the training state's metadata (keys "data_*", and beside
     * them the trainer's count of AdamW updates, "optimizer_updates"): data_meta
     * gives the pairs to save after `step` (at most max; the strings are the owner's, valid until its next call) and
     * returns their count; data_restore reads them back from the state a resume loads (moe_safetensors_metadata: NULL
     * where absent, as in a checkpoint older than them), checks them against the run and takes the position, or
     * refuses with a message naming what changed. Both NULL: nothing saved or read. */
    int (*data_meta)(void *owner, int step, moe_safetensors_meta *meta, int max);
    moe_status (*data_restore)(void *owner, int step, const moe_safetensors_file *state, const char *path);
} moe_checkpoint_run;

/* The pipeline stage that holds layer `layer` (-1: the embedding; num_layers: the head) in run's layout: its pp, with
 * the model's chunks and ends (models/model.h's moe_pipeline_split). */
int moe__checkpoint_stage_of(const moe_checkpoint_run *run, int layer);

/* ---- config.json ---- */
#define MOE_CHECKPOINT_MIXTRAL "MixtralForCausalLM"
#define MOE_CHECKPOINT_VARIANT "MoeTrainMixtralVariantForCausalLM"
#define MOE_CHECKPOINT_VARIANT_TYPE "moe_train_mixtral_variant"

/* transformers' class of a family (models/model.h): MixtralForCausalLM, Qwen3MoeForCausalLM, OlmoeForCausalLM. */
const char *moe_checkpoint_hf_class(int family);
/* 1 when that class computes the same function as model c; else 0, and why (NULL: not wanted) gets the reasons
 * ("sigmoid router scores ...; a capacity limit that drops tokens"). */
int moe_checkpoint_hf_computes(const moe_model_config *c, char *why, size_t why_nbytes);

/* DIR/config.json as a model config: the architecture and the routing semantics (moe_checkpoint_field_at), and
 * max_positions = max_position_embeddings (0 when absent). The rest of *out is moe_model_config_default()'s
 * (seq_len included: config.json does not fix it). A key of the wrong type, a label (architectures, model_type) not
 * Mixtral's or ours, a sliding window in use (attention here is full causal, and a saved config.json could not keep
 * the window), or a model that moe_model_config_problem refuses is MOE_ERR_BAD_FILE naming the key. */
moe_status moe_checkpoint_read_config(const char *dir, moe_model_config *out);
/* The same of a config.json at PATH (moe-plan's --hf-config of a file moe-train wrote). */
moe_status moe_checkpoint_read_config_file(const char *path, moe_model_config *out);
/* DIR/NAME against DIR's manifest.json (its size and checksum), before anything is taken from it: MOE_ERR_BAD_FILE
 * naming the file when it differs or the manifest does not list it; MOE_OK without a manifest (another tool's
 * checkpoint: nothing to check against). */
moe_status moe_checkpoint_verify_file(const char *dir, const char *name);

/* The fields of moe_model_config that config.json defines, i = 0 .. moe_checkpoint_num_fields() - 1: the shapes,
 * tie_word_embeddings, rope_theta, rms_norm_eps, and moe_train's moe_every, score_func, renormalize,
 * capacity_factor and drop_priority. */
typedef struct {
    const char *key;  /* "rope_theta", "score_func"                                             */
    char path[64];    /* where in config.json: "rope_theta", "moe_train.score_func", "rope_scaling.factor" */
    size_t offset;    /* of the field in moe_model_config (an int, an enum or a float)           */
    double value;     /* c's value (enums as their index; every capacity factor <= 0 as 0)       */
    char text[48];    /* the value as config.json writes it: 8, 1e+06, true, "softmax", null       */
    char flag_text[48]; /* the value in moe-train's units where the file's differ (DeepSeek's n_shared_experts
                           counts expert widths, --shared-d-ff is one): 64; else ""                  */
    int policy;       /* 1: the routing policy of training (capacity_factor, drop_priority), which a run started
                         from the weights (--init-from) may change; 0: what the weights compute      */
} moe_checkpoint_field;
int moe_checkpoint_num_fields(void);
moe_checkpoint_field moe_checkpoint_field_at(const moe_model_config *c, int i);
void moe_checkpoint_field_set(moe_model_config *c, int i, double value);

/* Before training, with the run's identity settled (after a resume): ROOT is made if missing (its parent must
 * exist), must be a writable directory, and is locked for this job (world rank 0 holds ROOT/.lock until
 * moe_checkpoint_unlock or its end, which the kernel notices however the process ends): a second job on ROOT is
 * refused, naming the run, host and pid that hold it. ROOT may hold no checkpoints but this run's and its
 * parent's (a fresh run into a used directory would mix them), and none of another run after resumed_step (0 for
 * a fresh run): a fork resumed from an older checkpoint would reach those steps, and a save never replaces
 * another run's checkpoint (save the fork into another --checkpoint-dir). *lock: NULL on other ranks. */
typedef struct moe_checkpoint_lock moe_checkpoint_lock;
moe_status moe_checkpoint_prepare(moe_checkpoint_run run, const char *root, int resumed_step,
                                  moe_checkpoint_lock **lock);
void moe_checkpoint_unlock(moe_checkpoint_lock *lock); /* NULL: nothing */

/* Saves the run's model and state after `step` into ROOT/step-NNNNNNNN (never over another run's), then
 * deletes all but the newest keep_last checkpoints of this run (keep_last <= 0: keep all). */
moe_status moe_checkpoint_save(moe_checkpoint_run run, const char *root, int step, int keep_last);

/* Weights only (--init-from): the optimizer starts fresh. F32, BF16 and F16 weights (widened exactly). */
moe_status moe_checkpoint_load_weights(moe_checkpoint_run run, const char *dir);

/* Weights, moments, biases and step (--resume): *step is the last completed step. The run's fingerprint
 * (model, batch, micro-batches, seed) must match the saved one; ep and the world size may differ. Weights stored in
 * less than F32 (a bf16 export) are refused: resuming needs the masters. Every file must match the manifest's
 * checksums, the training state's step and run the manifest's, and the second moments must be >= 0. The run
 * continues under the checkpoint's run id when it is that run's newest (by step) in its directory; else it
 * becomes a new run whose parent is that one. */
moe_status moe_checkpoint_resume(moe_checkpoint_run run, const char *dir, int *step);

/* The newest step directory of ROOT (the highest step; the later save of equal steps) (malloc'ed into *out);
 * MOE_ERR_IO with a message when there is none. Unreadable step directories are passed over with a warning on
 * notes (NULL: none). */
moe_status moe_checkpoint_latest(const char *root, char **out, FILE *notes);
/* 1 when ROOT does not exist or holds no step-<digits> entry at all (a job's first start: moe-train --resume auto
 * starts fresh there); 0 otherwise, moe_checkpoint_latest then deciding (an unreadable ROOT included: it says why). */
int moe_checkpoint_none_yet(const char *root);

#endif
