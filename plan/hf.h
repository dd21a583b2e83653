/* plan/hf.h — a Hugging Face config.json of a Mixtral ("mixtral"), Qwen3-MoE ("qwen3_moe") or Qwen2-MoE
 * ("qwen2_moe") model as a plan model (plan/model.h), for moe-plan --hf-config. Reads the file once; no
 * weights. Keys read: hidden_size, intermediate_size, moe_intermediate_size (Qwen), num_hidden_layers,
 * num_attention_heads, num_key_value_heads, head_dim (else hidden_size / heads), vocab_size, num_local_experts
 * (Mixtral) or num_experts (Qwen), num_experts_per_tok, tie_word_embeddings, decoder_sparse_step and
 * mlp_only_layers (Qwen), shared_expert_intermediate_size (Qwen2), sliding_window with use_sliding_window. */
#ifndef MOE_PLAN_HF_H
#define MOE_PLAN_HF_H

#include "plan/model.h"

/* MOE_ERR_BAD_FILE (or the file's own error) with a message naming the file and the key that is missing, of the
 * wrong type or out of range, or the model_type that is not one of the three. The capacity factor is left 0. */
moe_status moe_plan_model_from_hf_config(const char *path, moe_plan_model *out);

#endif
