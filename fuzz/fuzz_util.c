/* fuzz_util.c — temporary files, the shared checks and the tiny runs of the fuzz targets (fuzz_util.h). */
#include "fuzz/fuzz_util.h"

#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/fail.h"
#include "kernels/cast.h"
#include "checkpoint/internal.h"

/* ---- temporary files ------------------------------------------------------------------------------------ */

enum { MAX_TEMP_FILES = 8 };
static char *temp_dir;
static struct {
    char *name, *path;
} temp_files[MAX_TEMP_FILES];

static void remove_temp_dir(void) {
    for (int i = 0; i < MAX_TEMP_FILES && temp_files[i].path; i++) unlink(temp_files[i].path);
    if (temp_dir) rmdir(temp_dir);
}

const char *fuzz_temp_dir(void) {
    if (temp_dir) return temp_dir;
    const char *base = getenv("TMPDIR");
    size_t n = strlen(base && *base ? base : "/tmp") + 32;
    if (!(temp_dir = malloc(n))) abort();
    snprintf(temp_dir, n, "%s/moe-fuzz-XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(temp_dir)) {
        perror(temp_dir);
        abort();
    }
    atexit(remove_temp_dir);
    return temp_dir;
}

const char *fuzz_temp_path(const char *name) {
    int i = 0;
    for (; i < MAX_TEMP_FILES && temp_files[i].name; i++)
        if (!strcmp(temp_files[i].name, name)) return temp_files[i].path;
    if (i == MAX_TEMP_FILES) abort();
    const char *dir = fuzz_temp_dir();
    size_t n = strlen(dir) + strlen(name) + 2;
    temp_files[i].name = strdup(name);
    temp_files[i].path = malloc(n);
    if (!temp_files[i].name || !temp_files[i].path) abort();
    snprintf(temp_files[i].path, n, "%s/%s", dir, name);
    return temp_files[i].path;
}

void fuzz_write_file(const char *path, const uint8_t *data, size_t nbytes) {
    FILE *f = fopen(path, "wb");
    if (!f || (nbytes && fwrite(data, 1, nbytes, f) != nbytes) || fclose(f) != 0) {
        perror(path);
        abort();
    }
}

/* ---- checks --------------------------------------------------------------------------------------------- */

void fuzz_invalid(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "fuzz: accepted invalid input: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    abort();
}

void fuzz_check_failure(int status, const char *what) {
    if (status == MOE_OK || status == MOE_ERR_OUT_OF_MEMORY) return;
    const char *message = moe_failure_message((moe_status)status);
    if (!strstr(message, what)) {
        fprintf(stderr, "fuzz: a failure (%s) whose message does not name %s: %s\n", moe_status_string(status),
                what, message);
        abort();
    }
}

/* ---- the tiny runs (fuzz/make_corpus.sh's flags: keep both the same) ------------------------------------ */

static const char *const kTinyFlags[FUZZ_TINY_RUNS][32] = {
    {"moe-train", "--layers", "1", "--d-model", "8", "--heads", "2", "--kv-heads", "2", "--d-ff", "8", "--experts",
     "2", "--top-k", "1", "--seq-len", "8", "--batch", "2", "--vocab", "64", "--steps", "3", "--warmup", "1", NULL},
    {"moe-train", "--layers", "2", "--d-model", "4", "--heads", "2", "--kv-heads", "2", "--d-ff", "4", "--experts",
     "4", "--top-k", "2", "--seq-len", "8", "--batch", "2", "--vocab", "64", "--score", "sigmoid", "--moe-every", "2",
     "--tie-embeddings", "1", "--steps", "3", "--warmup", "1", NULL},
};

const moe_train_options *fuzz_tiny_run(int which) {
    static moe_train_options runs[FUZZ_TINY_RUNS];
    static int parsed[FUZZ_TINY_RUNS];
    if (!parsed[which]) {
        int argc = 0;
        while (kTinyFlags[which][argc]) argc++;
        if (moe_train_options_parse(argc, (char **)kTinyFlags[which], 1, &runs[which], stderr) != 0) abort();
        parsed[which] = 1;
    }
    return &runs[which];
}

/* ---- the saved step ------------------------------------------------------------------------------------- */

/* The saved step's rule, written out again: one or more decimal digits whose value is at most INT_MAX; -1 for
 * anything else. */
static long long step_value(const char *text) {
    long long v = 0;
    if (!text || !*text) return -1;
    for (const char *c = text; *c; c++) {
        if (*c < '0' || *c > '9') return -1;
        v = 10 * v + (*c - '0');
        if (v > INT_MAX) return -1;
    }
    return v;
}

void fuzz_check_step(const char *text, const char *path) {
    int step = -1;
    moe_failure_clear();
    moe_status st = moe__checkpoint_parse_step(text, path, &step);
    long long want = step_value(text);
    if (st == MOE_OK && (want < 0 || step != want))
        fuzz_invalid("%s: the saved step '%s' read as %d", path, text, step);
    if (st != MOE_OK && want >= 0)
        fuzz_invalid("%s: the valid step '%s' was refused", path, text);
    fuzz_check_failure(st, path);
}

/* ---- safetensors ---------------------------------------------------------------------------------------- */

static uint64_t le64(const uint8_t *b) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)b[i] << (8 * i);
    return v;
}

/* The header of an accepted file, parsed here on its own: all of it one JSON object (HF's rule: JSON, padded
 * with spaces), "__metadata__" a map of strings, and as many tensors as the reader lists. */
static void check_header(const char *path, const uint8_t *data, size_t header_nbytes, int num_tensors) {
    json_error_t err;
    json_t *root = json_loadb((const char *)data + 8, header_nbytes, 0, &err);
    if (!json_is_object(root))
        fuzz_invalid("%s: the reader took a header whose %zu bytes are not one JSON object (%s)", path, header_nbytes,
                     err.text);
    json_t *meta = json_object_get(root, "__metadata__");
    const char *key;
    json_t *value;
    if (meta && !json_is_object(meta)) fuzz_invalid("%s: __metadata__ is not an object", path);
    json_object_foreach(meta, key, value) if (!json_is_string(value))
        fuzz_invalid("%s: __metadata__ value of %s is not a string", path, key);
    if ((int)json_object_size(root) - (meta != NULL) != num_tensors)
        fuzz_invalid("%s: the header has %d tensors, the reader lists %d", path,
                     (int)json_object_size(root) - (meta != NULL), num_tensors);
    json_decref(root);
}

/* Reads tensor t with shape (ndim, shape): the values must be the file's bytes when it succeeds (F32), or those
 * bytes converted (BF16: the top half of a float; F16: moe_f16_to_float). */
static void read_back(moe_safetensors_file *f, const moe_safetensors_tensor *t, int ndim, const long *shape,
                      const uint8_t *bytes, size_t count) {
    float *dst = malloc((count ? count : 1) * sizeof(float)), *want = malloc((count ? count : 1) * sizeof(float));
    if (!dst || !want) abort();
    moe_failure_clear();
    moe_status st = moe_safetensors_read(f, t->name, ndim, shape, dst);
    const int dtype = moe_safetensors_dtype_parse(t->dtype);
    const size_t element_nbytes = dtype == MOE_SAFETENSORS_F32 ? 4 : dtype == MOE_SAFETENSORS_F8_E4M3 ? 1 : 2;
    if (st == MOE_OK) {
        int same_shape = ndim == t->ndim;
        for (int d = 0; same_shape && d < ndim; d++) same_shape = shape[d] == t->shape[d];
        if (!same_shape || dtype < 0)
            fuzz_invalid("%s: tensor %s (%s, %d dims) read with another shape or dtype", f->path, t->name, t->dtype,
                         t->ndim);
        if (t->end - t->begin != count * element_nbytes)
            fuzz_invalid("%s: tensor %s: %zu values read from %zu bytes", f->path, t->name, count, t->end - t->begin);
        for (size_t i = 0; i < count; i++) {
            if (dtype == MOE_SAFETENSORS_F32) {
                memcpy(&want[i], bytes + 4 * i, 4);
            } else if (dtype == MOE_SAFETENSORS_F8_E4M3) { /* one byte a value (a harness false alarm, 2026-12-08) */
                want[i] = moe_fp8_e4m3_to_float(bytes[i]);
            } else {
                const uint16_t half = (uint16_t)(bytes[2 * i] | bytes[2 * i + 1] << 8);
                want[i] = dtype == MOE_SAFETENSORS_BF16 ? moe_bf16_to_float(half) : moe_f16_to_float(half);
            }
        }
        if (count && memcmp(dst, want, count * sizeof(float)))
            fuzz_invalid("%s: tensor %s: the values read are not the file's bytes", f->path, t->name);
    } else {
        fuzz_check_failure(st, f->path);
    }
    free(dst), free(want);
}

void fuzz_open_safetensors(const char *path, const uint8_t *data, size_t nbytes, moe_safetensors_file *f,
                           int *opened) {
    moe_failure_clear();
    moe_status st = moe_safetensors_open(path, f);
    *opened = st == MOE_OK;
    if (st != MOE_OK) return fuzz_check_failure(st, path);
    const uint64_t header_nbytes = nbytes >= 8 ? le64(data) : UINT64_MAX;
    if (header_nbytes > nbytes - 8) fuzz_invalid("%s: a header of %llu bytes in %zu", path,
                                                 (unsigned long long)header_nbytes, nbytes);
    check_header(path, data, header_nbytes, f->num_tensors);
    const size_t data_start = 8 + header_nbytes, data_nbytes = nbytes - data_start;
    size_t covered = 0; /* packed back to back (no two sharing bytes, below): their sizes add up to the data */
    for (int i = 0; i < f->num_tensors; i++) {
        const moe_safetensors_tensor *a = &f->tensors[i];
        if (a->begin > a->end || a->end > data_nbytes)
            fuzz_invalid("%s: tensor %s at [%zu, %zu) of %zu data bytes", path, a->name, a->begin, a->end, data_nbytes);
        for (int j = 0; j < i; j++) {
            const moe_safetensors_tensor *b = &f->tensors[j];
            if (a->begin < a->end && b->begin < b->end && a->begin < b->end && b->begin < a->end)
                fuzz_invalid("%s: tensors %s [%zu, %zu) and %s [%zu, %zu) share bytes", path, a->name, a->begin,
                             a->end, b->name, b->begin, b->end);
        }
        covered += a->end - a->begin;
    }
    if (covered != data_nbytes)
        fuzz_invalid("%s: the tensors hold %zu of the %zu data bytes (a gap, or bytes after them)", path, covered,
                     data_nbytes);
    for (int i = 0; i < f->num_tensors; i++) {
        const moe_safetensors_tensor *t = &f->tensors[i];
        if (t->ndim < 0 || t->ndim > MOE_SAFETENSORS_MAX_DIMS)
            fuzz_invalid("%s: tensor %s has %d dimensions", path, t->name, t->ndim);
        size_t count = 1;
        int fits = 1;
        for (int d = 0; fits && d < t->ndim; d++)
            fits = t->shape[d] >= 0 && !__builtin_mul_overflow(count, (size_t)t->shape[d], &count);
        /* a shape that cannot be the file's bytes, a byte a value at the least: no model asks for it (a count of a
         * quarter of the bytes kept 2-byte and 1-byte tensors from being read back: fuzzing, 2026-12-08) */
        if (!fits || count > data_nbytes + 1) continue;
        read_back(f, t, t->ndim, t->shape, data + data_start + t->begin, count);
        /* one more dimension of 1: another shape with the same count, which the reader must refuse */
        if (t->ndim < MOE_SAFETENSORS_MAX_DIMS) {
            long longer[MOE_SAFETENSORS_MAX_DIMS] = {0};
            memcpy(longer, t->shape, (size_t)t->ndim * sizeof(long));
            longer[t->ndim] = 1;
            moe_failure_clear();
            st = moe_safetensors_read(f, t->name, t->ndim + 1, longer, NULL);
            if (st == MOE_OK) fuzz_invalid("%s: tensor %s read with one dimension more", path, t->name);
            fuzz_check_failure(st, path);
        }
    }
    const char *missing = "fuzz.no.such.tensor";
    if (!moe_safetensors_find(f, missing)) {
        moe_failure_clear();
        if ((st = moe_safetensors_read(f, missing, 1, (long[]){1}, NULL)) == MOE_OK)
            fuzz_invalid("%s: a missing tensor was read", path);
        fuzz_check_failure(st, path);
    }
}
