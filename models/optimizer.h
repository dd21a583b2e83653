/* optimizer.h — the training step's arithmetic over the model's parameter buffer: learning-rate
 * schedule, global gradient norm with sharded experts and ZeRO shards, clipping, AdamW with per-span weight decay. */
#ifndef MOE_MODELS_OPTIMIZER_H
#define MOE_MODELS_OPTIMIZER_H

#include "kernels/adamw.h"
#include "models/model.h"

typedef struct {
    float lr;          /* peak learning rate                                      */
    float min_lr;      /* reached at the last step (cosine)                      */
    int warmup_steps;  /* linear from lr/warmup to lr over the first steps        */
    int total_steps;
} moe_lr_schedule;

/* Learning rate of step (1-based): linear warm-up, then cosine decay from lr to min_lr. */
float moe_lr_at(const moe_lr_schedule *s, long step);

/* sqrt(sum of squares of all gradients of the global model), from the gradients of the ranges this rank updates
 * (moe_model_range_grads): every atom's sum of squares (models/zero.h) by the rank whose range holds it, exchanged
 * over the region's group when ZeRO shards it; the dense atoms added in buffer order, each expert's atoms in table
 * order into that expert's sum, gathered over the EP group and added in global (MoE layer, expert) order; with
 * pipeline stages, every stage's terms gathered over the pipeline and added in the whole model's order. The same
 * additions in the same order on any layout, pipeline and ZeRO level: the same bits. Collective. */
moe_status moe_model_grad_norm(moe_model *m, const moe_parallel *par, double *norm);

/* Gradient clipping's factor: clip / norm when norm > clip > 0, else 1. AdamW applies it as it reads each gradient
 * (moe_adamw_params.clip_factor: the bits of scaling the gradients first, without the pass). */
double moe_model_clip_factor(double norm, float clip);

/* AdamW over the parameters of this rank's ranges (moe_model_zero(m): the whole regions without ZeRO, this rank's
 * shards with it); norms get no weight decay. The moments hold exactly what is updated: the dense range, then the
 * expert range. Element-wise, so a shard's update is bitwise the whole update's. */
moe_status moe_model_adamw_step(moe_model *m, moe_real *moment1, moe_real *moment2, const moe_adamw_params *hp);

#endif
