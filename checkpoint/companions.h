/* checkpoint/companions.h — what a Hugging Face folder holds beside the model that a run started from it keeps: the
 * tokenizer's files, generation_config.json and config.json's token ids. None of it changes what the model computes,
 * and without it a fine-tuned checkpoint could not be loaded with its tokenizer or generate with its stop token (a
 * probe, 2026-12-07: a run --init-from a transformers folder saved neither). For checkpoint/'s own .c files. */
#ifndef MOE_CHECKPOINT_COMPANIONS_H
#define MOE_CHECKPOINT_COMPANIONS_H

#include <jansson.h>

#include "core/types.h"

/* Copies from's companion files (tokenizer.json, tokenizer_config.json, special_tokens_map.json, tokenizer.model,
 * vocab.json, merges.txt, added_tokens.json, chat_template.jinja, generation_config.json), each a regular file there,
 * into dir; and sets in config (dir's config.json object, to be written) the token ids of from's config.json
 * (bos_token_id, eos_token_id, pad_token_id) that config does not hold. from NULL: nothing. MOE_ERR_IO naming the file
 * when one cannot be copied. */
moe_status moe__checkpoint_carry_companions(const char *from, const char *dir, json_t *config);

#endif
