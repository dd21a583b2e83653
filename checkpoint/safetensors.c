/* safetensors.c — the safetensors container (format in safetensors.h): F32, BF16 and F16 read as float32, F32 and
 * BF16 written; the header with jansson. */
#include "checkpoint/safetensors.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/fail.h"
#include "kernels/cast.h"
#include "checkpoint/checksum.h"
#include "models/fileio.h"

/* __metadata__ key of a tensor's CRC-32C: the prefix, then the tensor's name */
#define CRC_KEY_PREFIX "crc32c:"

static size_t element_count(int ndim, const long *shape) {
    size_t n = 1;
    for (int i = 0; i < ndim; i++) n *= (size_t)shape[i];
    return n;
}

/* ---- dtypes ----------------------------------------------------------------------------------- */

static const struct {
    const char *name;
    size_t nbytes;
} kDtypes[] = {[MOE_SAFETENSORS_F32] = {"F32", 4}, [MOE_SAFETENSORS_BF16] = {"BF16", 2},
               [MOE_SAFETENSORS_F16] = {"F16", 2}, [MOE_SAFETENSORS_F8_E4M3] = {"F8_E4M3", 1}};
enum { NUM_DTYPES = sizeof kDtypes / sizeof kDtypes[0], CHUNK = 1 << 16 /* elements converted at a time */ };

const char *moe_safetensors_dtype_name(moe_safetensors_dtype d) {
    return (unsigned)d < NUM_DTYPES ? kDtypes[d].name : "?";
}

int moe_safetensors_dtype_parse(const char *name) {
    for (int d = 0; d < NUM_DTYPES; d++)
        if (!strcmp(name, kDtypes[d].name)) return d;
    return -1;
}

size_t moe_safetensors_data_nbytes(const moe_safetensors_entry *entries, int num_entries) {
    size_t n = 0;
    for (int i = 0; i < num_entries; i++)
        n += element_count(entries[i].ndim, entries[i].shape) * kDtypes[entries[i].dtype].nbytes;
    return n;
}

/* ---- writing ---------------------------------------------------------------------------------- */

/* Where stored bytes go: a stream (f), or a descriptor at a position (pwrite: several writers of one file). */
typedef struct {
    FILE *f;
    int fd;
    size_t at;
} sink;

static int sink_write(sink *out, const void *data, size_t nbytes) {
    if (out->f) return fwrite(data, 1, nbytes, out->f) == nbytes;
    for (const char *p = data; nbytes;) {
        const ssize_t n = pwrite(out->fd, p, nbytes, (off_t)out->at);
        if (n <= 0) return 0;
        p += n, nbytes -= (size_t)n, out->at += (size_t)n;
    }
    return 1;
}

/* The bytes of entry e as stored, CHUNK elements at a time: each chunk goes to crc (when not NULL) and to
 * out (when not NULL). A BF16 entry is rounded here, and a finite value that becomes Inf is refused. */
static moe_status store_entry(const char *path, const moe_safetensors_entry *e, moe_bf16 *buf, uint32_t *crc,
                              sink *out) {
    const size_t count = element_count(e->ndim, e->shape);
    if (e->dtype == MOE_SAFETENSORS_F32) { /* little-endian hosts only */
        if (crc) *crc = moe_crc32c(0, e->data, count * sizeof(float));
        return !out || sink_write(out, e->data, count * sizeof(float)) ? MOE_OK : MOE_ERR_IO;
    }
    if (e->dtype != MOE_SAFETENSORS_BF16)
        return moe_fail(MOE_ERR_INVALID_ARG, "%s: tensor %s: only F32 and BF16 are written", path, e->name);
    if (crc) *crc = 0;
    for (size_t at = 0; at < count; at += CHUNK) {
        const size_t n = count - at < CHUNK ? count - at : CHUNK;
        moe_bf16_from_float_n(e->data + at, n, buf);
        for (size_t j = 0; crc && j < n; j++)
            if ((buf[j] & 0x7F80u) == 0x7F80u && isfinite(e->data[at + j]))
                return moe_fail(MOE_ERR_NONFINITE, "%s: tensor %s[%zu] = %g does not fit in bf16 (it would round to "
                                "Inf): save it as F32", path, e->name, at + j, (double)e->data[at + j]);
        if (crc) *crc = moe_crc32c(*crc, buf, n * sizeof *buf);
        if (out && !sink_write(out, buf, n * sizeof *buf)) return MOE_ERR_IO;
    }
    return MOE_OK;
}

/* The header: every tensor's dtype, shape, offsets, and its stored bytes' CRC-32C (crcs[i]) in the metadata. Its
 * length does not depend on the checksums' values (8 hex digits each). */
static moe_status build_header(const char *path, const moe_safetensors_entry *entries, int num_entries,
                               const moe_safetensors_meta *meta, int num_meta, const uint32_t *crcs, char **out) {
    json_t *root = json_object(), *md = json_object();
    size_t offset = 0;
    for (int i = 0; i < num_entries; i++) {
        const moe_safetensors_entry *e = &entries[i];
        json_t *shape = json_array();
        for (int d = 0; d < e->ndim; d++) json_array_append_new(shape, json_integer(e->shape[d]));
        size_t nbytes = moe_safetensors_data_nbytes(e, 1);
        json_object_set_new(root, e->name,
                            json_pack("{s:s, s:o, s:[I, I]}", "dtype", moe_safetensors_dtype_name(e->dtype), "shape",
                                      shape, "data_offsets", (json_int_t)offset, (json_int_t)(offset + nbytes)));
        char key[MOE_SAFETENSORS_MAX_NAME + 16], text[16];
        snprintf(key, sizeof key, "%s%s", CRC_KEY_PREFIX, e->name);
        snprintf(text, sizeof text, "%08x", crcs ? crcs[i] : 0u);
        json_object_set_new(md, key, json_string(text));
        offset += nbytes;
    }
    for (int i = 0; i < num_meta; i++) json_object_set_new(md, meta[i].key, json_string(meta[i].value));
    json_object_set_new(root, "__metadata__", md);
    *out = json_dumps(root, JSON_SORT_KEYS | JSON_COMPACT);
    json_decref(root);
    return *out ? MOE_OK : moe_fail(MOE_ERR_OUT_OF_MEMORY, "%s: cannot build the header", path);
}

/* The 8-byte length, the header and its padding to a multiple of 8. */
static int write_header(sink *out, const char *header) {
    const size_t header_nbytes = strlen(header), padded = (header_nbytes + 7) / 8 * 8;
    unsigned char size_le[8];
    for (int b = 0; b < 8; b++) size_le[b] = (unsigned char)((uint64_t)padded >> (8 * b));
    static const char spaces[8] = "        ";
    return sink_write(out, size_le, 8) && sink_write(out, header, header_nbytes) &&
           sink_write(out, spaces, padded - header_nbytes);
}

moe_status moe_safetensors_write(const char *path, const moe_safetensors_entry *entries, int num_entries,
                                 const moe_safetensors_meta *meta, int num_meta) {
    moe_bf16 *buf = malloc(CHUNK * sizeof *buf);
    uint32_t *crcs = calloc((size_t)num_entries + 1, sizeof *crcs);
    char *header = NULL;
    moe_status st = buf && crcs ? MOE_OK : MOE_ERR_OUT_OF_MEMORY;
    for (int i = 0; i < num_entries && st == MOE_OK; i++) st = store_entry(path, &entries[i], buf, &crcs[i], NULL);
    if (st == MOE_OK) st = build_header(path, entries, num_entries, meta, num_meta, crcs, &header);
    sink out = {0};
    if (st == MOE_OK && !(out.f = fopen(path, "wb"))) st = moe_fail(MOE_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    if (st != MOE_OK) return free(buf), free(crcs), free(header), st;
    int ok = write_header(&out, header);
    for (int i = 0; ok && i < num_entries; i++) ok = store_entry(path, &entries[i], buf, NULL, &out) == MOE_OK;
    ok = ok && fflush(out.f) == 0 && fsync(fileno(out.f)) == 0;
    ok = fclose(out.f) == 0 && ok;
    free(header), free(buf), free(crcs);
    return ok ? MOE_OK : moe_fail(MOE_ERR_IO, "%s: write failed: %s", path, strerror(errno));
}

moe_status moe_safetensors_layout(const char *path, const moe_safetensors_entry *entries, int num_entries,
                                  const moe_safetensors_meta *meta, int num_meta, size_t *data_start, size_t *offsets,
                                  size_t *file_nbytes) {
    char *header = NULL;
    MOE_TRY(build_header(path, entries, num_entries, meta, num_meta, NULL, &header));
    *data_start = 8 + (strlen(header) + 7) / 8 * 8;
    free(header);
    size_t at = 0;
    for (int i = 0; i < num_entries; i++) offsets[i] = *data_start + at, at += moe_safetensors_data_nbytes(&entries[i], 1);
    *file_nbytes = *data_start + at;
    return MOE_OK;
}

moe_status moe_safetensors_store_at(const char *path, int fd, size_t at, const moe_safetensors_entry *e, uint32_t *crc) {
    moe_bf16 *buf = e->dtype == MOE_SAFETENSORS_BF16 ? malloc(CHUNK * sizeof *buf) : NULL;
    if (e->dtype == MOE_SAFETENSORS_BF16 && !buf) return MOE_ERR_OUT_OF_MEMORY;
    sink out = {.fd = fd, .at = at};
    moe_status st = store_entry(path, e, buf, crc, &out);
    free(buf);
    if (st == MOE_ERR_IO) st = moe_fail(st, "%s: cannot write tensor %s: %s", path, e->name, strerror(errno));
    return st;
}

moe_status moe_safetensors_write_header(const char *path, int fd, const moe_safetensors_entry *entries, int num_entries,
                                        const moe_safetensors_meta *meta, int num_meta, const uint32_t *crcs) {
    char *header = NULL;
    MOE_TRY(build_header(path, entries, num_entries, meta, num_meta, crcs, &header));
    sink out = {.fd = fd, .at = 0};
    const int ok = write_header(&out, header);
    free(header);
    return ok ? MOE_OK : moe_fail(MOE_ERR_IO, "%s: cannot write the header: %s", path, strerror(errno));
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
    size_t bytes_at_most = 8; /* the elements times the widest dtype's bytes: it must not wrap (fuzzing, 2026-12-08: a
                               * shape [2^62 + 1, 2] of BF16 counted 4 bytes, and widening it wrote far past them) */
    for (int d = 0; d < t->ndim; d++) {
        json_t *dim = json_array_get(shape, d);
        if (!json_is_integer(dim) || json_integer_value(dim) < 0)
            return moe_fail(MOE_ERR_BAD_FILE, "%s: tensor %s: bad shape", f->path, name);
        t->shape[d] = (long)json_integer_value(dim);
        if (__builtin_mul_overflow(bytes_at_most, (size_t)t->shape[d], &bytes_at_most))
            return moe_fail(MOE_ERR_BAD_FILE, "%s: tensor %s: its shape's element count overflows", f->path, name);
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

/* "__metadata__" is a map from strings to strings (the format's rule; Hugging Face's reader refuses others). */
static moe_status check_metadata(const moe_safetensors_file *f, json_t *metadata) {
    const char *key;
    json_t *value;
    if (!json_is_object(metadata)) return moe_fail(MOE_ERR_BAD_FILE, "%s: __metadata__ is not an object", f->path);
    json_object_foreach(metadata, key, value) if (!json_is_string(value))
        return moe_fail(MOE_ERR_BAD_FILE, "%s: __metadata__ entry %.60s is not a string", f->path, key);
    return MOE_OK;
}

static int by_begin(const void *pa, const void *pb) {
    const moe_safetensors_tensor *a = *(const moe_safetensors_tensor *const *)pa,
                                 *b = *(const moe_safetensors_tensor *const *)pb;
    return (a->begin > b->begin) - (a->begin < b->begin);
}

/* The tensors' data packed back to back over the whole data section, as the format has it (the safetensors library
 * refuses the rest): no two tensors sharing bytes (one would load the other's values), and no gap and nothing after
 * the last (bytes that belong to no tensor: another file's layout, or an edit; accepted until 2026-12-07, a probe). */
static moe_status check_packed(moe_safetensors_file *f) {
    const moe_safetensors_tensor **order = malloc((size_t)(f->num_tensors + 1) * sizeof *order);
    if (!order) return MOE_ERR_OUT_OF_MEMORY;
    for (int i = 0; i < f->num_tensors; i++) order[i] = &f->tensors[i];
    qsort(order, f->num_tensors, sizeof *order, by_begin);
    moe_status st = MOE_OK;
    size_t at = 0; /* where the next tensor must begin */
    for (int i = 0; i < f->num_tensors && st == MOE_OK; i++) {
        if (i > 0 && order[i]->begin < order[i - 1]->end)
            st = moe_fail(MOE_ERR_BAD_FILE, "%s: tensors %s and %s overlap (data_offsets [%zu, %zu) and [%zu, %zu))",
                          f->path, order[i - 1]->name, order[i]->name, order[i - 1]->begin, order[i - 1]->end,
                          order[i]->begin, order[i]->end);
        else if (order[i]->begin > at)
            st = moe_fail(MOE_ERR_BAD_FILE, "%s: %zu bytes of data before tensor %s belong to no tensor (data_offsets "
                          "[%zu, %zu)): a safetensors file packs its tensors back to back", f->path,
                          order[i]->begin - at, order[i]->name, order[i]->begin, order[i]->end);
        at = order[i]->end > at ? order[i]->end : at;
    }
    const size_t data_nbytes = f->file_nbytes - f->data_start;
    if (st == MOE_OK && at != data_nbytes)
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: %zu bytes after the last tensor's data belong to no tensor (the tensors "
                      "end at data byte %zu of %zu)", f->path, data_nbytes - at, at, data_nbytes);
    free(order);
    return st;
}

moe_status moe_safetensors_open(const char *path, moe_safetensors_file *f) {
    memset(f, 0, sizeof *f);
    if (!(f->path = strdup(path))) return MOE_ERR_OUT_OF_MEMORY;
    moe_status st = moe_file_open_regular(path, &f->file);
    if (st != MOE_OK) return moe_safetensors_close(f), st;
    unsigned char size_le[8];
    f->file_nbytes = (size_t)moe_file_size(f->file);
    uint64_t header_nbytes = 0;
    if (fread(size_le, 1, 8, f->file) != 8) st = moe_fail(MOE_ERR_BAD_FILE, "%s: truncated: no header size", path);
    for (int b = 0; st == MOE_OK && b < 8; b++) header_nbytes |= (uint64_t)size_le[b] << (8 * b);
    if (st == MOE_OK && (header_nbytes < 2 || header_nbytes > f->file_nbytes - 8 || header_nbytes > (100u << 20)))
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: header of %llu bytes does not fit in the %zu-byte file", path,
                  (unsigned long long)header_nbytes, f->file_nbytes);
    char *header = st == MOE_OK ? malloc(header_nbytes) : NULL;
    if (st == MOE_OK && (!header || fread(header, 1, header_nbytes, f->file) != header_nbytes))
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: cannot read the header", path);
    json_t *root = NULL;
    if (st == MOE_OK) {
        /* all header_nbytes bytes: a NUL would end a C string early and hide the bytes after it (a header
         * length that reaches into the data, say) */
        const char *nul = memchr(header, 0, header_nbytes);
        json_error_t err;
        if (!nul) root = json_loadb(header, header_nbytes, JSON_REJECT_DUPLICATES, &err);
        if (nul)
            st = moe_fail(MOE_ERR_BAD_FILE, "%s: the %llu-byte header holds a NUL byte at byte %zu (a wrong header "
                          "length?)", path, (unsigned long long)header_nbytes, (size_t)(nul - header));
        else if (!json_is_object(root))
            st = moe_fail(MOE_ERR_BAD_FILE, "%s: the header is not a JSON object (%s)", path, err.text);
    }
    free(header);
    f->data_start = 8 + header_nbytes;
    if (st == MOE_OK) f->tensors = calloc(json_object_size(root) + 1, sizeof(moe_safetensors_tensor));
    const char *key;
    json_t *value;
    if (st == MOE_OK) json_object_foreach(root, key, value) {
            if (!strcmp(key, "__metadata__")) {
                if ((st = check_metadata(f, value)) != MOE_OK) break;
                f->metadata = json_incref(value);
                continue;
            }
            if ((st = parse_tensor(f, key, value, &f->tensors[f->num_tensors])) != MOE_OK) break;
            f->num_tensors++;
        }
    json_decref(root);
    if (st == MOE_OK) st = check_packed(f);
    if (st == MOE_OK && f->metadata) { /* written by moe_safetensors_write: every tensor must carry its checksum */
        const char *mkey;
        json_t *mvalue;
        json_object_foreach(f->metadata, mkey, mvalue) f->has_checksums |= !strncmp(mkey, CRC_KEY_PREFIX, strlen(CRC_KEY_PREFIX));
    }
    if (st != MOE_OK) moe_safetensors_close(f);
    return st;
}

void moe_safetensors_close(moe_safetensors_file *f) {
    if (f->file) fclose(f->file);
    json_decref(f->metadata);
    free(f->tensors);
    free(f->path);
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

/* The checksum the writer stored for the tensor (files from other tools have none: nothing to verify). */
static moe_status verify_checksum(const moe_safetensors_file *f, const moe_safetensors_tensor *t, const void *data,
                                  size_t nbytes) {
    char key[MOE_SAFETENSORS_MAX_NAME + 16];
    snprintf(key, sizeof key, "%s%s", CRC_KEY_PREFIX, t->name);
    const char *saved = moe_safetensors_metadata(f, key);
    if (!saved && f->has_checksums)
        return moe_fail(MOE_ERR_BAD_FILE, "%s: tensor %s has no checksum although the file's others do (the header "
                                          "was altered)", f->path, t->name);
    if (!saved) return MOE_OK;
    char got[16];
    snprintf(got, sizeof got, "%08x", moe_crc32c(0, data, nbytes));
    if (strcmp(got, saved))
        return moe_fail(MOE_ERR_BAD_FILE, "%s: tensor %s is corrupt: its %zu bytes have checksum %s, the file says %s",
                        f->path, t->name, nbytes, got, saved);
    return MOE_OK;
}

moe_status moe_safetensors_check(const moe_safetensors_file *f, const char *name, int ndim, const long *shape) {
    const moe_safetensors_tensor *t = moe_safetensors_find(f, name);
    if (!t) return moe_fail(MOE_ERR_BAD_FILE, "%s: tensor %s is missing", f->path, name);
    const int dtype = moe_safetensors_dtype_parse(t->dtype);
    if (dtype < 0)
        return moe_fail(MOE_ERR_BAD_FILE, "%s: tensor %s has dtype %s; supported are F32, BF16, F16 and F8_E4M3",
                        f->path, name, t->dtype);
    int same = t->ndim == ndim;
    for (int d = 0; same && d < ndim; d++) same = t->shape[d] == shape[d];
    if (!same) {
        char want[64], got[64];
        format_shape(want, sizeof want, ndim, shape), format_shape(got, sizeof got, t->ndim, t->shape);
        return moe_fail(MOE_ERR_BAD_FILE, "%s: tensor %s has shape %s, the model needs %s", f->path, name, got, want);
    }
    size_t count = element_count(ndim, shape);
    if (t->end - t->begin != count * kDtypes[dtype].nbytes)
        return moe_fail(MOE_ERR_BAD_FILE, "%s: tensor %s: %zu data bytes for %zu %s values", f->path, name,
                        t->end - t->begin, count, t->dtype);
    return MOE_OK;
}

moe_status moe_safetensors_read(moe_safetensors_file *f, const char *name, int ndim, const long *shape, float *dst) {
    MOE_TRY(moe_safetensors_check(f, name, ndim, shape));
    const moe_safetensors_tensor *t = moe_safetensors_find(f, name);
    const size_t count = element_count(ndim, shape), nbytes = t->end - t->begin;
    if (fseeko(f->file, (off_t)(f->data_start + t->begin), SEEK_SET) != 0 || fread(dst, 1, nbytes, f->file) != nbytes)
        return moe_fail(MOE_ERR_IO, "%s: tensor %s: read failed", f->path, name);
    MOE_TRY(verify_checksum(f, t, dst, nbytes));
    /* narrower values widened in place from the end: value i (bytes [w i, w (i + 1)) of width w < 4) is read before
     * bytes 4i.. are written */
    const unsigned char *raw = (const unsigned char *)dst;
    const int dtype = moe_safetensors_dtype_parse(t->dtype);
    for (size_t i = count; dtype == MOE_SAFETENSORS_F8_E4M3 && i-- > 0;) dst[i] = moe_fp8_e4m3_to_float(raw[i]);
    for (size_t i = count; (dtype == MOE_SAFETENSORS_BF16 || dtype == MOE_SAFETENSORS_F16) && i-- > 0;) {
        const uint16_t bits = (uint16_t)(raw[2 * i] | raw[2 * i + 1] << 8);
        dst[i] = dtype == MOE_SAFETENSORS_BF16 ? moe_bf16_to_float(bits) : moe_f16_to_float(bits);
    }
    return MOE_OK;
}
