/* safetensors.c — the safetensors container (format in safetensors.h), float32, with jansson. */
#include "models/safetensors.h"

#include <errno.h>
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/fail.h"
#include <unistd.h>

static size_t element_count(int ndim, const long *shape) {
    size_t n = 1;
    for (int i = 0; i < ndim; i++) n *= (size_t)shape[i];
    return n;
}

moe_status moe_safetensors_write(const char *path, const moe_safetensors_entry *entries, int num_entries,
                                 const moe_safetensors_meta *meta, int num_meta) {
    json_t *root = json_object(), *md = json_object();
    size_t offset = 0;
    for (int i = 0; i < num_entries; i++) {
        const moe_safetensors_entry *e = &entries[i];
        json_t *shape = json_array();
        for (int d = 0; d < e->ndim; d++) json_array_append_new(shape, json_integer(e->shape[d]));
        size_t nbytes = element_count(e->ndim, e->shape) * sizeof(float);
        json_object_set_new(root, e->name,
                            json_pack("{s:s, s:o, s:[I, I]}", "dtype", "F32", "shape", shape, "data_offsets",
                                      (json_int_t)offset, (json_int_t)(offset + nbytes)));
        offset += nbytes;
    }
    for (int i = 0; i < num_meta; i++) json_object_set_new(md, meta[i].key, json_string(meta[i].value));
    json_object_set_new(root, "__metadata__", md);
    char *header = json_dumps(root, JSON_SORT_KEYS | JSON_COMPACT);
    json_decref(root);
    if (!header) return moe_fail(MOE_ERR_OUT_OF_MEMORY, "%s: cannot build the header", path);
    size_t header_nbytes = strlen(header), padded = (header_nbytes + 7) / 8 * 8;
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(header);
        return moe_fail(MOE_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    }
    unsigned char size_le[8];
    for (int b = 0; b < 8; b++) size_le[b] = (unsigned char)((uint64_t)padded >> (8 * b));
    int ok = fwrite(size_le, 1, 8, f) == 8 && fwrite(header, 1, header_nbytes, f) == header_nbytes;
    for (size_t i = header_nbytes; ok && i < padded; i++) ok = fputc(' ', f) != EOF;
    for (int i = 0; ok && i < num_entries; i++) {
        size_t count = element_count(entries[i].ndim, entries[i].shape);
        ok = fwrite(entries[i].data, sizeof(float), count, f) == count; /* little-endian hosts only */
    }
    ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
    ok = fclose(f) == 0 && ok;
    free(header);
    return ok ? MOE_OK : moe_fail(MOE_ERR_IO, "%s: write failed: %s", path, strerror(errno));
}

/* ---- reading ---------------------------------------------------------------------------------- */

static moe_status parse_tensor(moe_safetensors_file *f, const char *name, json_t *v, moe_safetensors_tensor *t) {
    if (strlen(name) >= MOE_SAFETENSORS_MAX_NAME)
        return moe_fail(MOE_ERR_BAD_FILE, "%s: tensor name too long: %.60s...", f->path, name);
    snprintf(t->name, sizeof t->name, "%s", name);
    json_t *dtype = json_object_get(v, "dtype"), *shape = json_object_get(v, "shape"),
           *offsets = json_object_get(v, "data_offsets");
    if (!json_is_string(dtype) || !json_is_array(shape) || !json_is_array(offsets) || json_array_size(offsets) != 2 ||
        json_array_size(shape) > MOE_SAFETENSORS_MAX_DIMS)
        return moe_fail(MOE_ERR_BAD_FILE, "%s: tensor %s: malformed header entry", f->path, name);
    snprintf(t->dtype, sizeof t->dtype, "%s", json_string_value(dtype));
    t->ndim = (int)json_array_size(shape);
    for (int d = 0; d < t->ndim; d++) {
        json_t *dim = json_array_get(shape, d);
        if (!json_is_integer(dim) || json_integer_value(dim) < 0)
            return moe_fail(MOE_ERR_BAD_FILE, "%s: tensor %s: bad shape", f->path, name);
        t->shape[d] = (long)json_integer_value(dim);
    }
    json_t *b = json_array_get(offsets, 0), *e = json_array_get(offsets, 1);
    if (!json_is_integer(b) || !json_is_integer(e) || json_integer_value(b) < 0 ||
        json_integer_value(e) < json_integer_value(b))
        return moe_fail(MOE_ERR_BAD_FILE, "%s: tensor %s: bad data_offsets", f->path, name);
    t->begin = (size_t)json_integer_value(b), t->end = (size_t)json_integer_value(e);
    if (f->data_start + t->end > f->file_nbytes)
        return moe_fail(MOE_ERR_BAD_FILE, "%s: tensor %s: data ends at byte %zu but the file has %zu (truncated?)",
                        f->path, name, f->data_start + t->end, f->file_nbytes);
    return MOE_OK;
}

moe_status moe_safetensors_open(const char *path, moe_safetensors_file *f) {
    memset(f, 0, sizeof *f);
    snprintf(f->path, sizeof f->path, "%s", path);
    if (!(f->file = fopen(path, "rb"))) return moe_fail(MOE_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    unsigned char size_le[8];
    moe_status st = MOE_OK;
    fseek(f->file, 0, SEEK_END);
    f->file_nbytes = (size_t)ftell(f->file);
    rewind(f->file);
    uint64_t header_nbytes = 0;
    if (fread(size_le, 1, 8, f->file) != 8) st = moe_fail(MOE_ERR_BAD_FILE, "%s: truncated: no header size", path);
    for (int b = 0; st == MOE_OK && b < 8; b++) header_nbytes |= (uint64_t)size_le[b] << (8 * b);
    if (st == MOE_OK && (header_nbytes < 2 || header_nbytes > f->file_nbytes - 8 || header_nbytes > (100u << 20)))
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: header of %llu bytes does not fit in the %zu-byte file", path,
                  (unsigned long long)header_nbytes, f->file_nbytes);
    char *header = st == MOE_OK ? malloc(header_nbytes + 1) : NULL;
    if (st == MOE_OK && (!header || fread(header, 1, header_nbytes, f->file) != header_nbytes))
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: cannot read the header", path);
    json_t *root = NULL;
    if (st == MOE_OK) {
        header[header_nbytes] = 0;
        json_error_t err;
        root = json_loads(header, 0, &err);
        if (!json_is_object(root))
            st = moe_fail(MOE_ERR_BAD_FILE, "%s: the header is not a JSON object (%s)", path, err.text);
    }
    free(header);
    f->data_start = 8 + header_nbytes;
    if (st == MOE_OK) f->tensors = calloc(json_object_size(root) + 1, sizeof(moe_safetensors_tensor));
    const char *key;
    json_t *value;
    if (st == MOE_OK) json_object_foreach(root, key, value) {
            if (!strcmp(key, "__metadata__")) {
                f->metadata = json_incref(value);
                continue;
            }
            if ((st = parse_tensor(f, key, value, &f->tensors[f->num_tensors])) != MOE_OK) break;
            f->num_tensors++;
        }
    json_decref(root);
    if (st != MOE_OK) moe_safetensors_close(f);
    return st;
}

void moe_safetensors_close(moe_safetensors_file *f) {
    if (f->file) fclose(f->file);
    json_decref(f->metadata);
    free(f->tensors);
    memset(f, 0, sizeof *f);
}

const moe_safetensors_tensor *moe_safetensors_find(const moe_safetensors_file *f, const char *name) {
    for (int i = 0; i < f->num_tensors; i++)
        if (!strcmp(f->tensors[i].name, name)) return &f->tensors[i];
    return NULL;
}

const char *moe_safetensors_metadata(const moe_safetensors_file *f, const char *key) {
    json_t *v = f->metadata ? json_object_get(f->metadata, key) : NULL;
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static void format_shape(char *buf, size_t n, int ndim, const long *shape) {
    size_t at = snprintf(buf, n, "[");
    for (int d = 0; d < ndim && at < n; d++) at += snprintf(buf + at, n - at, "%s%ld", d ? ", " : "", shape[d]);
    if (at < n) snprintf(buf + at, n - at, "]");
}

moe_status moe_safetensors_read(moe_safetensors_file *f, const char *name, int ndim, const long *shape, float *dst) {
    const moe_safetensors_tensor *t = moe_safetensors_find(f, name);
    if (!t) return moe_fail(MOE_ERR_BAD_FILE, "%s: tensor %s is missing", f->path, name);
    if (strcmp(t->dtype, "F32"))
        return moe_fail(MOE_ERR_BAD_FILE, "%s: tensor %s has dtype %s; only F32 is supported", f->path, name, t->dtype);
    int same = t->ndim == ndim;
    for (int d = 0; same && d < ndim; d++) same = t->shape[d] == shape[d];
    if (!same) {
        char want[64], got[64];
        format_shape(want, sizeof want, ndim, shape), format_shape(got, sizeof got, t->ndim, t->shape);
        return moe_fail(MOE_ERR_BAD_FILE, "%s: tensor %s has shape %s, the model needs %s", f->path, name, got, want);
    }
    size_t count = element_count(ndim, shape);
    if (t->end - t->begin != count * sizeof(float))
        return moe_fail(MOE_ERR_BAD_FILE, "%s: tensor %s: %zu data bytes for %zu floats", f->path, name,
                    t->end - t->begin, count);
    if (fseek(f->file, (long)(f->data_start + t->begin), SEEK_SET) != 0 ||
        fread(dst, sizeof(float), count, f->file) != count)
        return moe_fail(MOE_ERR_IO, "%s: tensor %s: read failed", f->path, name);
    return MOE_OK;
}
