/* checkpoint/dir.c — the step directories of a checkpoint root: manifests, listing, durable publication and
 * pruning (checkpoint/internal.h). Only world rank 0 calls the writing functions. */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/fail.h"
#include "checkpoint/internal.h"
#include "checkpoint/checksum.h"
#include "models/fileio.h"
#include "checkpoint/json_float.h"

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

static int is_safetensors(const char *name) {
    const size_t n = strlen(name);
    return n >= 12 && !strcmp(name + n - 12, ".safetensors");
}

/* CRC-32C of DIR/NAME: of the whole file, or (header_only) of a safetensors file's header, the 8-byte length and
 * the JSON it gives (every tensor's dtype, shape, offsets and the CRC-32C of its bytes, which the reader checks:
 * so the header's checksum binds the data too, without reading gigabytes at every save and load). -1 when it
 * cannot be read (or its header length runs past its end). */
static long long crc_of(const char *dir, const char *name, int header_only) {
    char *path = moe_path_join(dir, name);
    FILE *f = path ? fopen(path, "rb") : NULL;
    free(path);
    if (!f) return -1;
    unsigned char buf[1 << 14];
    uint32_t crc = 0;
    unsigned long long left = ~0ull; /* bytes still to read */
    if (header_only) {
        unsigned char len[8];
        const long long size = moe_file_size(f);
        left = 0;
        if (size >= 8 && fread(len, 1, 8, f) == 8) {
            for (int i = 7; i >= 0; i--) left = left << 8 | len[i];
            crc = moe_crc32c(crc, len, 8);
        }
        if (size < 8 || left > (unsigned long long)size - 8) return fclose(f), -1;
    }
    size_t got;
    while (left && (got = fread(buf, 1, left < sizeof buf ? (size_t)left : sizeof buf, f)) > 0)
        crc = moe_crc32c(crc, buf, got), left -= header_only ? got : 0;
    long long out = ferror(f) || (header_only && left) ? -1 : (long long)crc;
    fclose(f);
    return out;
}

static int listed(const struct dirent *e) { return e->d_name[0] != '.' && strcmp(e->d_name, kManifest) != 0; }

moe_status moe__checkpoint_manifest_write(const char *dir, const char *run_id, const char *parent_run_id, int step,
                                          json_t *config, json_t *machine) {
    struct dirent **names;
    const int count = scandir(dir, &names, listed, alphasort); /* sorted: the manifest keeps its keys' order */
    if (count < 0)
        return json_decref(config), json_decref(machine),
               moe_fail(MOE_ERR_IO, "%s: cannot list: %s", dir, strerror(errno));
    json_t *files = json_object(), *crcs = json_object(), *header_crcs = json_object();
    moe_status st = MOE_OK;
    for (int i = 0; i < count; i++) {
        const char *name = names[i]->d_name;
        const int header_only = is_safetensors(name);
        const long long n = st == MOE_OK ? size_of(dir, name) : 0, crc = st == MOE_OK ? crc_of(dir, name, header_only) : 0;
        if (n < 0 || crc < 0) st = moe_fail(MOE_ERR_IO, "%s/%s: cannot read it back", dir, name);
        char hex[16];
        snprintf(hex, sizeof hex, "%08x", (unsigned)crc);
        if (st == MOE_OK) {
            json_object_set_new(files, name, json_integer(n));
            json_object_set_new(header_only ? header_crcs : crcs, name, json_string(hex));
        }
        free(names[i]);
    }
    free(names);
    json_t *m = json_pack("{s:s, s:s, s:s, s:i, s:I, s:o, s:o, s:o, s:o}", "format", kFormat, "run_id", run_id,
                          "parent_run_id", parent_run_id, "step", step, "saved_at_ns", (json_int_t)now_ns(), "files",
                          files, "crc32c", crcs, "header_crc32c", header_crcs, "config", config ? config : json_null());
    if (m && machine) json_object_set(m, "machine", machine);
    json_decref(machine);
    char *path = moe_path_join(dir, kManifest);
    if (st == MOE_OK && (!m || !path || !config)) st = MOE_ERR_OUT_OF_MEMORY;
    if (st == MOE_OK && (json_dump_file(m, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER | MOE_JSON_FLOATS) != 0 ||
                         moe_fsync_path(path) != 0))
        st = moe_fail(MOE_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    json_decref(m);
    free(path);
    return st;
}

static void legacy(moe__checkpoint_manifest *m) {
    *m = (moe__checkpoint_manifest){.step = -1, .saved_at_ns = 0, .num_files = -1};
    snprintf(m->run_id, sizeof m->run_id, "%s", kLegacy);
}

void moe__checkpoint_manifest_free(moe__checkpoint_manifest *m) {
    free(m->files);
    m->files = NULL, m->num_files = -1;
}

/* A run id as make_run_id writes it: 16 lowercase hex digits (it names files when pruning: no '/', no ".."). */
static int is_run_id(const char *s) {
    if (strlen(s) != 16) return 0;
    for (; *s; s++)
        if (!((*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'f'))) return 0;
    return 1;
}

/* A map of listed names to 8 hex digits (key "crc32c": whole files, "header_crc32c": safetensors headers; each
 * optional) into m->files; 0 with a reason in *why when it is not what the writer writes. */
static int read_crcs(json_t *crcs, int header, moe__checkpoint_manifest *m, const char **why) {
    const char *name;
    json_t *v;
    if (crcs && !json_is_object(crcs))
        return *why = header ? "\"header_crc32c\" is not an object" : "\"crc32c\" is not an object", 0;
    json_object_foreach(crcs, name, v) {
        const char *hex = json_string_value(v);
        char *end = NULL;
        unsigned long crc = hex && strlen(hex) == 8 ? strtoul(hex, &end, 16) : 0;
        moe__checkpoint_file *f = NULL;
        for (int i = 0; i < m->num_files && !f; i++) f = strcmp(m->files[i].name, name) ? NULL : &m->files[i];
        if (!hex || strlen(hex) != 8 || !end || *end || strspn(hex, "0123456789abcdef") != 8)
            return *why = "a checksum is not 8 hex digits", 0;
        if (!f) return *why = "a checksum names a file that \"files\" does not list", 0;
        if (f->crc_kind) return *why = "a file has two checksums", 0;
        f->crc_kind = header ? MOE__CRC_HEADER : MOE__CRC_WHOLE, f->crc = (unsigned)crc;
    }
    return 1;
}

/* "files" (plain names to byte counts) and their checksums into m->files; 0 with a reason in *why when one is not
 * what the writer writes. */
static int read_files(json_t *files, json_t *crcs, json_t *header_crcs, moe__checkpoint_manifest *m,
                      const char **why) {
    const char *name;
    json_t *v;
    if (!(m->files = calloc(json_object_size(files) + 1, sizeof *m->files))) return *why = "out of memory", 0;
    m->num_files = 0;
    json_object_foreach(files, name, v) {
        moe__checkpoint_file *f = &m->files[m->num_files++];
        if (!*name || name[0] == '.' || strchr(name, '/') || strlen(name) >= sizeof f->name)
            return *why = "a name in \"files\" is not a plain file name", 0;
        if (!json_is_integer(v) || json_integer_value(v) < 0)
            return *why = "a file size in \"files\" is not a byte count", 0;
        snprintf(f->name, sizeof f->name, "%s", name);
        f->nbytes = (long long)json_integer_value(v);
    }
    return read_crcs(crcs, 0, m, why) && read_crcs(header_crcs, 1, m, why);
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
    json_t *j = json_loadf(f, JSON_REJECT_DUPLICATES, &err), *files = json_object_get(j, "files");
    fclose(f);
    const char *format = json_string_value(json_object_get(j, "format")),
               *run = json_string_value(json_object_get(j, "run_id")),
               *parent = json_string_value(json_object_get(j, "parent_run_id")), *why = NULL;
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
    else if (!read_files(files, json_object_get(j, "crc32c"), json_object_get(j, "header_crc32c"), m, &why))
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: %s", path, why);
    if (st == MOE_OK) {
        snprintf(m->run_id, sizeof m->run_id, "%s", run);
        snprintf(m->parent_run_id, sizeof m->parent_run_id, "%s", parent);
        m->step = (int)json_integer_value(step);
        m->saved_at_ns = (long long)json_integer_value(saved);
        const char *dtype = json_string_value(json_object_get(json_object_get(j, "config"), "save_dtype"));
        m->is_export = dtype && strcmp(dtype, "f32") != 0;
    } else {
        moe__checkpoint_manifest_free(m);
        legacy(m);
    }
    json_decref(j);
    free(path);
    return st;
}

/* One file the manifest lists: its size, and its checksum where the manifest has one. */
static moe_status verify_file(const char *dir, const moe__checkpoint_file *f) {
    long long have = size_of(dir, f->name);
    if (have < 0)
        return moe_fail(MOE_ERR_BAD_FILE, "%s/%s is missing or not a regular file: the manifest lists it (%lld bytes)",
                        dir, f->name, f->nbytes);
    if (have != f->nbytes)
        return moe_fail(MOE_ERR_BAD_FILE, "%s/%s: %lld bytes, the manifest says %lld (truncated or grown)", dir,
                        f->name, have, f->nbytes);
    long long crc = f->crc_kind ? crc_of(dir, f->name, f->crc_kind == MOE__CRC_HEADER) : 0;
    if (crc < 0) /* unreadable, or a header whose length points past the file */
        return moe_fail(MOE_ERR_BAD_FILE, "%s/%s: %s (altered, or a file of another step or run put in its place)",
                        dir, f->name, f->crc_kind == MOE__CRC_HEADER
                                          ? "its header's length (the first 8 bytes) points past the end of the file"
                                          : "it cannot be read");
    if (f->crc_kind && crc != (long long)f->crc)
        return moe_fail(MOE_ERR_BAD_FILE, "%s/%s: its %s checksum %08llx, the manifest says %08x (altered, or a file "
                        "of another step or run put in its place)", dir, f->name,
                        f->crc_kind == MOE__CRC_HEADER ? "header (dtypes, shapes, tensor checksums) has" : "bytes have",
                        crc, f->crc);
    return MOE_OK;
}

moe_status moe__checkpoint_manifest_verify(const char *dir, const moe__checkpoint_manifest *m) {
    for (int i = 0; i < m->num_files; i++) MOE_TRY(verify_file(dir, &m->files[i]));
    return MOE_OK;
}

moe_status moe_checkpoint_verify_file(const char *dir, const char *name) {
    moe__checkpoint_manifest m;
    MOE_TRY(moe__checkpoint_manifest_read(dir, &m));
    moe_status st = moe__checkpoint_manifest_covers(dir, &m, name);
    for (int i = 0; i < m.num_files && st == MOE_OK; i++)
        if (!strcmp(m.files[i].name, name)) st = verify_file(dir, &m.files[i]);
    moe__checkpoint_manifest_free(&m);
    return st;
}

moe_status moe__checkpoint_manifest_covers(const char *dir, const moe__checkpoint_manifest *m, const char *name) {
    for (int i = 0; i < m->num_files; i++)
        if (!strcmp(m->files[i].name, name)) return MOE_OK;
    if (m->num_files < 0) return MOE_OK;
    return moe_fail(MOE_ERR_BAD_FILE, "%s/%s is not in the checkpoint's manifest.json (added after the save?)", dir,
                    name);
}

static int is_step_dir(const char *name, long *step) {
    char *end;
    if (strncmp(name, "step-", 5) || strlen(name) != 13) return 0;
    *step = strtol(name + 5, &end, 10);
    return *end == 0 && *step >= 0;
}

/* By step; the save time only breaks ties (a clock set wrong on one node must not make an old step "newest"). */
static int older(const void *pa, const void *pb) {
    const moe__checkpoint_manifest *a = &((const moe__checkpoint_entry *)pa)->manifest,
                                   *b = &((const moe__checkpoint_entry *)pb)->manifest;
    if (a->step != b->step) return a->step < b->step ? -1 : 1;
    return (a->saved_at_ns > b->saved_at_ns) - (a->saved_at_ns < b->saved_at_ns);
}

/* 1 when DIR holds no entry but . and .. (or cannot be read). */
static int is_empty_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 1;
    struct dirent *e;
    int empty = 1;
    while (empty && (e = readdir(d))) empty = !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..");
    closedir(d);
    return empty;
}

void moe__checkpoint_list_free(moe__checkpoint_entry *entries, int count) {
    for (int i = 0; i < count; i++) free(entries[i].path), moe__checkpoint_manifest_free(&entries[i].manifest);
    free(entries);
}

moe_status moe__checkpoint_list(const char *root, moe__checkpoint_entry **out, int *count, FILE *notes,
                                moe__checkpoint_skipped *skipped) {
    *out = NULL, *count = 0;
    if (skipped) *skipped = (moe__checkpoint_skipped){.count = 0, .step = -1};
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
        if (!(x->path = moe_path_join(root, e->d_name))) {
            st = MOE_ERR_OUT_OF_MEMORY;
            break;
        }
        moe_status read = moe__checkpoint_manifest_read(x->path, &x->manifest);
        if (read == MOE_ERR_OUT_OF_MEMORY) {
            free(x->path);
            st = read;
        } else if (read != MOE_OK || (x->manifest.num_files < 0 && is_empty_dir(x->path))) {
            /* an entry nobody can use is passed over, never fatal to the others (nor deleted: not ours to judge) */
            const char *why = read != MOE_OK ? moe_failure_message(read) : "an empty directory, not a checkpoint";
            if (notes) fprintf(notes, "moe-train: warning: %s is skipped: %s\n", x->path, why);
            if (skipped) skipped->count++;
            if (skipped && step > skipped->step) {
                skipped->step = step;
                snprintf(skipped->path, sizeof skipped->path, "%s", x->path);
                snprintf(skipped->why, sizeof skipped->why, "%s", why);
            }
            moe__checkpoint_manifest_free(&x->manifest);
            free(x->path);
        } else {
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

moe_status moe__checkpoint_refuse_skipped(const char *root, const moe__checkpoint_skipped *skipped,
                                          const char *where) {
    const char *name = strrchr(skipped->path, '/');
    name = name ? name + 1 : skipped->path;
    return moe_fail(MOE_ERR_INVALID_CONFIG,
                    "%s cannot be used as a checkpoint (%s); %s. A save never replaces a directory it cannot "
                    "identify (another run's, or a damaged one of this run's): look at it, then move it out of the "
                    "way under a name that is not step-NNNNNNNN (e.g. mv %s %s/damaged-%s) or delete it; or save "
                    "into another --checkpoint-dir",
                    skipped->path, skipped->why, where, skipped->path, root, name);
}

void moe__checkpoint_remove_dir(const char *dir) {
    /* a link (a step folder linked in from an archive) goes, never what it points to (a probe, 2026-12-07: pruning
     * a linked step emptied the archive's only copy) */
    struct stat sb;
    if (lstat(dir, &sb) != 0) return;
    if (S_ISLNK(sb.st_mode)) unlink(dir);
    if (!S_ISDIR(sb.st_mode)) return; /* another file is left as it is (a save it blocks fails, naming it) */
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

/* An existing ROOT/step-N may be replaced only by the run that saved it. */
static moe_status check_replaceable(const char *final, const char *run_id) {
    struct stat sb;
    if (stat(final, &sb) != 0) return MOE_OK;
    moe__checkpoint_manifest m;
    moe_status st = moe__checkpoint_manifest_read(final, &m);
    if (st == MOE_OK && !strcmp(m.run_id, run_id)) return moe__checkpoint_manifest_free(&m), MOE_OK;
    char why[512];
    snprintf(why, sizeof why, "%s", st == MOE_OK ? "" : moe_failure_message(st));
    moe_status refused = moe_fail(MOE_ERR_INVALID_CONFIG, "%s exists and %s%s%s: a save never replaces another run's "
                                  "checkpoint", final, st == MOE_OK ? "belongs to run " : "cannot be identified (",
                                  st == MOE_OK ? m.run_id : why, st == MOE_OK ? "" : ")");
    moe__checkpoint_manifest_free(&m);
    return refused;
}

moe_status moe__checkpoint_publish(const char *root, const char *tmp, int step, const char *run_id) {
    char *final = sibling(root, "step", step, NULL), *old = sibling(root, ".old-step", step, NULL);
    moe_status st = final && old ? MOE_OK : MOE_ERR_OUT_OF_MEMORY;
    if (st == MOE_OK) st = check_replaceable(final, run_id);
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
    MOE_TRY(moe__checkpoint_list(root, &list, &count, NULL, NULL)); /* what it skips was named at start */
    int resumable = -1; /* the run's newest f32 checkpoint: kept whatever bf16 exports came after it (a probe: a
                         * resumed run saving exports pruned the last state it could continue from) */
    for (int i = 0; i < count; i++) {
        mine += !strcmp(list[i].manifest.run_id, run_id);
        if (!strcmp(list[i].manifest.run_id, run_id) && !list[i].manifest.is_export) resumable = i;
    }
    /* kept: the run's keep_last newest, and besides them its newest f32 one (counting it among the newest deleted
     * the export just published: a probe, 2026-12-07) */
    moe_status st = MOE_OK;
    for (int i = 0, older = mine - keep_last; i < count && older > 0 && st == MOE_OK; i++) { /* oldest first */
        if (strcmp(list[i].manifest.run_id, run_id)) continue;
        older--; /* one of the run's checkpoints older than its keep_last newest */
        if (i == resumable) continue;
        char *trash = sibling(root, ".trash-step", list[i].manifest.step, run_id);
        if (!trash) st = MOE_ERR_OUT_OF_MEMORY;
        else if (rename(list[i].path, trash) != 0)
            st = moe_fail(MOE_ERR_IO, "%s: cannot move out of the way to delete it: %s", list[i].path, strerror(errno));
        else if (moe_fsync_path(root) != 0)
            st = moe_fail(MOE_ERR_IO, "%s: fsync of the directory failed: %s", root, strerror(errno));
        if (st == MOE_OK) moe__checkpoint_remove_dir(trash);
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
