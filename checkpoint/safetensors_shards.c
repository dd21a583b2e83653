/* safetensors_shards.c — one safetensors file or shards with a transformers index (format and rules in
 * safetensors_shards.h). Takes from safetensors.h the single files, from fileio.h the path handling, from jansson
 * the index. */
#include "checkpoint/safetensors_shards.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "core/fail.h"
#include "models/fileio.h"

enum { MAX_INDEX_NBYTES = 100 << 20, MAX_FILE_NAME = 255 };

/* ---- the index --------------------------------------------------------------------------------- */

/* A shard name the index may give: a plain file name in the same directory, ending in .safetensors. */
static int is_shard_name(const char *s) {
    static const char suffix[] = ".safetensors";
    const size_t n = strlen(s), k = sizeof suffix - 1;
    return n > k && n <= MAX_FILE_NAME && !strchr(s, '/') && !strcmp(s + n - k, suffix) && s[0] != '.';
}

void moe_safetensors_index_free(moe_safetensors_index *idx) {
    json_decref(idx->weight_map);
    for (int i = 0; i < idx->num_shards; i++) free(idx->shards[i]);
    free(idx->shards);
    memset(idx, 0, sizeof *idx);
}

moe_status moe_safetensors_index_parse(const char *path, const char *text, size_t nbytes, moe_safetensors_index *out) {
    memset(out, 0, sizeof *out);
    json_error_t err;
    json_t *root = memchr(text, 0, nbytes) ? NULL : json_loadb(text, nbytes, JSON_REJECT_DUPLICATES, &err);
    if (!root)
        return moe_fail(MOE_ERR_BAD_FILE, "%s: not a JSON index: %s", path,
                        memchr(text, 0, nbytes) ? "it holds a NUL byte" : err.text);
    json_t *map = json_object_get(root, "weight_map"), *meta = json_object_get(root, "metadata");
    moe_status st = MOE_OK;
    if (!json_is_object(root) || !json_is_object(map) || !json_object_size(map))
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: not a safetensors index: it needs a non-empty \"weight_map\" object", path);
    else if (meta && !json_is_object(meta))
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: \"metadata\" is not an object", path);
    if (st == MOE_OK && !(out->shards = calloc(json_object_size(map), sizeof *out->shards))) st = MOE_ERR_OUT_OF_MEMORY;
    const char *name;
    json_t *value, *seen = json_object(); /* the shard names so far, a hash set: a scan of the list for each tensor
                                            * took minutes on an index of 40,000 shards (fuzzing, 2026-12-08) */
    if (st == MOE_OK && !seen) st = MOE_ERR_OUT_OF_MEMORY;
    if (st == MOE_OK) json_object_foreach(map, name, value) {
            const char *shard = json_string_value(value);
            if (strlen(name) >= MOE_SAFETENSORS_MAX_NAME) {
                st = moe_fail(MOE_ERR_BAD_FILE, "%s: tensor name too long: %.60s...", path, name);
                break;
            }
            if (!shard || !is_shard_name(shard)) {
                st = moe_fail(MOE_ERR_BAD_FILE, "%s: tensor %s: the shard must be a file name ending in .safetensors "
                              "in the same directory, got %.80s", path, name, shard ? shard : "a non-string");
                break;
            }
            if (json_object_get(seen, shard)) continue;
            if (json_object_set_new(seen, shard, json_true()) || !(out->shards[out->num_shards] = strdup(shard))) {
                st = MOE_ERR_OUT_OF_MEMORY;
                break;
            }
            out->num_shards++;
        }
    json_decref(seen);
    if (st == MOE_OK) out->weight_map = json_incref(map);
    json_decref(root);
    if (st != MOE_OK) moe_safetensors_index_free(out);
    return st;
}

const char *moe_safetensors_index_shard(const moe_safetensors_index *idx, const char *name) {
    return json_string_value(json_object_get(idx->weight_map, name));
}

/* ---- reading a set ----------------------------------------------------------------------------- */

static int exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 || errno != ENOENT;
}

static moe_status read_index(const char *path, moe_safetensors_index *idx) {
    FILE *f;
    MOE_TRY(moe_file_open_regular(path, &f));
    const long long nbytes = moe_file_size(f);
    char *text = nbytes >= 0 && nbytes <= MAX_INDEX_NBYTES ? malloc((size_t)nbytes + 1) : NULL;
    moe_status st = MOE_OK;
    if (nbytes < 0 || nbytes > MAX_INDEX_NBYTES)
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: %lld bytes: not an index (at most %d)", path, nbytes, MAX_INDEX_NBYTES);
    else if (!text) st = MOE_ERR_OUT_OF_MEMORY;
    else if (fread(text, 1, (size_t)nbytes, f) != (size_t)nbytes) st = moe_fail(MOE_ERR_IO, "%s: read failed", path);
    fclose(f);
    if (st == MOE_OK) st = moe_safetensors_index_parse(path, text, (size_t)nbytes, idx);
    free(text);
    return st;
}

/* Every tensor the index names is in its shard, and every tensor of a shard is named by the index for it. */
static moe_status check_shards(const moe_safetensors_set *s, const char *index_path) {
    const char *name;
    json_t *value;
    json_object_foreach((json_t *)s->index.weight_map, name, value) {
        const char *shard = json_string_value(value);
        for (int i = 0; i < s->num_files; i++)
            if (!strcmp(s->names[i], shard) && !moe_safetensors_find(&s->files[i], name))
                return moe_fail(MOE_ERR_BAD_FILE, "%s names tensor %s in %s, which does not hold it", index_path, name,
                                s->files[i].path);
    }
    for (int i = 0; i < s->num_files; i++)
        for (int t = 0; t < s->files[i].num_tensors; t++) {
            const char *tensor = s->files[i].tensors[t].name, *shard = moe_safetensors_index_shard(&s->index, tensor);
            if (!shard)
                return moe_fail(MOE_ERR_BAD_FILE, "%s holds tensor %s, which the index %s does not name",
                                s->files[i].path, tensor, index_path);
            if (strcmp(shard, s->names[i]))
                return moe_fail(MOE_ERR_BAD_FILE, "%s holds tensor %s, which the index %s places in %s (a tensor in "
                                "two shards, or a wrong index)", s->files[i].path, tensor, index_path, shard);
        }
    return MOE_OK;
}

/* (A save writes one shard at a time, so a save of 1,197 one-byte shards succeeded under `ulimit -n 1024` and its
 * load failed at shard 1,069: a probe. Now such a run is refused before it trains.) */
moe_status moe_safetensors_room_for_shards(int count, const char *what) {
    struct rlimit r;
    const rlim_t want = (rlim_t)count + 64; /* what the process holds beside them: MPI, logs, the data files */
    if (getrlimit(RLIMIT_NOFILE, &r) != 0 || r.rlim_cur == RLIM_INFINITY || r.rlim_cur >= want) return MOE_OK;
    return moe_fail(MOE_ERR_IO, "%s: %d shards, all open while a load reads them, and 64 files beside: more than "
                    "this process may open (ulimit -n allows %llu); raise the limit, or save with a larger "
                    "--save-shard-size", what, count, (unsigned long long)r.rlim_cur);
}

static moe_status open_files(const char *dir, moe_safetensors_set *s, char *const *names, int count) {
    s->files = calloc((size_t)count, sizeof *s->files);
    s->names = calloc((size_t)count, sizeof *s->names);
    if (!s->files || !s->names) return MOE_ERR_OUT_OF_MEMORY;
    for (int i = 0; i < count; i++) {
        char *path = moe_path_join(dir, names[i]);
        if (!path || !(s->names[i] = strdup(names[i]))) return free(path), MOE_ERR_OUT_OF_MEMORY;
        moe_status st = moe_safetensors_open(path, &s->files[i]);
        free(path);
        if (st != MOE_OK) return free(s->names[i]), s->names[i] = NULL, st;
        s->num_files++;
    }
    return MOE_OK;
}

moe_status moe_safetensors_set_open(const char *dir, const char *stem, moe_safetensors_set *s) {
    memset(s, 0, sizeof *s);
    char single_name[MAX_FILE_NAME + 1], index_name[MAX_FILE_NAME + 1];
    snprintf(single_name, sizeof single_name, "%s.safetensors", stem);
    snprintf(index_name, sizeof index_name, "%s.safetensors.index.json", stem);
    char *single = moe_path_join(dir, single_name), *index = moe_path_join(dir, index_name), *names[1] = {single_name};
    moe_status st = single && index ? MOE_OK : MOE_ERR_OUT_OF_MEMORY;
    const int has_single = st == MOE_OK && exists(single), has_index = st == MOE_OK && exists(index);
    if (st == MOE_OK && has_single && has_index)
        st = moe_fail(MOE_ERR_BAD_FILE, "%s holds both %s and %s: which one is the model? Remove one", dir, single_name,
                      index_name);
    else if (st == MOE_OK && !has_index)
        st = open_files(dir, s, names, 1); /* a missing file: its own message names it */
    else if (st == MOE_OK) {
        st = read_index(index, &s->index);
        if (st == MOE_OK) st = moe_safetensors_room_for_shards(s->index.num_shards, dir);
        if (st == MOE_OK) st = open_files(dir, s, s->index.shards, s->index.num_shards);
        if (st != MOE_OK && s->files && s->index.num_shards && s->num_files < s->index.num_shards)
            st = moe_fail_context(st, "shard %s (one of the %d that %s names)", s->index.shards[s->num_files],
                                  s->index.num_shards, index);
        if (st == MOE_OK) st = check_shards(s, index);
    }
    free(single), free(index);
    if (st != MOE_OK) moe_safetensors_set_close(s);
    return st;
}

void moe_safetensors_set_close(moe_safetensors_set *s) {
    for (int i = 0; i < s->num_files; i++) moe_safetensors_close(&s->files[i]);
    for (int i = 0; s->names && i < s->num_files; i++) free(s->names[i]);
    free(s->files), free(s->names);
    moe_safetensors_index_free(&s->index);
    memset(s, 0, sizeof *s);
}

moe_safetensors_file *moe_safetensors_set_file(const moe_safetensors_set *s, const char *name) {
    if (!s->index.num_shards) return s->num_files && moe_safetensors_find(&s->files[0], name) ? &s->files[0] : NULL;
    const char *shard = moe_safetensors_index_shard(&s->index, name);
    for (int i = 0; shard && i < s->num_files; i++)
        if (!strcmp(s->names[i], shard)) return &s->files[i];
    return NULL;
}

/* ---- writing ----------------------------------------------------------------------------------- */

/* The first entry of each shard: greedy in order, a new shard when the next tensor would pass the limit. */
int moe_safetensors_shard_split(const moe_safetensors_entry *e, int n, size_t max_nbytes, int *first) {
    if (n == 0) return first[0] = first[1] = 0, 1;
    int shards = 0;
    size_t in_shard = 0;
    for (int i = 0; i < n; i++) {
        const size_t nbytes = moe_safetensors_data_nbytes(&e[i], 1);
        if (i == 0 || (max_nbytes && in_shard > 0 && in_shard + nbytes > max_nbytes)) first[shards++] = i, in_shard = 0;
        in_shard += nbytes;
    }
    first[shards] = n;
    return shards;
}

void moe_safetensors_shard_name(const char *stem, int s, int shards, char *out, size_t n) {
    if (shards == 1) snprintf(out, n, "%s.safetensors", stem);
    else snprintf(out, n, "%s-%05d-of-%05d.safetensors", stem, s + 1, shards);
}

moe_status moe_safetensors_write_index(const char *dir, const char *stem, const moe_safetensors_entry *e, int n,
                                       const int *first, int shards) {
    char name[MAX_FILE_NAME + 1];
    json_t *map = json_object();
    for (int s = 0; s < shards; s++) {
        moe_safetensors_shard_name(stem, s, shards, name, sizeof name);
        for (int i = first[s]; i < first[s + 1]; i++) json_object_set_new(map, e[i].name, json_string(name));
    }
    json_t *root = json_pack("{s:{s:I}, s:o}", "metadata", "total_size", (json_int_t)moe_safetensors_data_nbytes(e, n),
                             "weight_map", map);
    snprintf(name, sizeof name, "%s.safetensors.index.json", stem);
    char *path = moe_path_join(dir, name);
    moe_status st = root && path ? MOE_OK : MOE_ERR_OUT_OF_MEMORY;
    if (st == MOE_OK && (json_dump_file(root, path, JSON_INDENT(2) | JSON_SORT_KEYS) != 0 || moe_fsync_path(path) != 0))
        st = moe_fail(MOE_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    json_decref(root);
    free(path);
    return st;
}

moe_status moe_safetensors_write_shards(const char *dir, const char *stem, const moe_safetensors_entry *entries,
                                        int num_entries, const moe_safetensors_meta *meta, int num_meta,
                                        size_t max_shard_nbytes, int *num_files) {
    int *first = malloc((size_t)(num_entries + 2) * sizeof *first);
    if (!first) return MOE_ERR_OUT_OF_MEMORY;
    const int shards = moe_safetensors_shard_split(entries, num_entries, max_shard_nbytes, first);
    moe_status st = MOE_OK;
    char name[MAX_FILE_NAME + 1];
    for (int s = 0; s < shards && st == MOE_OK; s++) {
        moe_safetensors_shard_name(stem, s, shards, name, sizeof name);
        char *path = moe_path_join(dir, name);
        st = path ? moe_safetensors_write(path, entries + first[s], first[s + 1] - first[s], meta, num_meta)
                  : MOE_ERR_OUT_OF_MEMORY;
        free(path);
    }
    if (st == MOE_OK && shards > 1) st = moe_safetensors_write_index(dir, stem, entries, num_entries, first, shards);
    if (st == MOE_OK && num_files) *num_files = shards + (shards > 1);
    free(first);
    return st;
}
