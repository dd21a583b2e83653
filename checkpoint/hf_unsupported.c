/* hf_unsupported.c — the config.json keys no family here computes (hf_unsupported.h). */
#include "checkpoint/hf_unsupported.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

json_t *moe_hf_rope_scaling(json_t *config, const char **name) {
    json_t *x = json_object_get(config, *name = "rope_scaling");
    if (json_is_object(x)) return x;
    x = json_object_get(config, *name = "rope_parameters");
    return json_is_object(x) ? x : NULL;
}

const char *moe_hf_rope_type(json_t *scaling) {
    json_t *t = json_object_get(scaling, "rope_type");
    if (!t) t = json_object_get(scaling, "type");
    return !t ? "default" : json_string_value(t);
}

static int say(char *buf, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, n, fmt, ap);
    va_end(ap);
    return 1;
}

int moe_hf_config_unsupported(json_t *j, char *buf, size_t n) {
    const char *const rope_keys[] = {"rope_scaling", "rope_parameters"}, *name;
    for (int i = 0; i < 2; i++) {
        json_t *x = json_object_get(j, rope_keys[i]);
        if (x && !json_is_null(x) && !json_is_object(x))
            return say(buf, n, "%s must be an object or null", rope_keys[i]);
    }
    json_t *scaling = moe_hf_rope_scaling(j, &name);
    if (scaling && json_object_get(scaling, "factor") && !json_object_get(scaling, "rope_type") &&
        !json_object_get(scaling, "type")) /* else read as plain RoPE, its factor dropped */
        return say(buf, n, "%s has a factor but no rope_type (or type): which RoPE it scales is not said (transformers "
                   "refuses it too)", name);
    const char *rope_type = scaling ? moe_hf_rope_type(scaling) : "default";
    if (!rope_type || (strcmp(rope_type, "default") && strcmp(rope_type, "yarn")))
        return say(buf, n, "%s.rope_type must be \"default\" or \"yarn\" (RoPE here is plain or YaRN's)", name);
    json_t *truncate = scaling ? json_object_get(scaling, "truncate") : NULL;
    if (!strcmp(rope_type, "yarn") && truncate && !json_is_true(truncate))
        return say(buf, n, "%s.truncate must be true (YaRN's correction range rounded outward, transformers' default)",
                   name);
    for (int i = 0; i < 2; i++) {
        json_t *partial = json_object_get(i ? scaling : j, "partial_rotary_factor");
        if (partial && !json_is_null(partial) && !(json_is_number(partial) && json_number_value(partial) == 1))
            return say(buf, n, "%spartial_rotary_factor must be 1 (RoPE here rotates the whole head)",
                       i ? "rope_scaling." : "");
    }
    if (json_is_true(json_object_get(j, "attention_bias")))
        return say(buf, n, "attention_bias must be false (q/k/v/o here have no bias)");
    json_t *clip = json_object_get(j, "clip_qkv");
    if (clip && !json_is_null(clip)) return say(buf, n, "clip_qkv must be null (q, k and v are not clipped here)");
    return 0;
}
