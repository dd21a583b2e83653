/* output_paths.c — no output of a run is one of its inputs (train/output_paths.h). */
#include "train/output_paths.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fail.h"
#include "models/fileio.h"

/* The input of data set d (named what) that path is, or NULL. */
static const char *shard_named(const moe_token_data *d, const char *path) {
    for (int i = 0; d && i < moe_token_data_num_shards(d); i++)
        if (moe_same_file(path, moe_token_data_shard(d, i).path)) return moe_token_data_shard(d, i).path;
    return NULL;
}

/* Whether path's folder is a checkpoint (a manifest, or a model's weights: ours or another tool's), into *folder. */
static int in_checkpoint(const char *path, char *folder, size_t n) {
    const char *slash = strrchr(path, '/');
    snprintf(folder, n, "%.*s", slash ? (int)(slash - path) + (slash == path) : 1, slash ? path : ".");
    static const char *const marks[] = {"manifest.json", "model.safetensors", "model.safetensors.index.json"};
    char mark[4200];
    for (int i = 0; i < 3; i++) {
        snprintf(mark, sizeof mark, "%s/%s", folder, marks[i]);
        if (access(mark, F_OK) == 0) return 1;
    }
    return 0;
}

moe_status moe_train_check_output_paths(const moe_train_options *o, const moe_token_data *train,
                                        const moe_token_data *val) {
    const char *const flag[] = {"--log-file", "--routing-trace-out", "--dump-logits"};
    const char *const path[] = {o->log_file, o->routing_trace_out, o->dump_logits};
    for (int i = 0; i < 3; i++) {
        if (!*path[i]) continue;
        const char *shard = shard_named(train, path[i]), *what = "a training data shard";
        if (!shard) shard = shard_named(val, path[i]), what = "a validation data shard";
        if (!shard && *o->routing_trace_in && moe_same_file(path[i], o->routing_trace_in))
            shard = o->routing_trace_in, what = "--routing-trace-in";
        if (shard)
            return moe_fail(MOE_ERR_BAD_FILE, "%s %s is %s (%s): the run would overwrite its own input", flag[i],
                            path[i], what, shard);
        char folder[4096];
        if (in_checkpoint(path[i], folder, sizeof folder)) /* a probe: --dump-logits CK/config.json overwrote it */
            return moe_fail(MOE_ERR_BAD_FILE, "%s %s is inside the checkpoint %s: the run would overwrite or move its "
                            "files (write it elsewhere)", flag[i], path[i], folder);
        for (int j = i + 1; j < 3; j++)
            if (*path[j] && moe_same_file(path[i], path[j]))
                return moe_fail(MOE_ERR_BAD_FILE, "%s %s and %s %s are one file: each output needs its own", flag[i],
                                path[i], flag[j], path[j]);
    }
    return MOE_OK;
}

int moe_train_keep_previous(const char *path, char *kept, size_t n) {
    struct stat st; /* a link (/dev/stdout) is not renamed: it is written through (a probe, 2026-12-07: as root the
                     * /dev/stdout link became /dev/stdout.1 and a file took its place) */
    if (lstat(path, &st) != 0) return errno == ENOENT || errno == ENOTDIR ? 0 : -1; /* the open says why */
    if (!S_ISREG(st.st_mode) || st.st_size == 0) return 0;
    for (int i = 1; i < 1000; i++) {
        if ((size_t)snprintf(kept, n, "%s.%d", path, i) >= n) return errno = ENAMETOOLONG, -1;
        if (lstat(kept, &st) == 0) continue;
        if (errno != ENOENT) return -1;
        return rename(path, kept) == 0 ? 1 : -1;
    }
    return errno = EEXIST, -1;
}
