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

/* JSON values that say the same: numbers by value (10000 and 10000.0), the rest by jansson's equality */
static int same_value(json_t *a, json_t *b) {
    if (json_is_number(a) && json_is_number(b)) return json_number_value(a) == json_number_value(b);
    return json_equal(a, b);
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
    /* both keys (transformers 4's and 5's) where they disagree: which one a reader takes differs (transformers 5's
     * rope_parameters wins there), so the file says two things (a probe, 2026-12-07: rope_scaling won here) */
    json_t *old = json_object_get(j, "rope_scaling"), *now = json_object_get(j, "rope_parameters");
    const char *key;
    json_t *value;
    if (json_is_object(old) && json_is_object(now))
        json_object_foreach(old, key, value) {
            json_t *other = json_object_get(now, key);
            if (other && !same_value(value, other))
                return say(buf, n, "rope_scaling.%s and rope_parameters.%s disagree: give RoPE's scaling once", key,
                           key);
        }
    json_t *theta = json_object_get(j, "rope_theta");
    json_t *theta_now = json_is_object(now) ? json_object_get(now, "rope_theta") : NULL;
    if (theta && theta_now && !same_value(theta, theta_now))
        return say(buf, n, "rope_theta and rope_parameters.rope_theta disagree: give it once");
    json_t *factor = scaling ? json_object_get(scaling, "factor") : NULL;
    if (!strcmp(rope_type, "yarn") && json_is_number(factor) && json_number_value(factor) <= 0) /* 0: read as none */
        return say(buf, n, "%s.factor must be at least 1 (YaRN extends the context by it)", name);
    json_t *interleave = json_object_get(j, "rope_interleave");
    if (interleave && !json_is_boolean(interleave))
        return say(buf, n, "rope_interleave must be true or false (DeepSeek's RoPE row order)");
    json_t *scaled = json_object_get(j, "routed_scaling_factor");
    if (scaled && !json_is_null(scaled) && !(json_is_number(scaled) && json_number_value(scaled) > 0))
        return say(buf, n, "routed_scaling_factor must be a number above 0 (the routed experts' output is scaled by "
                   "it)");
    /* transformers' DeepSeek-V2 and V3 keep 1e-6 in their q/kv latent norms whatever rms_norm_eps says; moe-train's
     * take it (a probe, 2026-12-07: V2 was not checked, and computed another function from the file, silently) */
    json_t *type = json_object_get(j, "model_type"), *eps = json_object_get(j, "rms_norm_eps");
    const char *kind = json_is_string(type) ? json_string_value(type) : "";
    if ((!strcmp(kind, "deepseek_v3") || !strcmp(kind, "deepseek_v2")) && json_is_number(eps) &&
        (float)json_number_value(eps) != 1e-6f)
        return say(buf, n, "rms_norm_eps must be 1e-6 in a %s config.json (transformers' latent norms keep 1e-6 "
                   "whatever it says, moe-train's take it: the two would compute different functions)", kind);
    if (json_is_true(json_object_get(j, "attention_bias")))
        return say(buf, n, "attention_bias must be false (q/k/v/o here have no bias)");
    json_t *freq = json_object_get(j, "moe_layer_freq"); /* DeepSeek's: MoE layers between dense ones */
    if (freq && !json_is_null(freq) && !(json_is_integer(freq) && json_integer_value(freq) == 1))
        return say(buf, n, "moe_layer_freq must be 1 (every layer after the first_k_dense_replace dense ones is an "
                   "MoE layer here; a probe, 2026-12-07: it was ignored)");
    json_t *clip = json_object_get(j, "clip_qkv");
    if (clip && !json_is_null(clip)) return say(buf, n, "clip_qkv must be null (q, k and v are not clipped here)");
    return 0;
}
