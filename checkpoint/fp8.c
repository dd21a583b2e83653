/* fp8.c — FP8 weights with block scales (formats and rules: fp8.h). */
#include "checkpoint/fp8.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fail.h"

static const char kScaleSuffix[] = "_scale_inv";

moe_status moe__checkpoint_fp8_blocks(const char *path, const json_t *config, moe_fp8_blocks *out) {
    *out = (moe_fp8_blocks){0, 0};
    json_t *q = json_object_get(config, "quantization_config");
    moe_status st = MOE_OK;
    if (q && !json_is_null(q)) {
        const char *method = json_string_value(json_object_get(q, "quant_method"));
        json_t *fmt = json_object_get(q, "fmt"), *size = json_object_get(q, "weight_block_size");
        json_t *b0 = json_array_get(size, 0), *b1 = json_array_get(size, 1);
        if (!json_is_object(q) || !method || strcmp(method, "fp8"))
            st = moe_fail(MOE_ERR_BAD_FILE, "%s: quantization_config.quant_method must be \"fp8\" (DeepSeek-V3's block "
                          "scaled weights; no other quantized checkpoint is read)", path);
        else if (fmt && !(json_is_string(fmt) && !strcmp(json_string_value(fmt), "e4m3")))
            st = moe_fail(MOE_ERR_BAD_FILE, "%s: quantization_config.fmt must be \"e4m3\" (F8_E4M3 weights)", path);
        else if (json_array_size(size) != 2 || !json_is_integer(b0) || !json_is_integer(b1) ||
                 json_integer_value(b0) < 1 || json_integer_value(b1) < 1 || json_integer_value(b0) > 1 << 20 ||
                 json_integer_value(b1) > 1 << 20)
            st = moe_fail(MOE_ERR_BAD_FILE, "%s: quantization_config.weight_block_size must be two positive integers "
                          "(rows and columns of a scale's block; per-tensor scales are not read)", path);
        else
            *out = (moe_fp8_blocks){(int)json_integer_value(b0), (int)json_integer_value(b1)};
    }
    return st;
}

int moe__checkpoint_fp8_scale_of(const char *name, char *base, size_t n) {
    const size_t len = strlen(name), suffix = sizeof kScaleSuffix - 1;
    if (len <= suffix || strcmp(name + len - suffix, kScaleSuffix) || len - suffix >= n) return 0;
    memcpy(base, name, len - suffix), base[len - suffix] = 0;
    return 1;
}

moe_status moe__checkpoint_fp8_scale(const moe_safetensors_set *set, const char *name, const moe_fp8_blocks *blocks,
                                     int ndim, const long *shape, float *w) {
    if (!blocks->rows)
        return moe_fail(MOE_ERR_BAD_FILE, "tensor %s is F8_E4M3 but config.json has no quantization_config (the "
                        "block size of its scales)", name);
    if (ndim != 2) return moe_fail(MOE_ERR_BAD_FILE, "tensor %s is F8_E4M3 but not a matrix", name);
    char scale_name[MOE_SAFETENSORS_MAX_NAME + sizeof kScaleSuffix];
    snprintf(scale_name, sizeof scale_name, "%s%s", name, kScaleSuffix);
    moe_safetensors_file *f = moe_safetensors_set_file(set, scale_name);
    if (!f) return moe_fail(MOE_ERR_BAD_FILE, "tensor %s is F8_E4M3 but %s (its block scales) is missing", name,
                            scale_name);
    const long R = shape[0], C = shape[1], b0 = blocks->rows, b1 = blocks->cols;
    const long grid[2] = {(R + b0 - 1) / b0, (C + b1 - 1) / b1};
    if (!w) return moe_safetensors_check(f, scale_name, 2, grid);
    float *scale = malloc((size_t)grid[0] * grid[1] * sizeof *scale);
    if (!scale) return MOE_ERR_OUT_OF_MEMORY;
    moe_status st = moe_safetensors_read(f, scale_name, 2, grid, scale);
    for (long i = 0; st == MOE_OK && i < R; i++)
        for (long j = 0; j < C; j++) w[i * C + j] *= scale[(i / b0) * grid[1] + j / b1];
    free(scale);
    return st;
}
