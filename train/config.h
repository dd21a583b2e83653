/* train/config.h — moe-train's configuration from all its sources, and as JSON.
 *
 * Sources, weakest first (train/options.h moe_option_source): the defaults; with --resume, the options the
 * checkpoint's run trained with (recorded in its training state); the checkpoint's config.json (--init-from,
 * --resume); a --config JSON file; the flags. A stronger source overrides a weaker one, except that config.json
 * defines the architecture: a --config key or a flag that disagrees with it is an error naming both values.
 * The same JSON object (every option of the run and the command, keys as in a --config file) is what
 * --print-config writes, what the metrics log opens with and what a checkpoint records (manifest.json). */
#ifndef MOE_TRAIN_CONFIG_H
#define MOE_TRAIN_CONFIG_H

#include <jansson.h>
#include <stdio.h>

#include "checkpoint/json_float.h" /* what the JSON is dumped with: MOE_JSON_FLOATS */
#include "train/options.h"

/* Every source above, then moe_train_options_finish. Returns 0, 1 when --help was printed, -1 on an error (the
 * message written to err, naming the file, the key or flag, and the values; err NULL: quiet). notes (NULL: none)
 * gets what the run inherited or changed from a resumed run, one line each (not with --print-config). Collective only in that every rank
 * reads the same files. */
int moe_train_options_load(int argc, char **argv, int world_size, moe_train_options *o, FILE *err, FILE *notes);

/* 1 for the run's options that the training state's fingerprint holds beside the architecture (checkpoint/config.c,
 * moe__checkpoint_fingerprint; tests/test_checkpoint_config.c ties the two lists): a resume continues their run, so
 * it keeps them (--init-from starts another), and a flag that changes one is refused by name before anything loads
 * (before, a resume noted the change as if taken, then failed "training state from another run"). */
int moe_train_option_kept_on_resume(const moe_train_option *s);

/* The options as a JSON object, in --help order, keys as in a --config file; options of scope flag-only
 * (--config, --print-config) left out. derived_as_auto: the values moe_train_options_finish derived are written
 * "auto", so that a --config file re-derives them from what is given beside it (--print-config); else as decided
 * (a checkpoint's record of the run, which --resume continues exactly). Dump with MOE_JSON_FLOATS. NULL when out of
 * memory. */
json_t *moe_train_options_json(const moe_train_options *o, int derived_as_auto);

/* Sets the options named in j (a --config file's object) whose source is weaker than source. what names j in
 * messages ("run.json"). Unknown keys, flag-only keys, wrong types and out-of-range values are errors naming the
 * key; with source MOE_OPTION_SAVED_RUN, unknown keys (another version's) are skipped, and only options of scope
 * run are taken. Strings stay owned by j: keep it alive as long as o. Returns 0 or -1 (message to err). */
int moe_train_options_apply_json(moe_train_options *o, json_t *j, moe_option_source source, const char *what,
                                 FILE *err);

#endif
