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

/* AdamW over the dense parameters [dense_begin, dense_end) and all of this rank's experts; norms get no
 * weight decay. The moments hold exactly what is updated:
 * moment[0 .. dense_end - dense_begin) for the dense range, then the expert region. Without ZeRO-1 the
 * range is the whole dense region; with it, this rank's shard (models/trainer.h). */
moe_status moe_model_adamw_step(moe_model *m, size_t dense_begin, size_t dense_end, moe_real *moment1,
                                moe_real *moment2, const moe_adamw_params *hp);

#endif
