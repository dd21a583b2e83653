/* checkpoint.h — checkpoints that outlive layouts.
 *
 * A checkpoint is a directory:
 *   model.safetensors        the whole model in Hugging Face Mixtral names and shapes; experts by global
 *                            id, so the file does not depend on ep or the world size
 *   config.json              Mixtral's config.json (plus a "moe_train" object for what Mixtral has no key
 *                            for); with every FFN an MoE layer, softmax routing renormalised and no
 *                            capacity limit, the directory loads in transformers as MixtralForCausalLM
 *   train_state.safetensors  AdamW moments (exp_avg.NAME, exp_avg_sq.NAME), the routers' selection biases
 *                            (expert_bias.layers.I), and metadata: step, data position, and a fingerprint
 *                            of everything that must match to continue the same run
 *   manifest.json            the run that wrote it (run id, parent run id), the step, when, and each
 *                            file's size
 * Both safetensors files carry every tensor's CRC-32C; a load verifies the sizes and the checksums and
 * names what is corrupt, and refuses non-finite weights or moments. A save refuses non-finite values.
 *
 * Saves go to ROOT/step-NNNNNNNN and are durable and atomic: written into ROOT/.tmp-step-NNNNNNNN, every
 * file and the directory fsynced, renamed, ROOT fsynced; an interrupted save leaves the earlier
 * checkpoints as they were. Pruning deletes only this run's own older checkpoints, after the new one is
 * durable, each renamed out of the way before it is emptied. Loading never writes.
 * All functions are collective over the trainer's layout; world rank 0 writes, every rank reads; while rank
 * 0 writes, the others wait under --checkpoint-timeout, not the exchange watchdog. On failure every rank
 * returns the same status and the message names the file and the tensor or field. */
#ifndef MOE_MODELS_CHECKPOINT_H
#define MOE_MODELS_CHECKPOINT_H

#include "models/trainer.h"

/* Before training: ROOT is made if missing (its parent must exist) and must be a writable directory holding
 * no checkpoints but this run's and its parent's (a fresh run into a used directory would mix them). */
moe_status moe_checkpoint_prepare(moe_trainer *t, const char *root);

/* Saves the trainer's model and state after `step` into ROOT/step-NNNNNNNN, then deletes all but the
 * newest keep_last checkpoints of this run (keep_last <= 0: keep all). */
moe_status moe_checkpoint_save(moe_trainer *t, const char *root, int step, int keep_last);

/* Weights only (--init-from): the optimizer starts fresh. */
moe_status moe_checkpoint_load_weights(moe_trainer *t, const char *dir);

/* Weights, moments, biases and step (--resume): *step is the last completed step. The run's fingerprint
 * (model, batch, micro-batches, seed) must match the saved one; ep and the world size may differ. The run
 * continues under the checkpoint's run id when it is that run's newest; else it becomes a new run whose
 * parent is that one. */
moe_status moe_checkpoint_resume(moe_trainer *t, const char *dir, int *step);

/* The newest saved step directory of ROOT (malloc'ed into *out); MOE_ERR_IO with a message when there is
 * none. */
moe_status moe_checkpoint_latest(const char *root, char **out);

#endif
