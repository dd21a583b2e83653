/* checkpoint_config.c — what a checkpoint says about the model and the run: Hugging Face Mixtral's
 * config.json (written, and checked against the flags on load), the run's fingerprint, and the step. */
#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fail.h"
#include "models/checkpoint_internal.h"
#include "models/fileio.h"

json_t *moe__checkpoint_config_json(const moe_model_config *c) {
    const moe_config *q = &c->moe;
    int mixtral = c->moe_every == 1 && q->num_experts > 1 && q->score_func == MOE_SCORE_SOFTMAX && q->renormalize &&
                  q->capacity_factor <= 0;
    return json_pack(
        "{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:i, s:i, s:b, s:s, s:s, s:f, s:b, s:n, s:f,"
        " s:{s:i, s:s, s:b, s:f, s:s, s:f, s:f, s:b, s:s}}",
        "architectures", "MixtralForCausalLM", "model_type", "mixtral", "vocab_size", c->vocab_size, "hidden_size",
        c->d_model, "intermediate_size", c->d_ff, "num_hidden_layers", c->num_layers, "num_attention_heads",
        c->num_heads, "num_key_value_heads", c->num_kv_heads, "head_dim", c->d_model / c->num_heads,
        "max_position_embeddings", c->seq_len, "rms_norm_eps", (double)c->norm_eps, "rope_theta", (double)c->rope_theta,
        "num_local_experts", q->num_experts, "num_experts_per_tok", q->top_k, "tie_word_embeddings", c->tie_embeddings,
        "hidden_act", "silu", "torch_dtype", "float32", "router_aux_loss_coef", (double)q->aux_loss_coef,
        "output_router_logits", 0, "sliding_window", "attention_dropout", 0.0, "moe_train", "moe_every", c->moe_every,
        "score_func", q->score_func == MOE_SCORE_SIGMOID ? "sigmoid" : "softmax", "renormalize", q->renormalize,
        "capacity_factor", (double)q->capacity_factor, "drop_priority",
        q->drop_priority == MOE_DROP_BY_SCORE ? "score" : "token", "z_loss_coef", (double)q->z_loss_coef,
        "bias_update_rate", (double)q->bias_update_rate, "mixtral_compatible", mixtral, "precision",
        moe_precision_name(q->precision));
}

/* Compares the architecture in DIR/config.json with the model; names the first field that differs. */
moe_status moe__checkpoint_check_config(const char *dir, const moe_model_config *c) {
    char *path = moe_path_join(dir, "config.json");
    if (!path) return MOE_ERR_OUT_OF_MEMORY;
    FILE *file;
    moe_status st = moe_file_open_regular(path, &file);
    if (st != MOE_OK) return free(path), st;
    json_error_t err;
    json_t *j = json_loadf(file, 0, &err);
    fclose(file);
    if (!j) {
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: not JSON: %s (line %d)", path, err.text, err.line);
        return free(path), st;
    }
    const struct { const char *key; long want; } ints[] = {
        {"vocab_size", c->vocab_size},         {"hidden_size", c->d_model},     {"intermediate_size", c->d_ff},
        {"num_hidden_layers", c->num_layers},  {"num_attention_heads", c->num_heads},
        {"num_key_value_heads", c->num_kv_heads}, {"num_local_experts", c->moe.num_experts},
        {"num_experts_per_tok", c->moe.top_k},
    };
    for (size_t i = 0; i < sizeof ints / sizeof *ints && st == MOE_OK; i++) {
        json_t *v = json_object_get(j, ints[i].key);
        if (!json_is_integer(v))
            st = moe_fail(MOE_ERR_BAD_FILE, "%s: %s is missing or not an integer", path, ints[i].key);
        else if (json_integer_value(v) != ints[i].want)
            st = moe_fail(MOE_ERR_BAD_FILE, "%s: %s is %lld but the flags ask for %ld", path, ints[i].key,
                          (long long)json_integer_value(v), ints[i].want);
    }
    json_t *tie = json_object_get(j, "tie_word_embeddings");
    if (st == MOE_OK && tie && !json_is_boolean(tie))
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: tie_word_embeddings must be true or false", path);
    if (st == MOE_OK && json_is_boolean(tie) && json_is_true(tie) != c->tie_embeddings)
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: tie_word_embeddings is %s but the flags ask for %s", path,
                  json_is_true(tie) ? "true" : "false", c->tie_embeddings ? "tied" : "untied");
    /* the numbers that change the function the weights compute, beyond the shapes */
    json_t *theta = json_object_get(j, "rope_theta"), *eps = json_object_get(j, "rms_norm_eps"),
           *window = json_object_get(j, "sliding_window"), *act = json_object_get(j, "hidden_act");
    if (st == MOE_OK && !json_is_number(theta))
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: rope_theta is missing or not a number", path);
    if (st == MOE_OK && fabs(json_number_value(theta) - c->rope_theta) > 1e-6 * c->rope_theta)
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: rope_theta is %g but the flags ask for %g (--rope-theta)", path,
                      json_number_value(theta), (double)c->rope_theta);
    if (st == MOE_OK && !json_is_number(eps))
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: rms_norm_eps is missing or not a number", path);
    if (st == MOE_OK && fabs(json_number_value(eps) - c->norm_eps) > 1e-6 * c->norm_eps)
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: rms_norm_eps is %g but this model uses %g", path, json_number_value(eps),
                      (double)c->norm_eps);
    if (st == MOE_OK && !json_is_null(window) && window &&
        (!json_is_integer(window) || json_integer_value(window) < c->seq_len))
        st = moe_fail(MOE_ERR_BAD_FILE,
                      "%s: sliding_window %lld is shorter than the sequence length %d (no sliding "
                      "window attention here)",
                      path, json_is_integer(window) ? (long long)json_integer_value(window) : -1LL, c->seq_len);
    if (st == MOE_OK && act && (!json_is_string(act) || strcmp(json_string_value(act), "silu")))
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: hidden_act must be silu (SwiGLU experts)", path);
    /* moe_train: moe-train's own keys, absent from Mixtral's config.json; present, they must be well-formed
     * (a score_func of 513 or a moe_every of 2.0 would otherwise read as Mixtral's softmax, every layer) */
    json_t *moe = json_object_get(j, "moe_train"), *score = json_object_get(moe, "score_func"),
           *every = json_object_get(moe, "moe_every");
    if (st == MOE_OK && ((moe && !json_is_object(moe)) || (score && !json_is_string(score)) ||
                         (every && !json_is_integer(every))))
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: moe_train must be an object whose score_func is a string and moe_every "
                                        "an integer", path);
    const char *want_score = c->moe.score_func == MOE_SCORE_SIGMOID ? "sigmoid" : "softmax";
    if (st == MOE_OK && json_is_string(score) && strcmp(json_string_value(score), want_score))
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: the router was trained with %s scores but the flags ask for %s", path,
                  json_string_value(score), want_score);
    long moe_every = json_is_integer(every) ? (long)json_integer_value(every) : 1; /* Mixtral: every layer */
    if (st == MOE_OK && moe_every != c->moe_every)
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: moe_every is %ld but the flags ask for %d", path, moe_every, c->moe_every);
    json_decref(j);
    free(path);
    return st;
}

/* Everything that must match to continue a run: the architecture, routing, data order and seed. */
void moe__checkpoint_fingerprint(const moe_trainer *tr, char *out, size_t n) {
    const moe_model_config *c = &tr->opt.model;
    const moe_config *q = &c->moe;
    snprintf(out, n,
             "V=%d L=%d d=%d H=%d KV=%d F=%d S=%d E=%d k=%d every=%d tie=%d score=%d renorm=%d cf=%g prio=%d aux=%g "
             "z=%g bias_rate=%g invariant=%d batch=%d micro=%d seed=%d",
             c->vocab_size, c->num_layers, c->d_model, c->num_heads, c->num_kv_heads, c->d_ff, c->seq_len,
             q->num_experts, q->top_k, c->moe_every, c->tie_embeddings, q->score_func, q->renormalize,
             q->capacity_factor, q->drop_priority, q->aux_loss_coef, q->z_loss_coef, q->bias_update_rate,
             q->layout_invariant, tr->opt.batch, tr->opt.micro_batches, tr->opt.seed);
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
