/* checkpoint/hf_unsupported.h — what a Hugging Face config.json may ask of RoPE and attention that no family here
 * computes. One list for the two readers of such files, so that they agree: moe-train's (checkpoint/config.c refuses
 * the file) and moe-plan's (plan/hf.c still counts the model and notes that moe-train cannot train it). */
#pragma once

#include <jansson.h>
#include <stddef.h>

/* RoPE's scaling: rope_scaling (transformers 4's key, and DeepSeek-V3's released file's) where it is an object, else
 * rope_parameters (transformers 5's, which also holds rope_theta), else NULL; *name: which key. */
json_t *moe_hf_rope_scaling(json_t *config, const char **name);
/* A scaling's rope_type (or the older "type"): "default" when it has neither; NULL when not a string. */
const char *moe_hf_rope_type(json_t *scaling);

/* The first key that asks for what no family here computes, as "KEY must be ... (why)" in buf: 1; 0 when none.
 * Checked: rope_scaling / rope_parameters an object or null, with a rope_type where it has a factor, of "default" or
 * "yarn", YaRN's truncate true and factor above 0; rope_scaling and rope_parameters (and rope_theta beside the
 * latter) agreeing where both are given; partial_rotary_factor 1 (at the top and in the scaling); rope_interleave a
 * boolean; routed_scaling_factor above 0; a deepseek_v3's rms_norm_eps 1e-6; attention_bias not true; clip_qkv null.
 * (A family's own keys, such as Qwen's mlp_only_layers or DeepSeek's router, are its reader's.) */
int moe_hf_config_unsupported(json_t *config, char *buf, size_t n);
