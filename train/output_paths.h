/* output_paths.h — a run's outputs (--log-file, --routing-trace-out, --dump-logits) are none of its inputs (the
 * training and validation shards, --routing-trace-in) and no two of them one file: each output is truncated when it is
 * opened, so such a run destroyed its own data and then blamed "a file truncated while the run reads it". */
#ifndef MOE_TRAIN_OUTPUT_PATHS_H
#define MOE_TRAIN_OUTPUT_PATHS_H

#include "core/types.h"
#include "train/dataloader.h"
#include "train/options.h"

/* MOE_OK, or MOE_ERR_BAD_FILE naming the flag and both paths. Files are compared by device and inode where they
 * exist, by name where they do not yet. */
moe_status moe_train_check_output_paths(const moe_train_options *o, const moe_token_data *train,
                                        const moe_token_data *val);

#endif
