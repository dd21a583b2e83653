/* checkpoint_internal.h — inside models/checkpoint*.c only: the pieces of a checkpoint beside the tensors.
 *   checkpoint_config.c  config.json, the run's fingerprint, the saved step
 *   checkpoint_dir.c     the manifest of a step directory, listing, latest, durable publication, pruning */
#ifndef MOE_MODELS_CHECKPOINT_INTERNAL_H
#define MOE_MODELS_CHECKPOINT_INTERNAL_H

#include <jansson.h>

#include "models/checkpoint.h"

/* ---- checkpoint_config.c ---- */
json_t *moe__checkpoint_config_json(const moe_model_config *c);
/* Compares the architecture in DIR/config.json with the model; names the first field that differs. */
moe_status moe__checkpoint_check_config(const char *dir, const moe_model_config *c);
/* Everything that must match to continue a run: the architecture, routing, data order and seed. */
void moe__checkpoint_fingerprint(const moe_trainer *tr, char *out, size_t n);
/* A saved step: digits only, 0 to INT_MAX; anything else is MOE_ERR_BAD_FILE naming path. */
moe_status moe__checkpoint_parse_step(const char *text, const char *path, int *step);

/* ---- checkpoint_dir.c ---- */
enum { MOE__CHECKPOINT_FILES = 3 };
extern const char *const moe__checkpoint_files[MOE__CHECKPOINT_FILES]; /* model, config, train state */

/* manifest.json of a step directory: who wrote it and what it holds. A directory without one (written
 * before manifests existed, or by another tool) reads as run "legacy", saved at time 0. */
typedef struct {
    char run_id[MOE_RUN_ID_NBYTES], parent_run_id[MOE_RUN_ID_NBYTES];
    int step;
    long long saved_at_ns;
    long long file_nbytes[MOE__CHECKPOINT_FILES]; /* -1: not listed */
} moe__checkpoint_manifest;

/* Writes DIR/manifest.json (the files' sizes read from DIR, and config: the options the run trained with,
 * models/train_config.h, stolen; NULL is out of memory) and fsyncs it. The configuration lives here rather than
 * in train_state.safetensors, which stays byte-identical across layouts (ep, ZeRO-1 and threads are options). */
moe_status moe__checkpoint_manifest_write(const char *dir, const char *run_id, const char *parent_run_id, int step,
                                          json_t *config);
/* Reads DIR/manifest.json; a missing one gives the legacy manifest (MOE_OK). Refused (MOE_ERR_BAD_FILE): a run
 * id that is not 16 hex digits (the parent's may also be "" or "legacy"), a step outside 0..INT_MAX, a listed
 * size that is not a byte count. */
moe_status moe__checkpoint_manifest_read(const char *dir, moe__checkpoint_manifest *m);
/* The sizes the manifest lists against the files in DIR: a truncated or grown file is MOE_ERR_BAD_FILE. */
moe_status moe__checkpoint_manifest_verify(const char *dir, const moe__checkpoint_manifest *m);

typedef struct {
    char *path; /* ROOT/step-NNNNNNNN */
    moe__checkpoint_manifest manifest;
} moe__checkpoint_entry;

/* The step directories of root, oldest first (by saved time, then step); an unreadable root lists none. */
moe_status moe__checkpoint_list(const char *root, moe__checkpoint_entry **out, int *count);
void moe__checkpoint_list_free(moe__checkpoint_entry *entries, int count);

/* Makes TMP (a complete, fsynced step directory) ROOT/step-NNNNNNNN: an older directory of the same step is
 * moved aside first, and deleted only after the rename and an fsync of ROOT. */
moe_status moe__checkpoint_publish(const char *root, const char *tmp, int step);
/* Deletes all but the newest keep_last checkpoints of run_id in root (other runs' are never touched): each is
 * renamed out of the way first, then emptied, so a kill leaves no half-deleted step directory. */
moe_status moe__checkpoint_prune(const char *root, const char *run_id, int keep_last);
/* Removes what interrupted saves and prunes left in root (.tmp-*, .old-*, .trash-*). */
void moe__checkpoint_clean_leftovers(const char *root);
/* Removes a directory and the files in it (nothing recursive beyond that). */
void moe__checkpoint_remove_dir(const char *dir);

#endif
