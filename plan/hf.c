/* plan/hf.c — Hugging Face MoE config.json to a plan model (plan/hf.h), with jansson. */
#include "plan/hf.h"

#include <jansson.h>
#include <string.h>

#include "checkpoint/checkpoint.h"
#include "checkpoint/hf_unsupported.h"
#include "core/fail.h"
#include "models/fileio.h"

typedef enum { HF_MIXTRAL, HF_QWEN3_MOE, HF_QWEN2_MOE, HF_OLMOE, HF_DEEPSEEK_V3 } hf_family;

/* An integer key in [lo, hi]; a missing optional key gives fallback. */
static moe_status get_int(const char *path, json_t *j, const char *key, int required, int64_t fallback, int64_t lo,
                          int64_t hi, int64_t *out) {
    json_t *v = json_object_get(j, key);
    if (!v || json_is_null(v)) {
        if (required) return moe_fail(MOE_ERR_BAD_FILE, "%s: %s is missing (an integer is required)", path, key);
        *out = fallback;
        return MOE_OK;
    }
    if (!json_is_integer(v)) return moe_fail(MOE_ERR_BAD_FILE, "%s: %s is not an integer", path, key);
    const json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return moe_fail(MOE_ERR_BAD_FILE, "%s: %s is %lld, outside [%lld, %lld]", path, key, (long long)x,
                        (long long)lo, (long long)hi);
    *out = x;
    return MOE_OK;
}

/* An optional integer key as moe-train reads it (checkpoint/config.c's fields): absent, transformers' default for the
 * family (absent); null, none (none). A probe, 2026-12-07: moe-plan read an absent DeepSeek key as 0 (no shared
 * expert, no dense layer, no groups) where moe-train and transformers take the defaults (1, 3, 8 for a V3). */
static moe_status get_int_or(const char *path, json_t *j, const char *key, int64_t absent, int64_t none, int64_t lo,
                             int64_t hi, int64_t *out) {
    json_t *v = json_object_get(j, key);
    if (!v) return *out = absent, MOE_OK;
    if (json_is_null(v)) return *out = none, MOE_OK;
    return get_int(path, j, key, 1, 0, lo, hi, out);
}

/* The expert count under its family's key or transformers' attribute-map name (num_local_experts, which transformers
 * 5 writes for Qwen3-MoE): either, and both only when they agree, as moe-train reads it. */
static moe_status get_experts(const char *path, json_t *j, const char *key, int64_t *out) {
    const char *other = "num_local_experts";
    if (!json_object_get(j, key) || json_is_null(json_object_get(j, key)))
        return get_int(path, j, other, 1, 0, 1, 1 << 20, out);
    MOE_TRY(get_int(path, j, key, 1, 0, 1, 1 << 20, out));
    int64_t also = *out;
    MOE_TRY(get_int(path, j, other, 0, *out, 1, 1 << 20, &also));
    if (also != *out)
        return moe_fail(MOE_ERR_BAD_FILE, "%s: %s %lld and %s %lld disagree: give the expert count once", path, key,
                        (long long)*out, other, (long long)also);
    return MOE_OK;
}

static moe_status get_bool(const char *path, json_t *j, const char *key, int fallback, int *out) {
    json_t *v = json_object_get(j, key);
    if (!v || json_is_null(v)) return *out = fallback, MOE_OK;
    if (!json_is_boolean(v)) return moe_fail(MOE_ERR_BAD_FILE, "%s: %s is not true or false", path, key);
    *out = json_is_true(v);
    return MOE_OK;
}

static moe_status family_of(const char *path, json_t *j, hf_family *out) {
    json_t *type = json_object_get(j, "model_type");
    if (!json_is_string(type)) return moe_fail(MOE_ERR_BAD_FILE, "%s: model_type is missing or not a string", path);
    const char *t = json_string_value(type);
    if (!strcmp(t, "mixtral")) return *out = HF_MIXTRAL, MOE_OK;
    if (!strcmp(t, "qwen3_moe")) return *out = HF_QWEN3_MOE, MOE_OK;
    if (!strcmp(t, "qwen2_moe")) return *out = HF_QWEN2_MOE, MOE_OK;
    if (!strcmp(t, "olmoe")) return *out = HF_OLMOE, MOE_OK;
    if (!strcmp(t, "deepseek_v3") || !strcmp(t, "deepseek_v2")) return *out = HF_DEEPSEEK_V3, MOE_OK; /* the shapes */
    return moe_fail(MOE_ERR_BAD_FILE, "%s: model_type '%s' is not one moe-plan reads (mixtral, qwen3_moe, qwen2_moe, "
                    "olmoe, deepseek_v3, deepseek_v2, and " MOE_CHECKPOINT_VARIANT_TYPE " as moe-train saves it)",
                    path, t);
}

/* Qwen's rule (modeling_qwen3_moe.py): layer i is sparse iff i is not in mlp_only_layers and
 * (i + 1) % decoder_sparse_step == 0. A non-empty list makes the pattern irregular; count its MoE layers. */
static moe_status qwen_moe_layers(const char *path, json_t *j, moe_plan_model *m) {
    MOE_TRY(get_int(path, j, "decoder_sparse_step", 0, 1, 1, 1 << 20, &m->moe_every));
    json_t *list = json_object_get(j, "mlp_only_layers");
    if (!list || json_is_null(list) || (json_is_array(list) && json_array_size(list) == 0)) return MOE_OK;
    if (!json_is_array(list)) return moe_fail(MOE_ERR_BAD_FILE, "%s: mlp_only_layers is not a list", path);
    int64_t moe = 0;
    for (int64_t l = 0; l < m->num_layers; l++) {
        int dense = 0;
        for (size_t i = 0; i < json_array_size(list); i++) {
            json_t *v = json_array_get(list, i);
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= m->num_layers)
                return moe_fail(MOE_ERR_BAD_FILE, "%s: mlp_only_layers[%zu] is not a layer index in [0, %lld)", path, i,
                                (long long)m->num_layers);
            dense |= json_integer_value(v) == l;
        }
        moe += !dense && (l + 1) % m->moe_every == 0;
    }
    m->irregular_moe_layers = 1, m->num_moe_layers_listed = moe;
    return MOE_OK;
}

/* DeepSeek's expert groups (n_group, topk_group; absent: V3's 8 and 4, V2's 1 and 1): counted by nothing here, but a
 * file transformers cannot route is refused as moe-train refuses it. V2's greedy top-k ignores them. */
static moe_status check_groups(const char *path, json_t *j, const moe_plan_model *m, int v2) {
    json_t *method = json_object_get(j, "topk_method");
    if (v2 && !(json_is_string(method) && !strcmp(json_string_value(method), "group_limited_greedy"))) return MOE_OK;
    int64_t groups = 1, kept = 1;
    MOE_TRY(get_int_or(path, j, "n_group", v2 ? 1 : 8, 1, 1, 64, &groups));
    MOE_TRY(get_int_or(path, j, "topk_group", v2 ? 1 : 4, 1, 1, groups, &kept));
    if (m->num_experts % groups)
        return moe_fail(MOE_ERR_BAD_FILE, "%s: n_group %lld does not divide the %lld routed experts", path,
                        (long long)groups, (long long)m->num_experts);
    return MOE_OK;
}

/* DeepSeek-V3's (and V2's) config after the shapes read_model reads first: multi-head latent attention (head_dim =
 * qk_nope + qk_rope), n_shared_experts x moe_intermediate_size as the shared expert's width, the first
 * first_k_dense_replace layers dense of intermediate_size; a q_lora_rank of null: q_proj. Absent keys are
 * transformers' defaults (DeepseekV3Config's, DeepseekV2Config's), as moe-train reads them. */
static moe_status read_deepseek_v3(const char *path, json_t *j, moe_plan_model *m) {
    const int64_t big = (int64_t)1 << 40;
    int64_t nope = 0, shared = 0;
    json_t *type = json_object_get(j, "model_type");
    const int v2 = json_is_string(type) && !strcmp(json_string_value(type), "deepseek_v2");
    MOE_TRY(get_int_or(path, j, "q_lora_rank", 1536, 0, 0, big, &m->q_lora_rank));
    MOE_TRY(get_int(path, j, "kv_lora_rank", 1, 0, 1, big, &m->kv_lora_rank));
    MOE_TRY(get_int(path, j, "qk_rope_head_dim", 1, 0, 2, big, &m->qk_rope_dim));
    MOE_TRY(get_int(path, j, "qk_nope_head_dim", 1, 0, 1, big, &nope));
    MOE_TRY(get_int(path, j, "v_head_dim", 1, 0, 1, big, &m->v_head_dim));
    m->head_dim = nope + m->qk_rope_dim, m->num_kv_heads = m->num_heads;
    MOE_TRY(get_int(path, j, "vocab_size", 1, 0, 2, big, &m->vocab_size));
    MOE_TRY(get_experts(path, j, "n_routed_experts", &m->num_experts));
    MOE_TRY(get_int(path, j, "num_experts_per_tok", 1, 0, 1, 1 << 20, &m->top_k));
    MOE_TRY(get_int(path, j, "moe_intermediate_size", 1, 0, 1, big, &m->d_ff_expert));
    MOE_TRY(get_int(path, j, "intermediate_size", 1, 0, 1, big, &m->d_ff_dense));
    MOE_TRY(get_int_or(path, j, "n_shared_experts", v2 ? 2 : 1, 0, 0, 1 << 20, &shared));
    const int64_t dense = v2 ? 0 : 3; /* every layer dense in a model of fewer, as transformers builds it */
    MOE_TRY(get_int_or(path, j, "first_k_dense_replace", dense < m->num_layers ? dense : m->num_layers, 0, 0,
                       m->num_layers, &m->first_dense));
    MOE_TRY(get_int(path, j, "moe_layer_freq", 0, 1, 1, 1, &m->moe_every)); /* every layer after the dense ones */
    MOE_TRY(get_bool(path, j, "tie_word_embeddings", 0, &m->tie_embeddings));
    m->d_ff_shared = shared * m->d_ff_expert;
    MOE_TRY(check_groups(path, j, m, v2));
    if (m->top_k > m->num_experts)
        return moe_fail(MOE_ERR_BAD_FILE, "%s: num_experts_per_tok %lld exceeds the %lld experts", path,
                        (long long)m->top_k, (long long)m->num_experts);
    return MOE_OK;
}

static moe_status read_model(const char *path, json_t *j, moe_plan_model *m) {
    hf_family family = HF_MIXTRAL;
    MOE_TRY(family_of(path, j, &family));
    const int64_t big = (int64_t)1 << 40;
    *m = (moe_plan_model){.moe_every = 1};
    /* what moe-train refuses in such a file and the planner can still count: a note (moe_plan_model_unsupported) */
    moe_hf_config_unsupported(j, m->unsupported_key, sizeof m->unsupported_key);
    MOE_TRY(get_int(path, j, "hidden_size", 1, 0, 1, big, &m->d_model));
    MOE_TRY(get_int(path, j, "num_hidden_layers", 1, 0, 1, 1 << 20, &m->num_layers));
    MOE_TRY(get_int(path, j, "num_attention_heads", 1, 0, 1, 1 << 20, &m->num_heads));
    MOE_TRY(get_int(path, j, "num_key_value_heads", 0, m->num_heads, 1, m->num_heads, &m->num_kv_heads));
    if (m->num_heads % m->num_kv_heads)
        return moe_fail(MOE_ERR_BAD_FILE, "%s: num_key_value_heads %lld does not divide num_attention_heads %lld", path,
                        (long long)m->num_kv_heads, (long long)m->num_heads);
    if (family == HF_DEEPSEEK_V3) return read_deepseek_v3(path, j, m);
    MOE_TRY(get_int(path, j, "head_dim", 0, m->d_model / m->num_heads, 1, big, &m->head_dim));
    if (m->head_dim < 1)
        return moe_fail(MOE_ERR_BAD_FILE, "%s: hidden_size / num_attention_heads is 0 and there is no head_dim", path);
    MOE_TRY(get_int(path, j, "vocab_size", 1, 0, 2, big, &m->vocab_size));
    MOE_TRY(get_int(path, j, "num_experts_per_tok", 1, 0, 1, 1 << 20, &m->top_k));
    MOE_TRY(get_bool(path, j, "tie_word_embeddings", 0, &m->tie_embeddings));
    if (family == HF_MIXTRAL || family == HF_OLMOE) { /* OLMoE's intermediate_size is its experts' */
        MOE_TRY(get_experts(path, j, family == HF_MIXTRAL ? "num_local_experts" : "num_experts", &m->num_experts));
        MOE_TRY(get_int(path, j, "intermediate_size", 1, 0, 1, big, &m->d_ff_expert));
        m->d_ff_dense = m->d_ff_expert;
        m->qk_norm = family == HF_OLMOE ? MOE_QK_NORM_PROJECTION : MOE_QK_NORM_NONE;
    } else {
        MOE_TRY(get_experts(path, j, "num_experts", &m->num_experts));
        MOE_TRY(get_int(path, j, "moe_intermediate_size", 1, 0, 1, big, &m->d_ff_expert));
        MOE_TRY(get_int(path, j, "intermediate_size", 0, m->d_ff_expert, 1, big, &m->d_ff_dense));
        MOE_TRY(qwen_moe_layers(path, j, m));
        m->qk_norm = family == HF_QWEN3_MOE ? MOE_QK_NORM_HEAD : MOE_QK_NORM_NONE;
        if (family == HF_QWEN2_MOE) { /* a gated shared expert; q, k and v with biases (transformers 5's qkv_bias) */
            MOE_TRY(get_int(path, j, "shared_expert_intermediate_size", 0, 0, 0, big, &m->d_ff_shared));
            m->shared_gate = m->d_ff_shared > 0;
            MOE_TRY(get_bool(path, j, "qkv_bias", 1, &m->qkv_bias));
        }
    }
    if (m->top_k > m->num_experts)
        return moe_fail(MOE_ERR_BAD_FILE, "%s: num_experts_per_tok %lld exceeds the %lld experts", path,
                        (long long)m->top_k, (long long)m->num_experts);
    int sliding = family == HF_MIXTRAL; /* Mixtral has no switch: a window given is a window used */
    MOE_TRY(get_bool(path, j, "use_sliding_window", sliding, &sliding));
    int64_t window = 0;
    MOE_TRY(get_int(path, j, "sliding_window", 0, 0, 0, big, &window));
    m->sliding_window = sliding ? window : 0;
    return MOE_OK;
}

/* moe-train's own label for a model no transformers class computes (checkpoint/checkpoint.h): read as moe-train reads
 * it, its moe_train object included (the family, capacity factor, dense layers, shared experts) */
static moe_status read_variant(const char *path, moe_plan_model *out) {
    moe_model_config c;
    MOE_TRY(moe_checkpoint_read_config_file(path, &c));
    *out = moe_plan_model_from_config(&c);
    return MOE_OK;
}

moe_status moe_plan_model_from_hf_config(const char *path, moe_plan_model *out) {
    FILE *f;
    MOE_TRY(moe_file_open_regular(path, &f));
    json_error_t err;
    json_t *j = json_loadf(f, 0, &err);
    fclose(f);
    if (!j) return moe_fail(MOE_ERR_BAD_FILE, "%s: not JSON: %s (line %d)", path, err.text, err.line);
    const char *type = json_string_value(json_object_get(j, "model_type")); /* NULL: not a string */
    const int ours = type && !strcmp(type, MOE_CHECKPOINT_VARIANT_TYPE);
    moe_status st = !json_is_object(j) ? moe_fail(MOE_ERR_BAD_FILE, "%s: not a JSON object", path)
                    : ours             ? read_variant(path, out)
                                       : read_model(path, j, out);
    json_decref(j);
    return st;
}
