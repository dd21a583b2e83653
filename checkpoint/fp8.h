/* fp8.h — weights stored in FP8 with a scale per block, as DeepSeek-V3's released checkpoints are: config.json says
 *   "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [b0, b1], ...}
 * and each quantized tensor W [R, C] (F8_E4M3) has beside it W_scale_inv [ceil(R / b0), ceil(C / b1)] (F32), so that
 *   W[i, j] = fp8(W[i, j]) x W_scale_inv[i / b0, j / b1]
 * in float32 (the product of a 4-bit-significand value and a float: one rounding). --init-from reads them so; a
 * checkpoint moe-train writes is F32 or BF16 (no quantization_config). */
#ifndef MOE_CHECKPOINT_FP8_H
#define MOE_CHECKPOINT_FP8_H

#include <jansson.h>
#include <stddef.h>

#include "checkpoint/safetensors_shards.h"

typedef struct {
    int rows, cols; /* b0, b1; 0, 0: the directory's config.json has no quantization_config */
} moe_fp8_blocks;

/* config.json's quantization_config (config: the parsed file at path, for messages; absent or null: 0, 0); another
 * method, format or block shape is refused naming the key. */
moe_status moe__checkpoint_fp8_blocks(const char *path, const json_t *config, moe_fp8_blocks *out);

/* For F8_E4M3 tensor `name` of (ndim, shape), read as float into w (NULL: only checked): its scale tensor's shape
 * checked and (w) each block of w multiplied by its scale. Refused: no quantization_config, a tensor that is not 2-D,
 * a missing scale. */
moe_status moe__checkpoint_fp8_scale(const moe_safetensors_set *set, const char *name, const moe_fp8_blocks *blocks,
                                     int ndim, const long *shape, float *w);

/* 1 when name is a block scale's (ends in "_scale_inv"), with its weight's name in base[n]. */
int moe__checkpoint_fp8_scale_of(const char *name, char *base, size_t n);

#endif
