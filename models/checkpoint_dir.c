/* checkpoint_dir.c — the step directories of a checkpoint root: manifests, listing, durable publication and
 * pruning (checkpoint_internal.h). Only world rank 0 calls the writing functions. */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/fail.h"
#include "models/checkpoint_internal.h"
#include "models/fileio.h"
#include "models/train_config.h"

const char *const moe__checkpoint_files[MOE__CHECKPOINT_FILES] = {"model.safetensors", "config.json",
                                                                  "train_state.safetensors"};
static const char kManifest[] = "manifest.json", kFormat[] = "moe-train-checkpoint-1", kLegacy[] = "legacy";

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static long long size_of(const char *dir, const char *name) {
    char *path = moe_path_join(dir, name);
    struct stat sb;
    long long n = path && stat(path, &sb) == 0 && S_ISREG(sb.st_mode) ? (long long)sb.st_size : -1;
    free(path);
    return n;
}

moe_status moe__checkpoint_manifest_write(const char *dir, const char *run_id, const char *parent_run_id, int step,
                                          json_t *config) {
    json_t *files = json_object();
    for (int i = 0; i < MOE__CHECKPOINT_FILES; i++)
        json_object_set_new(files, moe__checkpoint_files[i], json_integer(size_of(dir, moe__checkpoint_files[i])));
    json_t *m = json_pack("{s:s, s:s, s:s, s:i, s:I, s:o, s:o}", "format", kFormat, "run_id", run_id, "parent_run_id",
                          parent_run_id, "step", step, "saved_at_ns", (json_int_t)now_ns(), "files", files, "config",
                          config ? config : json_null());
    char *path = moe_path_join(dir, kManifest);
    moe_status st = m && path && config ? MOE_OK : MOE_ERR_OUT_OF_MEMORY;
    if (st == MOE_OK && (json_dump_file(m, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER | MOE_JSON_FLOATS) != 0 ||
                         moe_fsync_path(path) != 0))
        st = moe_fail(MOE_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    json_decref(m);
    free(path);
    return st;
}

static void legacy(moe__checkpoint_manifest *m) {
    *m = (moe__checkpoint_manifest){.step = -1, .saved_at_ns = 0};
    snprintf(m->run_id, sizeof m->run_id, "%s", kLegacy);
    for (int i = 0; i < MOE__CHECKPOINT_FILES; i++) m->file_nbytes[i] = -1;
}

/* A run id as make_run_id writes it: 16 lowercase hex digits (it names files when pruning: no '/', no ".."). */
static int is_run_id(const char *s) {
    if (strlen(s) != 16) return 0;
    for (; *s; s++)
        if (!((*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'f'))) return 0;
    return 1;
}

/* The files' sizes: absent, or a byte count. */
static int sizes_ok(json_t *files) {
    for (int i = 0; i < MOE__CHECKPOINT_FILES; i++) {
        json_t *n = json_object_get(files, moe__checkpoint_files[i]);
        if (n && (!json_is_integer(n) || json_integer_value(n) < 0)) return 0;
    }
    return 1;
}

moe_status moe__checkpoint_manifest_read(const char *dir, moe__checkpoint_manifest *m) {
    legacy(m);
    char *path = moe_path_join(dir, kManifest);
    if (!path) return MOE_ERR_OUT_OF_MEMORY;
    struct stat sb;
    if (stat(path, &sb) != 0 && errno == ENOENT) return free(path), MOE_OK;
    FILE *f;
    moe_status st = moe_file_open_regular(path, &f);
    if (st != MOE_OK) return free(path), st;
    json_error_t err;
    json_t *j = json_loadf(f, 0, &err), *files = json_object_get(j, "files");
    fclose(f);
    const char *format = json_string_value(json_object_get(j, "format")),
               *run = json_string_value(json_object_get(j, "run_id")),
               *parent = json_string_value(json_object_get(j, "parent_run_id"));
    json_t *step = json_object_get(j, "step"), *saved = json_object_get(j, "saved_at_ns");
    if (!j) st = moe_fail(MOE_ERR_BAD_FILE, "%s: not JSON: %s (line %d)", path, err.text, err.line);
    else if (!format || strcmp(format, kFormat) || !run || !parent || !json_is_integer(step) ||
             !json_is_integer(saved) || !json_is_object(files))
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: not a %s manifest (format, run_id, parent_run_id, step, saved_at_ns, "
                                        "files)", path, kFormat);
    else if (!is_run_id(run) || (*parent && strcmp(parent, kLegacy) && !is_run_id(parent)))
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: run_id '%.40s' or parent_run_id '%.40s' is not 16 hex digits (the parent "
                                        "may also be empty or %s)", path, run, parent, kLegacy);
    else if (json_integer_value(step) < 0 || json_integer_value(step) > INT_MAX)
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: step %lld is not a step number (0 to %d)", path,
                      (long long)json_integer_value(step), INT_MAX);
    else if (!sizes_ok(files))
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: a file size in \"files\" is not a byte count", path);
    if (st == MOE_OK) {
        snprintf(m->run_id, sizeof m->run_id, "%s", run);
        snprintf(m->parent_run_id, sizeof m->parent_run_id, "%s", parent);
        m->step = (int)json_integer_value(step);
        m->saved_at_ns = (long long)json_integer_value(saved);
        for (int i = 0; i < MOE__CHECKPOINT_FILES; i++) {
            json_t *n = json_object_get(files, moe__checkpoint_files[i]);
            m->file_nbytes[i] = json_is_integer(n) ? (long long)json_integer_value(n) : -1;
        }
    }
    json_decref(j);
    free(path);
    return st;
}

moe_status moe__checkpoint_manifest_verify(const char *dir, const moe__checkpoint_manifest *m) {
    for (int i = 0; i < MOE__CHECKPOINT_FILES; i++) {
        if (m->file_nbytes[i] < 0) continue;
        long long have = size_of(dir, moe__checkpoint_files[i]);
        if (have != m->file_nbytes[i])
            return moe_fail(MOE_ERR_BAD_FILE, "%s/%s: %lld bytes, the manifest says %lld (truncated, grown or missing)",
                            dir, moe__checkpoint_files[i], have, m->file_nbytes[i]);
    }
    return MOE_OK;
}

static int is_step_dir(const char *name, long *step) {
    char *end;
    if (strncmp(name, "step-", 5) || strlen(name) != 13) return 0;
    *step = strtol(name + 5, &end, 10);
    return *end == 0 && *step >= 0;
}

static int older(const void *pa, const void *pb) {
    const moe__checkpoint_manifest *a = &((const moe__checkpoint_entry *)pa)->manifest,
                                   *b = &((const moe__checkpoint_entry *)pb)->manifest;
    if (a->saved_at_ns != b->saved_at_ns) return a->saved_at_ns < b->saved_at_ns ? -1 : 1;
    return (a->step > b->step) - (a->step < b->step);
}

void moe__checkpoint_list_free(moe__checkpoint_entry *entries, int count) {
    for (int i = 0; i < count; i++) free(entries[i].path);
    free(entries);
}

moe_status moe__checkpoint_list(const char *root, moe__checkpoint_entry **out, int *count) {
    *out = NULL, *count = 0;
    DIR *d = opendir(root);
    if (!d) return MOE_OK;
    moe__checkpoint_entry *entries = NULL;
    int n = 0, cap = 0;
    moe_status st = MOE_OK;
    struct dirent *e;
    long step;
    while (st == MOE_OK && (e = readdir(d))) {
        if (!is_step_dir(e->d_name, &step)) continue;
        if (n == cap) {
            moe__checkpoint_entry *grown = realloc(entries, (size_t)(cap = cap ? 2 * cap : 16) * sizeof *entries);
            if (!grown) {
                st = MOE_ERR_OUT_OF_MEMORY;
                break;
            }
            entries = grown;
        }
        moe__checkpoint_entry *x = &entries[n];
        if (!(x->path = moe_path_join(root, e->d_name))) st = MOE_ERR_OUT_OF_MEMORY;
        else if ((st = moe__checkpoint_manifest_read(x->path, &x->manifest)) != MOE_OK) free(x->path);
        else {
            if (x->manifest.step < 0) x->manifest.step = (int)step; /* legacy: the name says the step */
            n++;
        }
    }
    closedir(d);
    if (st != MOE_OK) return moe__checkpoint_list_free(entries, n), st;
    if (n > 1) qsort(entries, (size_t)n, sizeof *entries, older); /* qsort(NULL, 0, ...) is undefined */
    *out = entries, *count = n;
    return MOE_OK;
}

void moe__checkpoint_remove_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            char *path = moe_path_join(dir, e->d_name);
            if (path) unlink(path);
            free(path);
        }
    closedir(d);
    rmdir(dir);
}

/* ROOT/PREFIX-NNNNNNNN[-TAG], malloc'ed */
static char *sibling(const char *root, const char *prefix, int step, const char *tag) {
    char name[128];
    snprintf(name, sizeof name, "%s-%08d%s%s", prefix, step, tag ? "-" : "", tag ? tag : "");
    return moe_path_join(root, name);
}

moe_status moe__checkpoint_publish(const char *root, const char *tmp, int step) {
    char *final = sibling(root, "step", step, NULL), *old = sibling(root, ".old-step", step, NULL);
    moe_status st = final && old ? MOE_OK : MOE_ERR_OUT_OF_MEMORY;
    if (st == MOE_OK && moe_fsync_path(tmp) != 0) st = moe_fail(MOE_ERR_IO, "%s: fsync failed: %s", tmp, strerror(errno));
    /* the new directory takes the final name in one rename; an older save of the same step goes aside first */
    if (st == MOE_OK && rename(final, old) != 0 && errno != ENOENT)
        st = moe_fail(MOE_ERR_IO, "%s: cannot move aside: %s", final, strerror(errno));
    if (st == MOE_OK && rename(tmp, final) != 0)
        st = moe_fail(MOE_ERR_IO, "%s: cannot rename to %s: %s", tmp, final, strerror(errno));
    if (st == MOE_OK && moe_fsync_path(root) != 0)
        st = moe_fail(MOE_ERR_IO, "%s: fsync of the directory failed: %s", root, strerror(errno));
    if (st == MOE_OK) moe__checkpoint_remove_dir(old); /* only once the new one is durable */
    free(final), free(old);
    return st;
}

moe_status moe__checkpoint_prune(const char *root, const char *run_id, int keep_last) {
    if (keep_last <= 0) return MOE_OK;
    moe__checkpoint_entry *list;
    int count, mine = 0;
    MOE_TRY(moe__checkpoint_list(root, &list, &count));
    for (int i = 0; i < count; i++) mine += !strcmp(list[i].manifest.run_id, run_id);
    moe_status st = MOE_OK;
    for (int i = 0; i < count && mine > keep_last && st == MOE_OK; i++) { /* oldest first */
        if (strcmp(list[i].manifest.run_id, run_id)) continue;
        char *trash = sibling(root, ".trash-step", list[i].manifest.step, run_id);
        if (!trash) st = MOE_ERR_OUT_OF_MEMORY;
        else if (rename(list[i].path, trash) != 0)
            st = moe_fail(MOE_ERR_IO, "%s: cannot move out of the way to delete it: %s", list[i].path, strerror(errno));
        else if (moe_fsync_path(root) != 0)
            st = moe_fail(MOE_ERR_IO, "%s: fsync of the directory failed: %s", root, strerror(errno));
        if (st == MOE_OK) moe__checkpoint_remove_dir(trash), mine--;
        free(trash);
    }
    moe__checkpoint_list_free(list, count);
    return st;
}

void moe__checkpoint_clean_leftovers(const char *root) {
    DIR *d = opendir(root);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)))
        if (!strncmp(e->d_name, ".tmp-step-", 10) || !strncmp(e->d_name, ".old-step-", 10) ||
            !strncmp(e->d_name, ".trash-step-", 12)) {
            char *path = moe_path_join(root, e->d_name);
            if (path) moe__checkpoint_remove_dir(path);
            free(path);
        }
    closedir(d);
}
