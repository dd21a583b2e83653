/* checkpoint/json_float.h — float32 values in the project's text files (config.json, manifest.json, a --config file,
 * the metrics log): written as the shortest decimal that reads back as the same float, so that a value a user wrote
 * (1e-05) comes back as written and a saved configuration reads back bit for bit. Here, on the checkpoint floor,
 * because checkpoints write these files and the trainer above stands on it. */
#ifndef MOE_CHECKPOINT_JSON_FLOAT_H
#define MOE_CHECKPOINT_JSON_FLOAT_H

#include <jansson.h>
#include <stddef.h>

/* The float32 v as the shortest decimal that reads back as v ("1e-05", not "9.9999997473787516e-06"); integers of
 * up to 15 digits in full (10000, not 1e+04). */
void moe_format_float(float v, char *out, size_t nbytes);

/* float32 v as a JSON real holding its shortest decimal; dumped with MOE_JSON_FLOATS it is written as that
 * decimal (jansson's default precision, 17 digits, writes the widened double: 1.0000000000000001e-05). */
json_t *moe_json_float(float v);
#define MOE_JSON_FLOATS JSON_REAL_PRECISION(9)

#endif
