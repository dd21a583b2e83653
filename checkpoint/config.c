/* checkpoint/config.c — what a checkpoint says about the model and the run: config.json (Hugging Face Mixtral's,
 * or our variant's for a model Mixtral cannot compute; written, read, and checked on load), the run's
 * fingerprint, and the step. */
#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fail.h"
#include "checkpoint/internal.h"
#include "models/fileio.h"
#include "checkpoint/json_float.h"

/* The fields of config.json that define the function a model computes, one table for reading, writing, comparing
 * and the --init-from / --resume resolution of moe-train's flags (train/config.c). Keys in "moe_train"
 * are ours; absent (a Mixtral saved by transformers), they take Mixtral's semantics: a softmax router whose k
 * gates are renormalised (at any k, so k = 1 gives gate 1), no capacity limit, an MoE FFN in every layer. The
 * top-level keys absent take transformers' MixtralConfig defaults (rope_theta 1e6, rms_norm_eps 1e-5, untied);
 * the shapes are required. */
typedef enum { FIELD_INT, FIELD_FLOAT, FIELD_BOOL, FIELD_SCORE, FIELD_DROP } field_kind;
typedef struct {
    const char *key;
    int in_moe_train;      /* 1: inside the "moe_train" object */
    int policy;            /* 1: the routing policy of training (--init-from may train with another) */
    field_kind kind;
    size_t offset;         /* in moe_model_config */
    int required;
    double mixtral;        /* the value when absent (not required) */
} arch_field;

#define MC(field) offsetof(moe_model_config, field)
static const arch_field kFields[] = {
    {"vocab_size", 0, 0, FIELD_INT, MC(vocab_size), 1, 0},
    {"hidden_size", 0, 0, FIELD_INT, MC(d_model), 1, 0},
    {"intermediate_size", 0, 0, FIELD_INT, MC(d_ff), 1, 0},
    {"num_hidden_layers", 0, 0, FIELD_INT, MC(num_layers), 1, 0},
    {"num_attention_heads", 0, 0, FIELD_INT, MC(num_heads), 1, 0},
    {"num_key_value_heads", 0, 0, FIELD_INT, MC(num_kv_heads), 1, 0},
    {"num_local_experts", 0, 0, FIELD_INT, MC(moe.num_experts), 1, 0},
    {"num_experts_per_tok", 0, 0, FIELD_INT, MC(moe.top_k), 1, 0},
    {"tie_word_embeddings", 0, 0, FIELD_BOOL, MC(tie_embeddings), 0, 0},
    {"rope_theta", 0, 0, FIELD_FLOAT, MC(rope_theta), 0, 1e6},
    {"rms_norm_eps", 0, 0, FIELD_FLOAT, MC(norm_eps), 0, 1e-5},
    {"moe_every", 1, 0, FIELD_INT, MC(moe_every), 0, 1},
    {"score_func", 1, 0, FIELD_SCORE, MC(moe.score_func), 0, MOE_SCORE_SOFTMAX},
    {"renormalize", 1, 0, FIELD_BOOL, MC(moe.renormalize), 0, 1},
    {"capacity_factor", 1, 1, FIELD_FLOAT, MC(moe.capacity_factor), 0, 0},
    {"drop_priority", 1, 1, FIELD_DROP, MC(moe.drop_priority), 0, MOE_DROP_BY_TOKEN_ORDER},
};
#define NUM_FIELDS (int)(sizeof kFields / sizeof kFields[0])
static const char *const kScoreNames[] = {"softmax", "sigmoid"}, *const kDropNames[] = {"token", "score"};

static double field_value(const moe_model_config *c, const arch_field *f) {
    const void *p = (const char *)c + f->offset;
    if (f->kind == FIELD_FLOAT) {
        float v = *(const float *)p;
        return f->offset == MC(moe.capacity_factor) && v <= 0 ? 0 : v; /* every cf <= 0 is dropless */
    }
    return *(const int *)p;
}

static void set_field(moe_model_config *c, const arch_field *f, double v) {
    void *p = (char *)c + f->offset;
    if (f->kind == FIELD_FLOAT) *(float *)p = (float)v;
    else *(int *)p = (int)v;
}

/* value as config.json writes it: "softmax", true, 1e-05, 8 */
static void field_text(const arch_field *f, double v, char *out, size_t n) {
    switch (f->kind) {
    case FIELD_INT: snprintf(out, n, "%d", (int)v); break;
    case FIELD_FLOAT: moe_format_float((float)v, out, n); break;
    case FIELD_BOOL: snprintf(out, n, "%s", v ? "true" : "false"); break;
    case FIELD_SCORE: snprintf(out, n, "\"%s\"", kScoreNames[(int)v]); break;
    case FIELD_DROP: snprintf(out, n, "\"%s\"", kDropNames[(int)v]); break;
    }
}

int moe_checkpoint_num_fields(void) { return NUM_FIELDS; }

moe_checkpoint_field moe_checkpoint_field_at(const moe_model_config *c, int i) {
    const arch_field *f = &kFields[i];
    moe_checkpoint_field r = {.key = f->key, .offset = f->offset, .value = field_value(c, f), .policy = f->policy};
    if (f->in_moe_train) snprintf(r.path, sizeof r.path, "moe_train.%s", f->key);
    else snprintf(r.path, sizeof r.path, "%s", f->key);
    field_text(f, r.value, r.text, sizeof r.text);
    return r;
}

void moe_checkpoint_field_set(moe_model_config *c, int i, double value) { set_field(c, &kFields[i], value); }


int moe_checkpoint_is_mixtral(const moe_model_config *c, char *why, size_t n) {
    const moe_config *q = &c->moe;
    const char *reasons[6];
    int count = 0;
    if (q->num_experts < 2) reasons[count++] = "a dense model (one expert: Llama's mlp tensors)";
    if (c->moe_every != 1) reasons[count++] = "dense FFNs between the MoE layers (moe_every > 1)";
    if (q->score_func != MOE_SCORE_SOFTMAX) reasons[count++] = "sigmoid router scores with a selection bias";
    if (!q->renormalize)
        reasons[count++] = q->top_k == 1 ? "top-1 gates not renormalised (gate = router probability; Mixtral's is 1)"
                                         : "top-k gates not renormalised";
    if (q->capacity_factor > 0) reasons[count++] = "a capacity limit that drops tokens";
    if (why && n) {
        why[0] = 0;
        for (int i = 0; i < count; i++)
            snprintf(why + strlen(why), n - strlen(why), "%s%s", i ? "; " : "", reasons[i]);
    }
    return count == 0;
}

json_t *moe__checkpoint_config_json(const moe_model_config *c) {
    const moe_config *q = &c->moe;
    char why[512], note[768];
    const int mixtral = moe_checkpoint_is_mixtral(c, why, sizeof why);
    const int max_positions = c->max_positions > c->seq_len ? c->max_positions : c->seq_len;
    json_t *j = json_pack(
        "{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:b, s:s, s:s, s:o, s:b, s:n, s:f,"
        " s:{s:i, s:s, s:b, s:o, s:s, s:o, s:o, s:b, s:b, s:s}}",
        "architectures", mixtral ? MOE_CHECKPOINT_MIXTRAL : MOE_CHECKPOINT_VARIANT, "model_type",
        mixtral ? "mixtral" : MOE_CHECKPOINT_VARIANT_TYPE, "vocab_size", c->vocab_size, "hidden_size", c->d_model,
        "intermediate_size", c->d_ff, "num_hidden_layers", c->num_layers, "num_attention_heads", c->num_heads,
        "num_key_value_heads", c->num_kv_heads, "head_dim", c->d_model / c->num_heads, "max_position_embeddings",
        max_positions, "num_local_experts", q->num_experts, "num_experts_per_tok", q->top_k, "tie_word_embeddings",
        c->tie_embeddings, "hidden_act", "silu", "torch_dtype", "float32", "router_aux_loss_coef",
        moe_json_float(q->aux_loss_coef), "output_router_logits", 0, "sliding_window", "attention_dropout", 0.0,
        "moe_train", "moe_every", c->moe_every, "score_func", kScoreNames[q->score_func], "renormalize",
        q->renormalize, "capacity_factor", moe_json_float(q->capacity_factor > 0 ? q->capacity_factor : 0),
        "drop_priority", kDropNames[q->drop_priority], "z_loss_coef", moe_json_float(q->z_loss_coef), "bias_update_rate",
        moe_json_float(q->bias_update_rate), "router_selection_bias", q->score_func == MOE_SCORE_SIGMOID,
        "mixtral_compatible", mixtral, "precision", moe_precision_name(q->precision));
    if (!j) return NULL;
    json_object_set_new(j, "rope_theta", moe_json_float(c->rope_theta));
    json_object_set_new(j, "rms_norm_eps", moe_json_float(c->norm_eps));
    if (!mixtral) {
        snprintf(note, sizeof note,
                 "Not a Mixtral: %s. transformers' MixtralForCausalLM would compute another function from these "
                 "weights, so this model is labelled " MOE_CHECKPOINT_VARIANT " and loads in moe-train only "
                 "(docs/CHECKPOINTS.md).", why);
        json_object_set_new(j, "moe_train_note", json_string(note));
    }
    return j;
}

static const char *json_type_name(const json_t *v) {
    if (json_is_integer(v)) return "an integer";
    if (json_is_real(v)) return "a real number";
    if (json_is_string(v)) return "a string";
    if (json_is_boolean(v)) return "a boolean";
    if (json_is_null(v)) return "null";
    return json_is_array(v) ? "an array" : "an object";
}

/* One field of config.json into *v; 0 when absent and not required (v = Mixtral's), else an error. */
static moe_status read_field(const char *path, json_t *top, json_t *ours, const arch_field *f, double *v) {
    json_t *x = json_object_get(f->in_moe_train ? ours : top, f->key);
    const char *where = f->in_moe_train ? "moe_train." : "";
    if (!x) {
        if (f->required) return moe_fail(MOE_ERR_BAD_FILE, "%s: %s is missing", path, f->key);
        *v = f->mixtral;
        return MOE_OK;
    }
    const char *want = NULL;
    switch (f->kind) {
    case FIELD_INT:
        if (!json_is_integer(x)) want = "an integer";
        else if (json_integer_value(x) < INT_MIN || json_integer_value(x) > INT_MAX) want = "an int";
        else *v = (double)json_integer_value(x);
        break;
    case FIELD_FLOAT:
        if (!json_is_number(x) || !isfinite(json_number_value(x))) want = "a number";
        else *v = json_number_value(x);
        break;
    case FIELD_BOOL: /* renormalize was an integer 0/1 in moe_train's early files */
        if (json_is_boolean(x)) *v = json_is_true(x);
        else if (json_is_integer(x) && (json_integer_value(x) == 0 || json_integer_value(x) == 1))
            *v = (double)json_integer_value(x);
        else want = "true or false";
        break;
    case FIELD_SCORE:
    case FIELD_DROP: {
        const char *const *names = f->kind == FIELD_SCORE ? kScoreNames : kDropNames;
        const char *s = json_string_value(x);
        if (s && !strcmp(s, names[0])) *v = 0;
        else if (s && !strcmp(s, names[1])) *v = 1;
        else want = f->kind == FIELD_SCORE ? "\"softmax\" or \"sigmoid\"" : "\"token\" or \"score\"";
        break;
    }
    }
    if (want)
        return moe_fail(MOE_ERR_BAD_FILE, "%s: %s%s must be %s, not %s%s%s", path, where, f->key, want,
                        json_is_string(x) ? "\"" : "", json_is_string(x) ? json_string_value(x) : json_type_name(x),
                        json_is_string(x) ? "\"" : "");
    return MOE_OK;
}

/* architectures and model_type name a model this reads: Mixtral, or our variant */
static moe_status check_label(const char *path, json_t *j, int *variant) {
    json_t *arch = json_object_get(j, "architectures"), *type = json_object_get(j, "model_type");
    const char *name = json_is_array(arch) ? json_string_value(json_array_get(arch, 0)) : NULL;
    const char *model_type = json_string_value(type);
    if ((arch && (!name || json_array_size(arch) != 1)) || (type && !model_type))
        return moe_fail(MOE_ERR_BAD_FILE, "%s: architectures must be a list of one name and model_type a string", path);
    *variant = (name && !strcmp(name, MOE_CHECKPOINT_VARIANT)) ||
               (model_type && !strcmp(model_type, MOE_CHECKPOINT_VARIANT_TYPE));
    if (name && strcmp(name, MOE_CHECKPOINT_MIXTRAL) && strcmp(name, MOE_CHECKPOINT_VARIANT))
        return moe_fail(MOE_ERR_BAD_FILE, "%s: architectures is %s; moe-train reads " MOE_CHECKPOINT_MIXTRAL " and "
                        MOE_CHECKPOINT_VARIANT, path, name);
    if (model_type && strcmp(model_type, "mixtral") && strcmp(model_type, MOE_CHECKPOINT_VARIANT_TYPE))
        return moe_fail(MOE_ERR_BAD_FILE, "%s: model_type is %s; moe-train reads mixtral and "
                        MOE_CHECKPOINT_VARIANT_TYPE, path, model_type);
    return MOE_OK;
}

moe_status moe_checkpoint_read_config(const char *dir, moe_model_config *out, int *sliding_window) {
    char *path = moe_path_join(dir, "config.json");
    if (!path) return MOE_ERR_OUT_OF_MEMORY;
    FILE *file;
    moe_status st = moe_file_open_regular(path, &file);
    if (st != MOE_OK) return free(path), st;
    json_error_t err;
    json_t *j = json_loadf(file, 0, &err);
    fclose(file);
    if (!j || !json_is_object(j)) {
        st = j ? moe_fail(MOE_ERR_BAD_FILE, "%s: not a JSON object", path)
               : moe_fail(MOE_ERR_BAD_FILE, "%s: not JSON: %s (line %d)", path, err.text, err.line);
        json_decref(j);
        return free(path), st;
    }
    int variant = 0;
    json_t *ours = json_object_get(j, "moe_train"), *window = json_object_get(j, "sliding_window"),
           *act = json_object_get(j, "hidden_act"), *head_dim = json_object_get(j, "head_dim"),
           *positions = json_object_get(j, "max_position_embeddings");
    st = check_label(path, j, &variant);
    if (st == MOE_OK && ours && !json_is_object(ours))
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: moe_train must be an object", path);
    if (st == MOE_OK && variant && !ours)
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: a " MOE_CHECKPOINT_VARIANT " without its moe_train object", path);
    *out = moe_model_config_default();
    for (int i = 0; i < NUM_FIELDS && st == MOE_OK; i++) {
        double v = 0;
        st = read_field(path, j, ours, &kFields[i], &v);
        if (st == MOE_OK) set_field(out, &kFields[i], v);
    }
    out->moe.d_model = out->d_model, out->moe.d_ff = out->d_ff;
    if (st == MOE_OK && act && (!json_is_string(act) || strcmp(json_string_value(act), "silu")))
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: hidden_act must be silu (SwiGLU experts)", path);
    if (st == MOE_OK && window && !json_is_null(window) && !json_is_integer(window))
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: sliding_window must be null or an integer", path);
    if (st == MOE_OK && positions && (!json_is_integer(positions) || json_integer_value(positions) < 1 ||
                                      json_integer_value(positions) > INT_MAX))
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: max_position_embeddings must be a positive integer", path);
    if (st == MOE_OK && out->num_heads > 0 && head_dim && !json_is_null(head_dim) &&
        (!json_is_integer(head_dim) || json_integer_value(head_dim) != out->d_model / out->num_heads))
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: head_dim must be hidden_size / num_attention_heads = %d", path,
                      out->d_model / out->num_heads);
    const char *problem = st == MOE_OK ? moe_model_config_problem(out) : NULL;
    if (problem) st = moe_fail(MOE_ERR_BAD_FILE, "%s: not a model moe-train can compute: %s", path, problem);
    out->max_positions = positions ? (int)json_integer_value(positions) : 0;
    if (sliding_window) *sliding_window = json_is_integer(window) ? (int)json_integer_value(window) : 0;
    json_decref(j);
    free(path);
    return st;
}

/* Compares the architecture in DIR/config.json with the model (with `policy`, the routing policy too); names the
 * first field that differs. */
moe_status moe__checkpoint_check_config(const char *dir, const moe_model_config *c, int policy) {
    moe_model_config saved;
    int window;
    MOE_TRY(moe_checkpoint_read_config(dir, &saved, &window));
    if (window && window < c->seq_len)
        return moe_fail(MOE_ERR_BAD_FILE, "%s/config.json: sliding_window %d is shorter than the sequence length %d "
                        "(no sliding window attention here)", dir, window, c->seq_len);
    for (int i = 0; i < NUM_FIELDS; i++) {
        const moe_checkpoint_field have = moe_checkpoint_field_at(&saved, i), want = moe_checkpoint_field_at(c, i);
        if (have.value != want.value && (policy || !have.policy))
            return moe_fail(MOE_ERR_BAD_FILE, "%s/config.json: %s is %s but this model has %s", dir, have.path,
                            have.text, want.text);
    }
    return MOE_OK;
}

/* Everything that must match to continue a run: the architecture, routing, data order and seed. */
void moe__checkpoint_fingerprint(const moe_checkpoint_run *run, char *out, size_t n) {
    const moe_model_config *c = run->config;
    const moe_config *q = &c->moe;
    snprintf(out, n,
             "V=%d L=%d d=%d H=%d KV=%d F=%d S=%d E=%d k=%d every=%d tie=%d score=%d renorm=%d cf=%g prio=%d aux=%g "
             "z=%g bias_rate=%g invariant=%d batch=%d micro=%d seed=%d",
             c->vocab_size, c->num_layers, c->d_model, c->num_heads, c->num_kv_heads, c->d_ff, c->seq_len,
             q->num_experts, q->top_k, c->moe_every, c->tie_embeddings, q->score_func, q->renormalize,
             q->capacity_factor, q->drop_priority, q->aux_loss_coef, q->z_loss_coef, q->bias_update_rate,
             q->layout_invariant, run->batch, run->micro_batches, run->seed);
}

moe_status moe__checkpoint_parse_step(const char *text, const char *path, int *step) {
    char *end = NULL;
    errno = 0;
    long long v = text && isdigit((unsigned char)*text) ? strtoll(text, &end, 10) : -1; /* no sign, no blanks */
    if (v < 0 || errno || *end || v > INT_MAX)
        return moe_fail(MOE_ERR_BAD_FILE, "%s: the saved step '%s' is not a step number (0 to %d)", path,
                        text ? text : "(missing)", INT_MAX);
    *step = (int)v;
    return MOE_OK;
}
