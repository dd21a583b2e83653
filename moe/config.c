/* config.c — defaults and validation of moe_config, and the parameter-buffer layout of a layer. */
#include <math.h>

#include "moe/moe.h"

#include "router/group.h"

moe_config moe_config_default(int d_model, int d_ff, int num_experts, int top_k) {
    return (moe_config){
        .d_model = d_model,
        .d_ff = d_ff,
        .num_experts = num_experts,
        .top_k = top_k,
        .layer_index = 0,
        .score_func = MOE_SCORE_SOFTMAX,
        .renormalize = top_k > 1, /* with k = 1 a renormalised gate is always 1: no gradient reaches the router */
        .routed_scaling = 1,
        .capacity_factor = 0,
        .drop_priority = MOE_DROP_BY_TOKEN_ORDER,
        .aux_loss_coef = 0.01f,
        .z_loss_coef = 0.001f,
        .bias_update_rate = 0.001f,
        .layout_invariant = 1,
        .precision = MOE_PRECISION_FP32,
    };
}

static int finite_nonnegative(float v) { return isfinite(v) && v >= 0; }

const char *moe_config_problem(const moe_config *c) {
    if (!c) return "no configuration given";
    if (c->d_model < 1) return "d_model must be at least 1";
    if (c->d_ff < 1) return "d_ff must be at least 1";
    if (c->num_experts < 1) return "the number of experts must be at least 1";
    if (c->top_k < 1 || c->top_k > c->num_experts) return "top_k must be between 1 and the number of experts";
    if (c->layer_index < 0) return "layer_index must not be negative";
    if (c->score_func != MOE_SCORE_SOFTMAX && c->score_func != MOE_SCORE_SIGMOID)
        return "score_func must be MOE_SCORE_SOFTMAX or MOE_SCORE_SIGMOID";
    if (c->drop_priority != MOE_DROP_BY_TOKEN_ORDER && c->drop_priority != MOE_DROP_BY_SCORE)
        return "drop_priority must be MOE_DROP_BY_TOKEN_ORDER or MOE_DROP_BY_SCORE";
    if (c->renormalize != 0 && c->renormalize != 1) return "renormalize must be 0 or 1";
    if (c->layout_invariant != 0 && c->layout_invariant != 1) return "layout_invariant must be 0 or 1";
    if (c->num_shards < 0 || (c->num_shards & (c->num_shards - 1)))
        return "num_shards must be 0 or a power of two";
    if (c->precision != MOE_PRECISION_FP32 && c->precision != MOE_PRECISION_BF16)
        return "precision must be MOE_PRECISION_FP32 or MOE_PRECISION_BF16";
    if (c->recompute < MOE_RECOMPUTE_NONE || c->recompute > MOE_RECOMPUTE_FULL)
        return "recompute must be MOE_RECOMPUTE_NONE, _ATTENTION, _MOE or _FULL";
    if (!isfinite(c->capacity_factor)) return "capacity_factor must be finite (<= 0 means dropless)";
    if (!finite_nonnegative(c->aux_loss_coef)) return "aux_loss_coef must be finite and >= 0";
    if (!finite_nonnegative(c->z_loss_coef)) return "z_loss_coef must be finite and >= 0";
    if (!finite_nonnegative(c->bias_update_rate)) return "bias_update_rate must be finite and >= 0";
    if (!finite_nonnegative(c->routed_scaling)) return "routed_scaling must be finite and > 0 (0: 1)";
    if (c->num_groups < 0 || c->num_groups > MOE_ROUTER_MAX_GROUPS)
        return "num_groups (n_group) must be between 0 (none) and 64";
    if (c->group_score != MOE_GROUP_SCORE_TOP2 && c->group_score != MOE_GROUP_SCORE_MAX)
        return "group_score must be top2 (DeepSeek-V3's) or max (DeepSeek-V2's)";
    if (moe_config_grouped(c)) {
        const int size = c->num_experts / c->num_groups;
        if (c->num_experts % c->num_groups) return "num_groups (n_group) must divide the number of experts";
        if (size < 2 && c->group_score == MOE_GROUP_SCORE_TOP2)
            return "num_groups (n_group) must leave at least 2 experts per group under group_score top2 (a group's "
                   "score is the sum of its two best; max takes groups of 1)";
        if (c->topk_groups < 1 || c->topk_groups > c->num_groups)
            return "topk_groups (topk_group) must be between 1 and num_groups (n_group)";
        if (c->top_k > c->topk_groups * size)
            return "top_k must be at most topk_groups x the experts of a group (the experts a token may choose)";
    } else if (c->topk_groups != 0 && c->topk_groups != c->num_groups) {
        return "topk_groups (topk_group) needs num_groups (n_group) > 1";
    }
    return NULL;
}

float moe_config_gate_scale(const moe_config *c) { return c->routed_scaling > 0 ? c->routed_scaling : 1.0f; }
int moe_config_grouped(const moe_config *c) { return c->num_groups > 1; }

moe_status moe_config_validate(const moe_config *c) {
    if (!c) return MOE_ERR_INVALID_ARG;
    return moe_config_problem(c) ? MOE_ERR_INVALID_CONFIG : MOE_OK;
}

const char *moe_config_ep_problem(const moe_config *c, int ep) {
    if (ep < 1) return "ep (the expert-parallel group size) must be at least 1";
    if (c->num_experts % ep != 0) return "ep (the expert-parallel group size) must divide the number of experts";
    return NULL;
}

int moe_config_num_local_experts(const moe_config *c, int ep) { return ep >= 1 ? c->num_experts / ep : 0; }

size_t moe_layer_num_params(const moe_config *c, int ep) {
    /* 0 where no layer could be made of it (moe_config_validate, _ep_problem say why): a negative size was read as
     * 2^64 - 400 and ep 0 divided by zero (a probe) */
    if (!c || moe_config_ep_problem(c, ep) || c->num_experts < 1 || c->d_model < 1 || c->d_ff < 1) return 0;
    size_t E = c->num_experts, E_local = moe_config_num_local_experts(c, ep), d = c->d_model, f = c->d_ff;
    return E * d + 3 * E_local * f * d;
}

moe_layer_weights moe_layer_weights_view(const moe_config *c, int ep, moe_real *buffer) {
    size_t E = c->num_experts, E_local = moe_config_num_local_experts(c, ep), d = c->d_model, f = c->d_ff;
    moe_layer_weights w;
    w.router_w = buffer;
    w.w1 = w.router_w + E * d;
    w.w3 = w.w1 + E_local * f * d;
    w.w2 = w.w3 + E_local * f * d;
    return w;
}

void moe_layer_weights_init(const moe_config *cfg, int ep, moe_layer_weights *w, moe_rng *rng) {
    size_t E = cfg->num_experts, E_local = moe_config_num_local_experts(cfg, ep), d = cfg->d_model, f = cfg->d_ff;
    moe_rng_fill_uniform(rng, w->router_w, E * d, sqrt(3.0 / d));
    moe_rng_fill_uniform(rng, w->w1, E_local * f * d, sqrt(3.0 / d));
    moe_rng_fill_uniform(rng, w->w3, E_local * f * d, sqrt(3.0 / d));
    moe_rng_fill_uniform(rng, w->w2, E_local * d * f, sqrt(3.0 / f));
}
