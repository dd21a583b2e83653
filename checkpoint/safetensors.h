/* safetensors.h — reading and writing safetensors files (Hugging Face's format).
 *
 *   [8 bytes: little-endian u64 N] [N bytes: JSON header, space-padded to a multiple of 8] [data]
 *   header: {"NAME": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...,
 *            "__metadata__": {"key": "string value", ...}}
 *
 * Dtypes: F32, BF16, F16 and F8_E4M3 are read, each converted exactly to float32 (every bf16, half and fp8 value is a
 * float; NaN and Inf pass through unchanged, for the caller's finite check to refuse); F32 and BF16 are written (BF16
 * rounded to nearest even; a finite value that rounds past the largest bf16 is refused, not stored as Inf).
 *
 * The header is written with jansson with sorted keys and the data in the order given, so saving the
 * same tensors twice gives the same bytes. The writer stores each tensor's CRC-32C in the metadata
 * ("crc32c:NAME": 8 hex digits); moe_safetensors_read verifies it when present and names a corrupt tensor.
 * Readers validate everything (a regular file, header length, the whole header one JSON object, metadata
 * values strings, dtype, shape against byte count, offsets inside the file and not overlapping) and report
 * problems as a sentence naming the file and the tensor. */
#ifndef MOE_CHECKPOINT_SAFETENSORS_H
#define MOE_CHECKPOINT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "moe/moe.h"

enum { MOE_SAFETENSORS_MAX_DIMS = 4, MOE_SAFETENSORS_MAX_NAME = 128 };

/* How a tensor is stored; 0 (F32) is the default of a zeroed entry. */
typedef enum {
    MOE_SAFETENSORS_F32 = 0,
    MOE_SAFETENSORS_BF16 = 1,
    MOE_SAFETENSORS_F16 = 2,
    MOE_SAFETENSORS_F8_E4M3 = 3 /* read only: DeepSeek-V3's released weights, scaled by blocks (checkpoint/fp8.h) */
} moe_safetensors_dtype;

typedef struct {
    const char *name;
    int ndim;
    long shape[MOE_SAFETENSORS_MAX_DIMS];
    const float *data; /* product(shape) floats */
    moe_safetensors_dtype dtype; /* written as F32 or BF16 (F16 and F8_E4M3 are read only) */
} moe_safetensors_entry;

/* "F32", "BF16", "F16", "F8_E4M3"; and back: -1 for a dtype this reader does not convert. */
const char *moe_safetensors_dtype_name(moe_safetensors_dtype d);
int moe_safetensors_dtype_parse(const char *name);
/* The bytes the entries' data take in a file (the sum over entries of count * element size). */
size_t moe_safetensors_data_nbytes(const moe_safetensors_entry *entries, int num_entries);

typedef struct {
    const char *key, *value;
} moe_safetensors_meta;

/* Writes path (not atomically: see checkpoint/checkpoint.c) and fsyncs it. */
moe_status moe_safetensors_write(const char *path, const moe_safetensors_entry *entries, int num_entries,
                                 const moe_safetensors_meta *meta, int num_meta);

/* One file written by several processes, each storing the tensors it holds (checkpoint/write.c: nobody
 * gathers the model). The entries alone fix the layout (their data pointers are not read here):
 * moe_safetensors_layout gives where the data starts, each tensor's byte offset in the file (offsets[num_entries])
 * and the file's size; a writer stores a tensor's bytes at its offset (moe_safetensors_store_at: F32, or BF16
 * rounded as moe_safetensors_write rounds; *crc gets their CRC-32C); once every tensor's CRC-32C is known, one
 * process writes the header (crcs[num_entries]). The file is then byte for byte what moe_safetensors_write makes
 * from the same entries. The descriptors are the caller's (opened for writing, fsynced and closed by it). */
moe_status moe_safetensors_layout(const char *path, const moe_safetensors_entry *entries, int num_entries,
                                  const moe_safetensors_meta *meta, int num_meta, size_t *data_start, size_t *offsets,
                                  size_t *file_nbytes);
moe_status moe_safetensors_store_at(const char *path, int fd, size_t at, const moe_safetensors_entry *e, uint32_t *crc);
moe_status moe_safetensors_write_header(const char *path, int fd, const moe_safetensors_entry *entries, int num_entries,
                                        const moe_safetensors_meta *meta, int num_meta, const uint32_t *crcs);

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

/* Checks that tensor `name` exists with shape == (ndim, shape) in a dtype the reader converts, and that its
 * byte count fits the shape; reads nothing. */
moe_status moe_safetensors_check(const moe_safetensors_file *f, const char *name, int ndim, const long *shape);
/* moe_safetensors_check, then reads the tensor into dst as float32 (converted from BF16, F16 or F8_E4M3), verifying the
 * checksum of its stored bytes when the file has them. */
moe_status moe_safetensors_read(moe_safetensors_file *f, const char *name, int ndim, const long *shape, float *dst);

#endif
