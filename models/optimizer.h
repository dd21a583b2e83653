/* optimizer.h — the training step's arithmetic over the model's parameter buffer: learning-rate
 * schedule, global gradient norm with sharded experts, clipping, AdamW with per-span weight decay. */
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

/* sqrt(sum of squares of all gradients of the global model): the dense region once (it is identical
 * on every rank after the reduction), plus each expert once (gathered over the EP group; replicas in
 * other groups are not counted again), added in global expert order so that sharded and replicated
 * layouts give the same bits. Collective. */
moe_status moe_model_grad_norm(moe_model *m, const moe_parallel *par, double *norm);

/* Scales every gradient by clip / norm when norm > clip > 0; *factor gets the factor applied. */
moe_status moe_model_clip_grads(moe_model *m, double norm, float clip, double *factor);

/* What a rank updates and holds AdamW moments for: [dense_begin, dense_end) of the dense region and [expert_begin,
 * expert_end) of its expert region (offsets from that region's start). Without ZeRO-1 both are whole; with it, this
 * rank's shard of each (models/trainer.h): 1/W of the dense region, 1/dp of its experts' (dp: the
 * expert-data-parallel group, the ranks holding the same experts). */
typedef struct {
    size_t dense_begin, dense_end, expert_begin, expert_end;
} moe_update_range;

/* AdamW over r's parameters; norms get no weight decay. The moments hold exactly what is updated: the dense range,
 * then the expert range. Element-wise, so a shard's update is bitwise the whole update's. */
moe_status moe_model_adamw_step(moe_model *m, const moe_update_range *r, moe_real *moment1, moe_real *moment2,
                                const moe_adamw_params *hp);

#endif
