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
#include "checkpoint/hf_unsupported.h"
#include "checkpoint/internal.h"
#include "models/fileio.h"
#include "checkpoint/json_float.h"

/* The fields of config.json that define the function a model computes, one table for reading, writing, comparing
 * and the --init-from / --resume resolution of moe-train's flags (train/config.c). Where a field is depends on the
 * family (models/model.h): a top-level key of that family's Hugging Face config (Mixtral's, Qwen3-MoE's, OLMoE's),
 * a key of our "moe_train" object, or none (the value is then fixed). Absent (a file saved by transformers), a key
 * takes its family's semantics: for a Mixtral a softmax router whose k gates are renormalised (at any k, so k = 1
 * gives gate 1), no capacity limit, an MoE FFN in every layer; the top-level keys transformers' config classes'
 * defaults; the shapes are required. */
typedef enum { FIELD_INT, FIELD_FLOAT, FIELD_BOOL, FIELD_SCORE, FIELD_DROP, FIELD_GROUP, FIELD_FAMILY } field_kind;
typedef enum { IN_TOP, IN_MOE_TRAIN, IN_YARN, IN_NONE } field_where; /* IN_YARN: rope_scaling's, when of type yarn */
/* How a family's key holds a value in other units (DeepSeek-V3's): as is; in experts' widths (n_shared_experts =
 * shared_d_ff / d_ff); without RoPE's part (qk_nope_head_dim = head_dim - qk_rope_dim); null for 0 (q_lora_rank
 * without a q latent); at least 1 (n_group, topk_group: 1 group of all experts is no grouping); hidden_size / heads
 * for 0 (Mixtral's head_dim, its own only under multi-head latent attention: config.json's check after the fields). */
typedef enum { AS_IS, IN_EXPERT_WIDTHS, WITHOUT_ROPE, NULL_FOR_ZERO, AT_LEAST_ONE, QUOTIENT_FOR_ZERO } field_unit;
typedef struct {
    const char *key;   /* its name (IN_NONE: the name it has elsewhere, for messages)        */
    const char *alias; /* another top-level key that holds it (transformers 5's name), or NULL */
    field_where where; /* top level, inside the "moe_train" object, inside a YaRN rope_scaling (absent without one),
                          or not in this family's file (fixed at `absent`) */
    int required;
    double absent;     /* the value when absent (not required)                              */
    field_unit unit;
} field_place;
typedef struct {
    int policy;        /* 1: the routing policy of training (--init-from may train with another) */
    field_kind kind;
    size_t offset;     /* in moe_model_config */
    field_place at[MOE_MODEL_FAMILIES]; /* Mixtral's, Qwen3-MoE's, OLMoE's, Qwen2-MoE's, DeepSeek-V3's, -V2's */
} arch_field;

#define MC(field) offsetof(moe_model_config, field)
#define TOP(key, required, absent) {key, NULL, IN_TOP, required, absent, AS_IS}
#define TOP_IN(key, required, absent, unit) {key, NULL, IN_TOP, required, absent, unit}
#define TOP2(key, alias, required, absent) {key, alias, IN_TOP, required, absent, AS_IS}
#define OURS(key, absent) {key, NULL, IN_MOE_TRAIN, 0, absent, AS_IS}
#define FIXED(key, value) {key, NULL, IN_NONE, 0, value, AS_IS}
#define YARN(key, required, absent) {key, NULL, IN_YARN, required, absent, AS_IS}
#define ALL6(place) {place, place, place, place, place, place}
#define FIRST4(place) place, place, place, place
#define DS(place) place, place /* DeepSeek-V3's and V2's alike */
enum { MIX = MOE_MODEL_FAMILY_MIXTRAL, QWEN3 = MOE_MODEL_FAMILY_QWEN3_MOE, OLMOE = MOE_MODEL_FAMILY_OLMOE,
       QWEN2 = MOE_MODEL_FAMILY_QWEN2_MOE, DSV3 = MOE_MODEL_FAMILY_DEEPSEEK_V3, DSV2 = MOE_MODEL_FAMILY_DEEPSEEK_V2 };
static const arch_field kFields[] = {
    /* first: the others' places depend on it (absent: the family the labels name, config_family) */
    {0, FIELD_FAMILY, MC(family), {OURS("family", MIX), OURS("family", QWEN3), OURS("family", OLMOE),
                                   OURS("family", QWEN2), OURS("family", DSV3), OURS("family", DSV2)}},
    {0, FIELD_INT, MC(vocab_size), ALL6(TOP("vocab_size", 1, 0))},
    {0, FIELD_INT, MC(d_model), ALL6(TOP("hidden_size", 1, 0))},
    {0, FIELD_INT, MC(d_ff), {TOP("intermediate_size", 1, 0), TOP("moe_intermediate_size", 1, 0),
                              TOP("intermediate_size", 1, 0), TOP("moe_intermediate_size", 1, 0),
                              DS(TOP("moe_intermediate_size", 1, 0))}},
    /* (after d_ff: DeepSeek's counts it in experts' widths) */
    {0, FIELD_INT, MC(shared_d_ff), {OURS("shared_d_ff", 0), OURS("shared_d_ff", 0), OURS("shared_d_ff", 0),
                                     TOP("shared_expert_intermediate_size", 1, 0),
                                     TOP_IN("n_shared_experts", 0, 1, IN_EXPERT_WIDTHS),
                                     TOP_IN("n_shared_experts", 0, 2, IN_EXPERT_WIDTHS)}},
    {0, FIELD_INT, MC(dense_d_ff), {OURS("dense_d_ff", 0), TOP("intermediate_size", 0, 0), OURS("dense_d_ff", 0),
                                    TOP("intermediate_size", 0, 0), DS(TOP("intermediate_size", 1, 0))}}, /* 0: d_ff */
    {0, FIELD_INT, MC(first_dense), {FIRST4(OURS("first_dense_layers", 0)), TOP("first_k_dense_replace", 0, 3),
                                     TOP("first_k_dense_replace", 0, 0)}},
    /* multi-head latent attention's (qk_rope_dim before head_dim: DeepSeek's head_dim is without it) */
    {0, FIELD_INT, MC(kv_lora_rank), {FIRST4(OURS("kv_lora_rank", 0)), DS(TOP("kv_lora_rank", 0, 512))}},
    {0, FIELD_INT, MC(q_lora_rank), {FIRST4(OURS("q_lora_rank", 0)),
                                     DS(TOP_IN("q_lora_rank", 0, 1536, NULL_FOR_ZERO))}},
    {0, FIELD_INT, MC(qk_rope_dim), {FIRST4(OURS("qk_rope_head_dim", 0)), DS(TOP("qk_rope_head_dim", 0, 64))}},
    {0, FIELD_INT, MC(v_head_dim), {FIRST4(OURS("v_head_dim", 0)), DS(TOP("v_head_dim", 0, 128))}},
    {0, FIELD_INT, MC(num_layers), ALL6(TOP("num_hidden_layers", 1, 0))},
    {0, FIELD_INT, MC(num_heads), ALL6(TOP("num_attention_heads", 1, 0))},
    {0, FIELD_INT, MC(num_kv_heads), ALL6(TOP("num_key_value_heads", 1, 0))},
    {0, FIELD_INT, MC(head_dim), {TOP_IN("head_dim", 0, 0, QUOTIENT_FOR_ZERO), TOP("head_dim", 1, 0),
                                  FIXED("head_dim", 0),
                                  FIXED("head_dim", 0), DS(TOP_IN("qk_nope_head_dim", 0, 128, WITHOUT_ROPE))}},
                                  /* 0: d / H */
    {0, FIELD_INT, MC(moe.num_experts), {TOP("num_local_experts", 1, 0), TOP2("num_experts", "num_local_experts", 1, 0),
                                         TOP2("num_experts", "num_local_experts", 1, 0),
                                         TOP2("num_experts", "num_local_experts", 1, 0),
                                         DS(TOP2("n_routed_experts", "num_local_experts", 1, 0))}},
    {0, FIELD_INT, MC(moe.top_k), ALL6(TOP("num_experts_per_tok", 1, 0))},
    {0, FIELD_BOOL, MC(tie_embeddings), ALL6(TOP("tie_word_embeddings", 0, 0))},
    {0, FIELD_FLOAT, MC(rope_theta), {TOP("rope_theta", 0, 1e6), TOP("rope_theta", 0, 1e4), TOP("rope_theta", 0, 1e4),
                                      TOP("rope_theta", 0, 1e4), DS(TOP("rope_theta", 0, 1e4))}},
    /* YaRN: the keys of rope_scaling (or transformers 5's rope_parameters) where its rope_type is "yarn"; null reads as
     * absent (transformers': `or 32`); original_max_position_embeddings absent: max_position_embeddings */
    {0, FIELD_FLOAT, MC(yarn.factor), ALL6(YARN("factor", 1, 0))},
    {0, FIELD_INT, MC(yarn.original_positions), ALL6(YARN("original_max_position_embeddings", 0, 0))},
    {0, FIELD_FLOAT, MC(yarn.beta_fast), ALL6(YARN("beta_fast", 0, 32))},
    {0, FIELD_FLOAT, MC(yarn.beta_slow), ALL6(YARN("beta_slow", 0, 1))},
    {0, FIELD_FLOAT, MC(yarn.mscale), ALL6(YARN("mscale", 0, 0))},
    {0, FIELD_FLOAT, MC(yarn.mscale_all_dim), ALL6(YARN("mscale_all_dim", 0, 0))},
    {0, FIELD_FLOAT, MC(yarn.attention_factor), ALL6(YARN("attention_factor", 0, 0))},
    {0, FIELD_FLOAT, MC(norm_eps), {TOP("rms_norm_eps", 0, 1e-5), TOP("rms_norm_eps", 0, 1e-6),
                                    TOP("rms_norm_eps", 0, 1e-5), TOP("rms_norm_eps", 0, 1e-6),
                                    DS(TOP("rms_norm_eps", 0, 1e-6))}},
    {0, FIELD_INT, MC(moe_every), {OURS("moe_every", 1), TOP("decoder_sparse_step", 0, 1), OURS("moe_every", 1),
                                   TOP("decoder_sparse_step", 0, 1), DS(OURS("moe_every", 1))}},
    {0, FIELD_SCORE, MC(moe.score_func), {FIRST4(OURS("score_func", MOE_SCORE_SOFTMAX)),
                                          OURS("score_func", MOE_SCORE_SIGMOID),
                                          OURS("score_func", MOE_SCORE_SOFTMAX)}},
    {0, FIELD_BOOL, MC(moe.renormalize), {OURS("renormalize", 1), TOP("norm_topk_prob", 0, 0),
                                          TOP("norm_topk_prob", 0, 0), TOP("norm_topk_prob", 0, 0),
                                          TOP("norm_topk_prob", 0, 1),
                                          OURS("renormalize", 0)}}, /* transformers' V2 ignores norm_topk_prob */
    /* (V2's n_group and topk_group count only with its topk_method group_limited_greedy: read_config) */
    {0, FIELD_INT, MC(moe.num_groups), {FIRST4(OURS("num_groups", 0)), TOP_IN("n_group", 0, 8, AT_LEAST_ONE),
                                        TOP_IN("n_group", 0, 1, AT_LEAST_ONE)}},
    {0, FIELD_INT, MC(moe.topk_groups), {FIRST4(OURS("topk_groups", 0)), TOP_IN("topk_group", 0, 4, AT_LEAST_ONE),
                                         TOP_IN("topk_group", 0, 1, AT_LEAST_ONE)}},
    {0, FIELD_GROUP, MC(moe.group_score), {FIRST4(OURS("group_score", MOE_GROUP_SCORE_TOP2)),
                                           OURS("group_score", MOE_GROUP_SCORE_TOP2),
                                           OURS("group_score", MOE_GROUP_SCORE_MAX)}},
    {0, FIELD_FLOAT, MC(moe.routed_scaling), {FIRST4(OURS("routed_scaling", 1)), TOP("routed_scaling_factor", 0, 2.5),
                                              TOP("routed_scaling_factor", 0, 1)}},
    {1, FIELD_FLOAT, MC(moe.capacity_factor), ALL6(OURS("capacity_factor", 0))},
    {1, FIELD_DROP, MC(moe.drop_priority), ALL6(OURS("drop_priority", MOE_DROP_BY_TOKEN_ORDER))},
};
#undef TOP
#undef TOP_IN
#undef TOP2
#undef OURS
#undef FIXED
#undef YARN
#undef ALL6
#undef FIRST4
#undef DS
#define NUM_FIELDS (int)(sizeof kFields / sizeof kFields[0])
static const char *const kScoreNames[] = {"softmax", "sigmoid"}, *const kDropNames[] = {"token", "score"},
                         *const kGroupNames[] = {"top2", "max"};
/* transformers' class of each family, and its name in a sentence */
static const char *const kClasses[MOE_MODEL_FAMILIES] = {MOE_CHECKPOINT_MIXTRAL, "Qwen3MoeForCausalLM",
                                                         "OlmoeForCausalLM", "Qwen2MoeForCausalLM",
                                                         "DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM"};
static const char *const kFamilyTitles[MOE_MODEL_FAMILIES] = {"Mixtral", "Qwen3-MoE", "OLMoE", "Qwen2-MoE",
                                                              "DeepSeek-V3", "DeepSeek-V2"};

static int family_of(const moe_model_config *c) {
    return c->family >= 0 && c->family < MOE_MODEL_FAMILIES ? c->family : MOE_MODEL_FAMILY_MIXTRAL;
}

static double field_value(const moe_model_config *c, const arch_field *f) {
    const void *p = (const char *)c + f->offset;
    if (f->kind == FIELD_FLOAT) {
        float v = *(const float *)p;
        if (f->offset == MC(moe.routed_scaling)) return moe_config_gate_scale(&c->moe); /* 0 reads as 1 */
        return f->offset == MC(moe.capacity_factor) && v <= 0 ? 0 : v; /* every cf <= 0 is dropless */
    }
    if (f->offset == MC(dense_d_ff)) /* 0 and d_ff alike mean "as wide as an expert": 0 */
        return moe_model_dense_d_ff(c) == c->d_ff ? 0 : c->dense_d_ff;
    if (f->offset == MC(moe.num_groups) || f->offset == MC(moe.topk_groups) || f->offset == MC(moe.group_score))
        return moe_config_grouped(&c->moe) ? *(const int *)p : 0; /* 0 and 1 group alike: none, scored by nothing */
    return *(const int *)p;
}

static void set_field(moe_model_config *c, const arch_field *f, double v) {
    void *p = (char *)c + f->offset;
    if (f->kind == FIELD_FLOAT) *(float *)p = (float)v;
    else *(int *)p = (int)v;
}

/* A value of the model (c) in the units of its place in config.json, and back (v read; c: the fields before it). */
static double to_file_units(const moe_model_config *c, const field_place *at, double v) {
    switch (at->unit) {
    case IN_EXPERT_WIDTHS: return c->d_ff > 0 ? v / c->d_ff : v;
    case WITHOUT_ROPE: return v - c->qk_rope_dim;
    case AT_LEAST_ONE: return v < 1 ? 1 : v;
    default: return v;
    }
}
static double from_file_units(const moe_model_config *c, const field_place *at, double v) {
    switch (at->unit) {
    case IN_EXPERT_WIDTHS: return v * c->d_ff;
    case WITHOUT_ROPE: return v + c->qk_rope_dim;
    case QUOTIENT_FOR_ZERO: return c->num_heads > 0 && v * c->num_heads == c->d_model ? 0 : v;
    default: return v;
    }
}

/* A field of c as its config.json writes it at `at`: the widths that default to 0 derived (never 0), in the file's
 * units. */
static double written_value(const moe_model_config *c, const arch_field *f, const field_place *at) {
    double v = field_value(c, f);
    if (at->where == IN_TOP && f->offset == MC(dense_d_ff)) v = moe_model_dense_d_ff(c);
    if (at->where == IN_TOP && f->offset == MC(head_dim)) v = moe_model_head_dim(c);
    return to_file_units(c, at, v);
}

/* value as config.json writes it: "softmax", true, 1e-05, 8 */
static void field_text(const arch_field *f, double v, char *out, size_t n) {
    switch (f->kind) {
    case FIELD_INT: snprintf(out, n, "%d", (int)v); break;
    case FIELD_FLOAT: moe_format_float((float)v, out, n); break;
    case FIELD_BOOL: snprintf(out, n, "%s", v ? "true" : "false"); break;
    case FIELD_SCORE: snprintf(out, n, "\"%s\"", kScoreNames[(int)v]); break;
    case FIELD_DROP: snprintf(out, n, "\"%s\"", kDropNames[(int)v]); break;
    case FIELD_GROUP: snprintf(out, n, "\"%s\"", kGroupNames[(int)v]); break;
    case FIELD_FAMILY: snprintf(out, n, "\"%s\"", moe_model_family_name((int)v)); break;
    }
}

int moe_checkpoint_num_fields(void) { return NUM_FIELDS; }

moe_checkpoint_field moe_checkpoint_field_at(const moe_model_config *c, int i) {
    const arch_field *f = &kFields[i];
    const field_place *at = &f->at[family_of(c)];
    moe_checkpoint_field r = {.key = at->key, .offset = f->offset, .value = field_value(c, f), .policy = f->policy};
    snprintf(r.path, sizeof r.path, "%s%s", at->where == IN_MOE_TRAIN ? "moe_train." : at->where == IN_YARN ?
             "rope_scaling." : "", at->key);
    const double written = written_value(c, f, at);
    if (at->unit == NULL_FOR_ZERO && written == 0) snprintf(r.text, sizeof r.text, "null");
    else field_text(f, written, r.text, sizeof r.text);
    if (at->unit != AS_IS && written != r.value) field_text(f, r.value, r.flag_text, sizeof r.flag_text);
    return r;
}

void moe_checkpoint_field_set(moe_model_config *c, int i, double value) { set_field(c, &kFields[i], value); }


const char *moe_checkpoint_hf_class(int family) {
    return family >= 0 && family < MOE_MODEL_FAMILIES ? kClasses[family] : NULL;
}

int moe_checkpoint_hf_computes(const moe_model_config *c, char *why, size_t n) {
    const moe_config *q = &c->moe;
    const char *reasons[12];
    int count = 0;
    const int qwen = c->family == MOE_MODEL_FAMILY_QWEN3_MOE || c->family == MOE_MODEL_FAMILY_QWEN2_MOE,
              deepseek = moe_model_deepseek(c), v2 = c->family == MOE_MODEL_FAMILY_DEEPSEEK_V2;
    if (q->num_experts < 2) reasons[count++] = "a dense model (one expert: Llama's mlp tensors)";
    if (c->moe_every != 1 && !qwen) /* Qwen's decoder_sparse_step is the rule */
        reasons[count++] = "dense FFNs between the MoE layers (moe_every > 1)";
    if (c->first_dense && !deepseek) reasons[count++] = "dense first layers (first_k_dense_replace: DeepSeek's)";
    if (c->shared_d_ff > 0 && c->family != MOE_MODEL_FAMILY_QWEN2_MOE && !deepseek)
        reasons[count++] = "a shared expert beside the routed ones";
    if (c->shared_d_ff == 0 && (c->family == MOE_MODEL_FAMILY_QWEN2_MOE || deepseek))
        reasons[count++] = "no shared expert (Qwen2-MoE's and DeepSeek's always have one)";
    if (q->score_func != MOE_SCORE_SOFTMAX && (!deepseek || v2))
        reasons[count++] = "sigmoid router scores with a selection bias";
    if (q->score_func != MOE_SCORE_SIGMOID && deepseek && !v2)
        reasons[count++] = "softmax router scores (DeepSeek-V3's are sigmoid with a selection bias)";
    if (q->renormalize && v2) reasons[count++] = "top-k gates renormalised (transformers' DeepSeek-V2 never does)";
    if (moe_config_grouped(q) && deepseek && q->group_score != (v2 ? MOE_GROUP_SCORE_MAX : MOE_GROUP_SCORE_TOP2))
        reasons[count++] = v2 ? "groups scored by their two best (DeepSeek-V2's group_limited_greedy takes the best)"
                              : "groups scored by their best (DeepSeek-V3's sum their two best)";
    if (!q->renormalize && c->family == MOE_MODEL_FAMILY_MIXTRAL) /* the others' norm_topk_prob says it */
        reasons[count++] = q->top_k == 1 ? "top-1 gates not renormalised (gate = router probability; Mixtral's is 1)"
                                         : "top-k gates not renormalised";
    if (q->capacity_factor > 0) reasons[count++] = "a capacity limit that drops tokens";
    if ((moe_config_grouped(q) || moe_config_gate_scale(q) != 1) && !deepseek)
        reasons[count++] = "group-limited routing or routed scaling (DeepSeek's)";
    if (moe_model_mla(c) && !deepseek) reasons[count++] = "multi-head latent attention (DeepSeek's)";
    if (!moe_model_mla(c) && deepseek) reasons[count++] = "no multi-head latent attention (DeepSeek's attention)";
    if (deepseek && c->norm_eps != 1e-6f) /* its latent norms keep their default epsilon */
        reasons[count++] = "rms_norm_eps other than 1e-6 (transformers' q/kv latent norms keep 1e-6)";
    if (why && n) {
        why[0] = 0;
        for (int i = 0; i < count; i++)
            snprintf(why + strlen(why), n - strlen(why), "%s%s", i ? "; " : "", reasons[i]);
    }
    return count == 0;
}

/* A field's value as config.json holds it. */
static json_t *field_json(const arch_field *f, double v) {
    switch (f->kind) {
    case FIELD_INT: return json_integer((json_int_t)v);
    case FIELD_FLOAT: return moe_json_float((float)v);
    case FIELD_BOOL: return json_boolean(v != 0);
    case FIELD_SCORE: return json_string(kScoreNames[(int)v]);
    case FIELD_DROP: return json_string(kDropNames[(int)v]);
    case FIELD_GROUP: return json_string(kGroupNames[(int)v]);
    case FIELD_FAMILY: return json_string(moe_model_family_name((int)v));
    }
    return NULL;
}

json_t *moe__checkpoint_config_json(const moe_model_config *c) {
    const moe_config *q = &c->moe;
    const int family = family_of(c);
    char why[512], note[768];
    const int hf = moe_checkpoint_hf_computes(c, why, sizeof why);
    /* a label: the longest context trained or loaded, or with YaRN the one it extends to (factor x the original) */
    const double extended = c->yarn.factor > 0 ? (double)c->yarn.factor * c->yarn.original_positions : 0;
    int max_positions = c->max_positions > c->seq_len ? c->max_positions : c->seq_len;
    if (extended > max_positions) max_positions = extended < INT_MAX ? (int)extended : INT_MAX;
    json_t *j = json_pack("{s:[s], s:s, s:i, s:i, s:s, s:s, s:o, s:b, s:n, s:f}", "architectures",
                          hf ? kClasses[family] : MOE_CHECKPOINT_VARIANT, "model_type",
                          hf ? moe_model_family_name(family) : MOE_CHECKPOINT_VARIANT_TYPE, "head_dim",
                          moe_model_head_dim(c), "max_position_embeddings", max_positions, "hidden_act", "silu",
                          "torch_dtype", "float32", "router_aux_loss_coef", moe_json_float(q->aux_loss_coef),
                          "output_router_logits", 0, "sliding_window", "attention_dropout", 0.0);
    json_t *ours = json_pack("{s:o, s:o, s:b, s:b, s:s}", "z_loss_coef", moe_json_float(q->z_loss_coef),
                             "bias_update_rate", moe_json_float(q->bias_update_rate), "router_selection_bias",
                             q->score_func == MOE_SCORE_SIGMOID, "mixtral_compatible",
                             hf && family == MOE_MODEL_FAMILY_MIXTRAL, "precision", moe_precision_name(q->precision));
    if (!j || !ours) return json_decref(j), json_decref(ours), NULL;
    json_object_set_new(j, "moe_train", ours);
    /* YaRN as DeepSeek-V3's released config.json has it (transformers 5 reads it into rope_parameters) */
    json_t *yarn = c->yarn.factor > 0 ? json_pack("{s:s, s:s}", "rope_type", "yarn", "type", "yarn") : NULL;
    if (yarn) json_object_set_new(j, "rope_scaling", yarn);
    for (int i = 0; i < NUM_FIELDS; i++) {
        const field_place *at = &kFields[i].at[family];
        if (at->where == IN_NONE || (at->where == IN_YARN && !yarn)) continue;
        const double v = written_value(c, &kFields[i], at);
        if (at->where == IN_YARN && v == 0) continue; /* mscale, mscale_all_dim, attention_factor not given */
        json_object_set_new(at->where == IN_MOE_TRAIN ? ours : at->where == IN_YARN ? yarn : j, at->key,
                            at->unit == NULL_FOR_ZERO && v == 0 ? json_null() : field_json(&kFields[i], v));
    }
    if (family == MOE_MODEL_FAMILY_QWEN3_MOE || family == MOE_MODEL_FAMILY_OLMOE) /* what this model has not */
        json_object_set_new(j, "attention_bias", json_false());
    if (family == MOE_MODEL_FAMILY_QWEN2_MOE) json_object_set_new(j, "qkv_bias", json_true());
    if (family == MOE_MODEL_FAMILY_QWEN3_MOE || family == MOE_MODEL_FAMILY_QWEN2_MOE) {
        json_object_set_new(j, "mlp_only_layers", json_array());
        json_object_set_new(j, "use_sliding_window", json_false());
    }
    if (family == MOE_MODEL_FAMILY_OLMOE) json_object_set_new(j, "clip_qkv", json_null());
    if (moe_model_deepseek(c)) { /* transformers' head_dim is RoPE's part */
        json_object_set_new(j, "head_dim", json_integer(c->qk_rope_dim));
        json_object_set_new(j, "attention_bias", json_false());
    }
    if (family == MOE_MODEL_FAMILY_DEEPSEEK_V3) { /* our rows: rotate-half's order; no multi-token heads */
        json_object_set_new(j, "rope_interleave", json_false());
        json_object_set_new(j, "num_nextn_predict_layers", json_integer(0));
    }
    if (family == MOE_MODEL_FAMILY_DEEPSEEK_V2) /* n_group and topk_group count with group_limited_greedy only */
        json_object_set_new(j, "topk_method", json_string(moe_config_grouped(q) ? "group_limited_greedy" : "greedy"));
    if (!hf) {
        snprintf(note, sizeof note,
                 "Not a %s: %s. transformers' %s would compute another function from these weights, so this model "
                 "is labelled " MOE_CHECKPOINT_VARIANT " and loads in moe-train only (docs/CHECKPOINTS.md).",
                 kFamilyTitles[family], why, kClasses[family]);
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

/* The config.json a field is read from: the top level, the moe_train object, the YaRN scaling (NULL: none) and its
 * key's name. */
typedef struct {
    json_t *top, *ours, *yarn;
    const char *yarn_name;
} config_objects;

/* One field of config.json as a family has it into *v (absent and not required: the family's value), else an
 * error naming the key. */
static moe_status read_field(const char *path, const config_objects *o, const arch_field *f, int family, double *v) {
    const field_place *at = &f->at[family];
    json_t *top = o->top;
    if (at->where == IN_NONE || (at->where == IN_YARN && !o->yarn)) return *v = at->absent, MOE_OK;
    json_t *x = json_object_get(at->where == IN_MOE_TRAIN ? o->ours : at->where == IN_YARN ? o->yarn : top, at->key);
    if (at->where == IN_YARN && json_is_null(x)) x = NULL;
    char yarn_where[32];
    snprintf(yarn_where, sizeof yarn_where, "%s.", o->yarn_name ? o->yarn_name : "");
    const char *where = at->where == IN_MOE_TRAIN ? "moe_train." : at->where == IN_YARN ? yarn_where : "",
               *key = at->key;
    json_t *alias = at->alias ? json_object_get(top, at->alias) : NULL; /* transformers 5's name beside 4's */
    if (x && alias && !json_equal(x, alias) &&
        !(json_is_number(x) && json_is_number(alias) && json_number_value(x) == json_number_value(alias)))
        return moe_fail(MOE_ERR_BAD_FILE, "%s: %s%s and %s disagree: give it once", path, where, at->key, at->alias);
    if (!x && alias) x = alias, key = at->alias;
    json_t *rope = json_object_get(top, "rope_parameters"); /* transformers 5 keeps rope_theta there */
    if (!x && f->offset == MC(rope_theta) && json_is_object(rope))
        x = json_object_get(rope, "rope_theta"), where = "rope_parameters.";
    if (!x) {
        if (at->required) return moe_fail(MOE_ERR_BAD_FILE, "%s: %s%s is missing", path, where, at->key);
        *v = at->absent;
        return MOE_OK;
    }
    /* null as none: DeepSeek's code reads n_shared_experts null as no shared expert (a probe: refused here) */
    if (json_is_null(x) && (at->unit == NULL_FOR_ZERO || at->unit == AT_LEAST_ONE || at->unit == IN_EXPERT_WIDTHS ||
                            at->unit == QUOTIENT_FOR_ZERO))
        return *v = 0, MOE_OK;
    const char *want = NULL;
    switch (f->kind) {
    case FIELD_INT:
        if (!json_is_integer(x)) want = "an integer";
        else if (json_integer_value(x) < INT_MIN || json_integer_value(x) > INT_MAX)
            return moe_fail(MOE_ERR_BAD_FILE, "%s: %s%s is %lld, past the range of an int (%d to %d)", path, where, key,
                            (long long)json_integer_value(x), INT_MIN, INT_MAX);
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
    case FIELD_DROP:
    case FIELD_GROUP: {
        const char *const *names = f->kind == FIELD_SCORE ? kScoreNames : f->kind == FIELD_DROP ? kDropNames
                                                                                                  : kGroupNames;
        const char *s = json_string_value(x);
        if (s && !strcmp(s, names[0])) *v = 0;
        else if (s && !strcmp(s, names[1])) *v = 1;
        else want = f->kind == FIELD_SCORE  ? "\"softmax\" or \"sigmoid\""
                    : f->kind == FIELD_DROP ? "\"token\" or \"score\""
                                            : "\"top2\" or \"max\"";
        break;
    }
    case FIELD_FAMILY: {
        const char *s = json_string_value(x);
        want = "\"mixtral\", \"qwen3_moe\", \"olmoe\", \"qwen2_moe\", \"deepseek_v3\" or \"deepseek_v2\"";
        for (int i = 0; s && i < MOE_MODEL_FAMILIES; i++)
            if (!strcmp(s, moe_model_family_name(i))) *v = i, want = NULL;
        break;
    }
    }
    if (want)
        return moe_fail(MOE_ERR_BAD_FILE, "%s: %s%s must be %s, not %s%s%s", path, where, key, want,
                        json_is_string(x) ? "\"" : "", json_is_string(x) ? json_string_value(x) : json_type_name(x),
                        json_is_string(x) ? "\"" : "");
    return MOE_OK;
}

/* architectures and model_type name a model this reads: a family's (*family) or our variant (*variant 1, *family
 * the one moe_train.family names, read with the other fields) */
static moe_status check_label(const char *path, json_t *j, int *family, int *variant) {
    json_t *arch = json_object_get(j, "architectures"), *type = json_object_get(j, "model_type");
    const char *name = json_is_array(arch) ? json_string_value(json_array_get(arch, 0)) : NULL;
    const char *model_type = json_string_value(type);
    if ((arch && (!name || json_array_size(arch) != 1)) || (type && !model_type))
        return moe_fail(MOE_ERR_BAD_FILE, "%s: architectures must be a list of one name and model_type a string", path);
    *variant = (name && !strcmp(name, MOE_CHECKPOINT_VARIANT)) ||
               (model_type && !strcmp(model_type, MOE_CHECKPOINT_VARIANT_TYPE));
    int by_name = name && !strcmp(name, MOE_CHECKPOINT_VARIANT) ? -2 : -1, by_type = -1;
    for (int f = 0; f < MOE_MODEL_FAMILIES; f++) {
        if (name && !strcmp(name, kClasses[f])) by_name = f;
        if (model_type && !strcmp(model_type, moe_model_family_name(f))) by_type = f;
    }
    if (name && by_name == -1)
        return moe_fail(MOE_ERR_BAD_FILE, "%s: architectures is %s; moe-train reads %s, %s, %s, %s, %s, %s and "
                        MOE_CHECKPOINT_VARIANT, path, name, kClasses[0], kClasses[1], kClasses[2], kClasses[3],
                        kClasses[4], kClasses[5]);
    if (model_type && by_type == -1 && strcmp(model_type, MOE_CHECKPOINT_VARIANT_TYPE))
        return moe_fail(MOE_ERR_BAD_FILE, "%s: model_type is %s; moe-train reads mixtral, qwen3_moe, olmoe, qwen2_moe, "
                        "deepseek_v3, deepseek_v2 and " MOE_CHECKPOINT_VARIANT_TYPE, path, model_type);
    if (by_name >= 0 && by_type >= 0 && by_name != by_type)
        return moe_fail(MOE_ERR_BAD_FILE, "%s: architectures %s and model_type %s name different models", path, name,
                        model_type);
    if (!name && !model_type) /* read as Mixtral until 2026-12-07; transformers' AutoConfig refuses it */
        return moe_fail(MOE_ERR_BAD_FILE, "%s: neither architectures nor model_type names the model: add "
                        "\"model_type\": one of mixtral, qwen3_moe, olmoe, qwen2_moe, deepseek_v3, deepseek_v2 "
                        "(transformers needs it too)", path);
    *family = by_type >= 0 ? by_type : by_name >= 0 ? by_name : MOE_MODEL_FAMILY_MIXTRAL; /* the variant: read later */
    return MOE_OK;
}

/* What a family's config.json may hold that this project's model cannot compute (hf_unsupported.h's keys, then the
 * families' own): a message naming the key. */
static moe_status check_unsupported(const char *path, json_t *j, const moe_model_config *c) {
    char why[256];
    if (moe_hf_config_unsupported(j, why, sizeof why)) return moe_fail(MOE_ERR_BAD_FILE, "%s: %s", path, why);
    json_t *dense_only = json_object_get(j, "mlp_only_layers");
    if (dense_only && !json_is_null(dense_only) && !(json_is_array(dense_only) && !json_array_size(dense_only)))
        return moe_fail(MOE_ERR_BAD_FILE, "%s: mlp_only_layers must be empty (the dense layers here follow "
                        "decoder_sparse_step)", path);
    /* DeepSeek's routers: V3's sigmoid and group-limited top-k with the selection bias; V2's softmax and greedy top-k,
     * or group_limited_greedy (the groups by their best score: group_score max) */
    json_t *scoring = json_object_get(j, "scoring_func"), *method = json_object_get(j, "topk_method");
    const int v2 = c->family == MOE_MODEL_FAMILY_DEEPSEEK_V2;
    const char *score_want = v2 ? "softmax" : "sigmoid", *method_want = v2 ? "greedy" : "noaux_tc";
    if (scoring && !(json_is_string(scoring) && !strcmp(json_string_value(scoring), score_want)))
        return moe_fail(MOE_ERR_BAD_FILE, "%s: scoring_func must be \"%s\" (%s's router)", path, score_want,
                        kFamilyTitles[v2 ? MOE_MODEL_FAMILY_DEEPSEEK_V2 : MOE_MODEL_FAMILY_DEEPSEEK_V3]);
    const char *m = json_string_value(method);
    const int method_ok = m && (!strcmp(m, method_want) || (v2 && !strcmp(m, "group_limited_greedy")));
    if (method && !method_ok)
        return moe_fail(MOE_ERR_BAD_FILE, "%s: topk_method must be %s", path,
                        v2 ? "\"greedy\" or \"group_limited_greedy\" (DeepSeek-V2's top-k)"
                           : "\"noaux_tc\" (DeepSeek-V3's group-limited top-k with the selection bias)");
    /* DeepSeek-V3's multi-token prediction modules: stored after the last layer and skipped on load (a probe: a string
     * or a negative count was taken as none, and the modules' tensors then refused as unexpected) */
    json_t *nextn = json_object_get(j, "num_nextn_predict_layers");
    if (c->family == MOE_MODEL_FAMILY_DEEPSEEK_V3 && nextn && !json_is_null(nextn) &&
        !(json_is_integer(nextn) && json_integer_value(nextn) >= 0 && json_integer_value(nextn) < 1024))
        return moe_fail(MOE_ERR_BAD_FILE, "%s: num_nextn_predict_layers must be a whole number from 0 to 1023 (the "
                        "multi-token prediction modules after the last layer)", path);
    json_t *qkv_bias = json_object_get(j, "qkv_bias");
    if (c->family == MOE_MODEL_FAMILY_QWEN2_MOE && qkv_bias && !json_is_true(qkv_bias))
        return moe_fail(MOE_ERR_BAD_FILE, "%s: qkv_bias must be true (a Qwen2-MoE's q, k and v here have biases)", path);
    return MOE_OK;
}

moe_status moe_checkpoint_read_config(const char *dir, moe_model_config *out) {
    char *path = moe_path_join(dir, "config.json");
    if (!path) return MOE_ERR_OUT_OF_MEMORY;
    const moe_status st = moe_checkpoint_read_config_file(path, out);
    free(path);
    return st;
}

moe_status moe_checkpoint_read_config_file(const char *path, moe_model_config *out) {
    FILE *file;
    moe_status st = moe_file_open_regular(path, &file);
    if (st != MOE_OK) return st;
    json_error_t err;
    json_t *j = json_loadf(file, 0, &err);
    fclose(file);
    if (!j || !json_is_object(j)) {
        st = j ? moe_fail(MOE_ERR_BAD_FILE, "%s: not a JSON object", path)
               : moe_fail(MOE_ERR_BAD_FILE, "%s: not JSON: %s (line %d)", path, err.text, err.line);
        json_decref(j);
        return st;
    }
    int variant = 0, family = MOE_MODEL_FAMILY_MIXTRAL;
    json_t *ours = json_object_get(j, "moe_train"), *window = json_object_get(j, "sliding_window"),
           *act = json_object_get(j, "hidden_act"), *head_dim = json_object_get(j, "head_dim"),
           *positions = json_object_get(j, "max_position_embeddings");
    st = check_label(path, j, &family, &variant);
    if (st == MOE_OK && ours && !json_is_object(ours))
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: moe_train must be an object", path);
    if (st == MOE_OK && variant && !ours)
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: a " MOE_CHECKPOINT_VARIANT " without its moe_train object", path);
    *out = moe_model_config_default();
    const int labelled = family;
    config_objects objects = {j, ours, NULL, NULL};
    json_t *scaling = moe_hf_rope_scaling(j, &objects.yarn_name);
    const char *rope_type = scaling ? moe_hf_rope_type(scaling) : NULL;
    if (rope_type && !strcmp(rope_type, "yarn")) objects.yarn = scaling; /* another type: check_unsupported's */
    for (int i = 0; i < NUM_FIELDS && st == MOE_OK; i++) {
        double v = 0;
        st = read_field(path, &objects, &kFields[i], family, &v); /* kFields[0], the family, decides the rest */
        const double ours = from_file_units(out, &kFields[i].at[family], v); /* an int of the file's, scaled */
        if (st == MOE_OK && kFields[i].kind != FIELD_FLOAT && (ours < INT_MIN || ours > INT_MAX)) /* (fuzzing) */
            st = moe_fail(MOE_ERR_BAD_FILE, "%s: %s gives %.0f, past the range of an int", path,
                          kFields[i].at[family].key, ours);
        if (st == MOE_OK) set_field(out, &kFields[i], ours);
        if (st == MOE_OK && i == 0) family = out->family;
    }
    if (st == MOE_OK && !variant && family != labelled)
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: moe_train.family is %s but the file is labelled %s", path,
                      moe_model_family_name(family), kClasses[labelled]);
    out->moe.d_model = out->d_model, out->moe.d_ff = out->d_ff;
    json_t *method = json_object_get(j, "topk_method"); /* DeepSeek-V2's greedy top-k ignores n_group, topk_group */
    if (family == MOE_MODEL_FAMILY_DEEPSEEK_V2 &&
        !(json_is_string(method) && !strcmp(json_string_value(method), "group_limited_greedy")))
        out->moe.num_groups = out->moe.topk_groups = 0;
    if (st == MOE_OK && act && (!json_is_string(act) || strcmp(json_string_value(act), "silu")))
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: hidden_act must be silu (SwiGLU experts)", path);
    if (st == MOE_OK && window && !json_is_null(window) && !json_is_integer(window))
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: sliding_window must be null or an integer", path);
    if (st == MOE_OK && positions && (!json_is_integer(positions) || json_integer_value(positions) < 1 ||
                                      json_integer_value(positions) > INT_MAX))
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: max_position_embeddings must be a positive integer", path);
    /* (under MLA the q/k heads' width is its own: moe-train could not resume its Mixtral variant's until a test,
     * 2026-12-08) */
    if (st == MOE_OK && family != MOE_MODEL_FAMILY_QWEN3_MOE && !moe_model_deepseek(out) && !moe_model_mla(out) &&
        out->num_heads > 0 && head_dim &&
        !json_is_null(head_dim) &&
        (!json_is_integer(head_dim) || json_integer_value(head_dim) != out->d_model / out->num_heads))
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: head_dim must be %shidden_size / num_attention_heads = %d", path,
                      json_is_integer(head_dim) ? "" : "an integer, ", /* a string was told a wrong value: a probe */
                      out->d_model / out->num_heads);
    /* transformers reads YaRN's betas as `get("beta_fast") or 32`: 0 is its default too (a probe, 2026-12-07) */
    if (out->yarn.factor > 0 && out->yarn.beta_fast == 0) out->yarn.beta_fast = 32;
    if (out->yarn.factor > 0 && out->yarn.beta_slow == 0) out->yarn.beta_slow = 1;
    out->max_positions = positions ? (int)json_integer_value(positions) : 0;
    if (out->yarn.factor > 0 && !out->yarn.original_positions) out->yarn.original_positions = out->max_positions;
    if (st == MOE_OK) st = check_unsupported(path, j, out);
    const char *problem = st == MOE_OK ? moe_model_config_problem(out) : NULL;
    if (problem) st = moe_fail(MOE_ERR_BAD_FILE, "%s: not a model moe-train can compute: %s", path, problem);
    /* Qwen's window is used only with use_sliding_window (Mixtral has no switch: a window given is used). One in use
     * is refused, at any length: within it full causal attention is the same function, but what the run saves
     * would say no window (a probe, 2026-12-07: a window past --seq-len was taken, and the export attended over
     * the whole context where the model loaded had used the window) */
    const int qwen = family == MOE_MODEL_FAMILY_QWEN3_MOE || family == MOE_MODEL_FAMILY_QWEN2_MOE;
    if (st == MOE_OK && json_is_integer(window) && (!qwen || json_is_true(json_object_get(j, "use_sliding_window"))))
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: sliding_window %lld%s: attention here is full causal, and the "
                      "checkpoints it saves could not keep the window; set %s to load it as full attention (the "
                      "same function on sequences up to %lld tokens)", path, (long long)json_integer_value(window),
                      qwen ? " with use_sliding_window true" : "", qwen ? "use_sliding_window to false" :
                      "sliding_window to null", (long long)json_integer_value(window));
    json_decref(j);
    return st;
}

moe_status moe__checkpoint_file_layout_read(const char *dir, moe__checkpoint_file_layout *out) {
    *out = (moe__checkpoint_file_layout){0};
    char *path = moe_path_join(dir, "config.json");
    if (!path) return MOE_ERR_OUT_OF_MEMORY;
    json_t *j = json_load_file(path, 0, NULL); /* read and checked by moe_checkpoint_read_config before this */
    const char *t = json_string_value(json_object_get(j, "model_type"));
    json_t *n = json_object_get(j, "num_nextn_predict_layers");
    const int v3 = t && !strcmp(t, "deepseek_v3");
    out->rope_interleaved = (v3 && !json_is_false(json_object_get(j, "rope_interleave"))) ||
                            (t && !strcmp(t, "deepseek_v2"));
    if (v3 && json_is_integer(n) && json_integer_value(n) > 0 && json_integer_value(n) < 1024)
        out->extra_layers = (int)json_integer_value(n);
    const moe_status st = moe__checkpoint_fp8_blocks(path, j, &out->fp8);
    json_decref(j), free(path);
    return st;
}

/* Compares the architecture in DIR/config.json with the model (with `policy`, the routing policy too); names the
 * first field that differs. */
moe_status moe__checkpoint_check_config(const char *dir, const moe_model_config *c, int policy) {
    moe_model_config saved;
    MOE_TRY(moe_checkpoint_read_config(dir, &saved));
    for (int i = 0; i < NUM_FIELDS; i++) {
        const moe_checkpoint_field have = moe_checkpoint_field_at(&saved, i), want = moe_checkpoint_field_at(c, i);
        if (have.value != want.value && (policy || !have.policy))
            return moe_fail(MOE_ERR_BAD_FILE, "%s/config.json: %s is %s but this model has %s", dir, have.path,
                            have.text, want.text);
    }
    return MOE_OK;
}

/* Everything that must match to continue a run: the architecture, routing, data order and seed. Every capacity
 * factor <= 0 is dropless and written cf=0, as config.json writes it (until 2026-12-07 the value itself: a run given
 * --capacity-factor -1 could not be resumed, its config.json reading back 0; moe__checkpoint_fingerprint_matches). */
void moe__checkpoint_fingerprint(const moe_checkpoint_run *run, char *out, size_t n) {
    const moe_model_config *c = run->config;
    const moe_config *q = &c->moe;
    snprintf(out, n,
             "V=%d L=%d d=%d H=%d KV=%d F=%d S=%d E=%d k=%d every=%d tie=%d score=%d renorm=%d cf=%g prio=%d aux=%g "
             "z=%g bias_rate=%g invariant=%d batch=%d micro=%d seed=%d",
             c->vocab_size, c->num_layers, c->d_model, c->num_heads, c->num_kv_heads, c->d_ff, c->seq_len,
             q->num_experts, q->top_k, c->moe_every, c->tie_embeddings, q->score_func, q->renormalize,
             q->capacity_factor > 0 ? q->capacity_factor : 0, q->drop_priority, q->aux_loss_coef, q->z_loss_coef,
             q->bias_update_rate,
             q->layout_invariant, run->batch, run->micro_batches, run->seed);
    /* appended where they differ from a Mixtral's (whose head_dim is d / H): its fingerprint reads as it always has */
    if (c->family != MOE_MODEL_FAMILY_MIXTRAL)
        snprintf(out + strlen(out), n - strlen(out), " family=%d hd=%d", c->family, moe_model_head_dim(c));
    if (c->shared_d_ff) snprintf(out + strlen(out), n - strlen(out), " shared=%d", c->shared_d_ff);
    if (moe_model_mla(c))
        snprintf(out + strlen(out), n - strlen(out), " mla=%d/%d/%d/%d", c->q_lora_rank, c->kv_lora_rank,
                 c->qk_rope_dim, c->v_head_dim);
    if (moe_model_dense_d_ff(c) != c->d_ff || c->first_dense)
        snprintf(out + strlen(out), n - strlen(out), " dense=%d first_dense=%d", moe_model_dense_d_ff(c),
                 c->first_dense);
    if (moe_config_grouped(q) || moe_config_gate_scale(q) != 1)
        snprintf(out + strlen(out), n - strlen(out), " groups=%d/%d scale=%g%s", q->topk_groups, q->num_groups,
                 moe_config_gate_scale(q),
                 moe_config_grouped(q) && q->group_score == MOE_GROUP_SCORE_MAX ? " max" : "");
    if (c->yarn.factor > 0)
        snprintf(out + strlen(out), n - strlen(out), " yarn=%g/%d/%g/%g/%g/%g/%g", c->yarn.factor,
                 c->yarn.original_positions, c->yarn.beta_fast, c->yarn.beta_slow, c->yarn.mscale,
                 c->yarn.mscale_all_dim, c->yarn.attention_factor);
}

int moe__checkpoint_fingerprint_matches(const char *saved, const char *want) {
    if (strcmp(saved, want) == 0) return 1;
    /* a training state saved before 2026-12-07 with a negative capacity factor: its cf=-1 (or -0.5) read as cf=0 */
    const char *cf = strstr(saved, " cf=-");
    if (!cf) return 0;
    char *end;
    (void)strtod(cf + 4, &end);
    char normal[1024];
    if ((size_t)snprintf(normal, sizeof normal, "%.*s cf=0%s", (int)(cf - saved), saved, end) >= sizeof normal)
        return 0;
    return strcmp(normal, want) == 0;
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
