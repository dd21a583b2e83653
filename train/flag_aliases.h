/* flag_aliases.h — what Megatron-LM's, torchtitan's and DeepSpeed's users type, and moe-train's flag for it: an
 * unknown flag is answered with the way here, not only "see --help" (a probe, 2026-12-08: --clip-grad, --train-iters,
 * --save, --global-batch-size ... each got "unknown flag"). */
#ifndef MOE_TRAIN_FLAG_ALIASES_H
#define MOE_TRAIN_FLAG_ALIASES_H

/* The sentence for a flag of another trainer ("--clip (the global gradient norm's clip)"), or NULL. */
const char *moe_train_flag_alias(const char *name);

#endif
