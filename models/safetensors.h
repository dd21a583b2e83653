/* safetensors.h — reading and writing safetensors files (Hugging Face's format), float32 tensors only.
 *
 *   [8 bytes: little-endian u64 N] [N bytes: JSON header, space-padded to a multiple of 8] [data]
 *   header: {"NAME": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...,
 *            "__metadata__": {"key": "string value", ...}}
 *
 * The header is written with jansson with sorted keys and the data in the order given, so saving the
 * same tensors twice gives the same bytes. The writer stores each tensor's CRC-32C in the metadata
 * ("crc32c:NAME": 8 hex digits); moe_safetensors_read verifies it when present and names a corrupt tensor.
 * Readers validate everything (a regular file, header length, the whole header one JSON object, metadata
 * values strings, dtype, shape against byte count, offsets inside the file and not overlapping) and report
 * problems as a sentence naming the file and the tensor. */
#ifndef MOE_MODELS_SAFETENSORS_H
#define MOE_MODELS_SAFETENSORS_H

#include <stddef.h>
#include <stdio.h>

#include "moe/moe.h"

enum { MOE_SAFETENSORS_MAX_DIMS = 4, MOE_SAFETENSORS_MAX_NAME = 128 };

typedef struct {
    const char *name;
    int ndim;
    long shape[MOE_SAFETENSORS_MAX_DIMS];
    const float *data; /* product(shape) floats */
} moe_safetensors_entry;

typedef struct {
    const char *key, *value;
} moe_safetensors_meta;

/* Writes path (not atomically: see models/checkpoint.c) and fsyncs it. */
moe_status moe_safetensors_write(const char *path, const moe_safetensors_entry *entries, int num_entries,
                                 const moe_safetensors_meta *meta, int num_meta);

typedef struct {
    char name[MOE_SAFETENSORS_MAX_NAME];
    char dtype[8];
    int ndim;
    long shape[MOE_SAFETENSORS_MAX_DIMS];
    size_t begin, end; /* byte offsets in the data section */
} moe_safetensors_tensor;

typedef struct {
    char *path;
    FILE *file;
    size_t data_start, file_nbytes;
    moe_safetensors_tensor *tensors;
    int num_tensors;
    void *metadata; /* json_t * */
    int has_checksums; /* the metadata holds tensor checksums: every tensor must have one */
} moe_safetensors_file;

moe_status moe_safetensors_open(const char *path, moe_safetensors_file *f);
void moe_safetensors_close(moe_safetensors_file *f);
const moe_safetensors_tensor *moe_safetensors_find(const moe_safetensors_file *f, const char *name);
const char *moe_safetensors_metadata(const moe_safetensors_file *f, const char *key); /* NULL when absent */

/* Reads tensor `name` into dst after checking dtype F32 and shape == (ndim, shape). */
moe_status moe_safetensors_read(moe_safetensors_file *f, const char *name, int ndim, const long *shape, float *dst);

#endif
