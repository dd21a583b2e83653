/* output_paths.h — a run's outputs (--log-file, --routing-trace-out, --dump-logits) are none of its inputs (the
 * training and validation shards, --routing-trace-in), none inside a checkpoint's folder, and no two of them one file:
 * each output is truncated when it is opened, so such a run destroyed its own data and then blamed "a file truncated
 * while the run reads it". */
#ifndef MOE_TRAIN_OUTPUT_PATHS_H
#define MOE_TRAIN_OUTPUT_PATHS_H

#include "core/types.h"
#include "train/dataloader.h"
#include "train/options.h"

/* MOE_OK, or MOE_ERR_BAD_FILE naming the flag and both paths. Files are compared by device and inode where they
 * exist, by name where they do not yet. */
moe_status moe_train_check_output_paths(const moe_train_options *o, const moe_token_data *train,
                                        const moe_token_data *val);

/* Before an output file is written anew: a non-empty regular file at path (an earlier run's metrics log) is renamed
 * to the first free path.1, path.2, ... and its new name written to kept; 1 then, 0 when there is nothing to keep (no
 * file, an empty one, a FIFO, a device, or a link such as /dev/stdout: the caller appends through it), -1 with errno
 * when it cannot be kept. */
int moe_train_keep_previous(const char *path, char *kept, size_t n);

#endif
