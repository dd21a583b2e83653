/* optimizer.c — schedule, grad norm, clipping and AdamW over the model's [dense | experts] buffer. */
#include "models/optimizer.h"

#include <math.h>
#include <stdlib.h>

float moe_lr_at(const moe_lr_schedule *s, long step) {
    if (step <= s->warmup_steps) return s->lr * (float)step / (float)(s->warmup_steps > 0 ? s->warmup_steps : 1);
    long decay_steps = s->total_steps - s->warmup_steps;
    double progress = decay_steps > 0 ? (double)(step - s->warmup_steps) / decay_steps : 1.0;
    if (progress > 1) progress = 1;
    return (float)(s->min_lr + 0.5 * (s->lr - s->min_lr) * (1 + cos(M_PI * progress)));
}

static double sum_squares(const moe_real *a, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)a[i] * a[i];
    return s;
}

/* The expert region holds, per MoE layer, spans w1, w3, w2 of [E_local, ...] each. Every expert's sum of
 * squares is formed on its own, gathered over the EP group, and added in global (layer, expert) order:
 * the same additions in the same order whether the experts are sharded or replicated. */
moe_status moe_model_grad_norm(moe_model *m, const moe_parallel *par, double *norm) {
    const moe_real *g = moe_model_grads(m);
    const size_t dense = moe_model_num_dense(m);
    int num_spans;
    const moe_model_param_span *spans = moe_model_spans(m, &num_spans);
    int first_expert_span = 0;
    while (first_expert_span < num_spans && spans[first_expert_span].offset < dense) first_expert_span++;
    const int num_layers = (num_spans - first_expert_span) / 3, R = par->ep->size;
    double total = sum_squares(g, dense);
    if (num_layers == 0) return *norm = sqrt(total), MOE_OK;
    const int local = moe_model_num_local_experts(m);
    double *mine = calloc((size_t)num_layers * local, sizeof(double));
    double *all = calloc((size_t)R * num_layers * local, sizeof(double));
    size_t *nbytes = calloc(R, sizeof(size_t));
    if (!mine || !all || !nbytes) return free(mine), free(all), free(nbytes), MOE_ERR_OUT_OF_MEMORY;
    for (int l = 0; l < num_layers; l++)
        for (int w = 0; w < 3; w++) {
            const moe_model_param_span *sp = &spans[first_expert_span + 3 * l + w];
            size_t per_expert = sp->count / local;
            for (int e = 0; e < local; e++) mine[l * local + e] += sum_squares(g + sp->offset + e * per_expert, per_expert);
        }
    for (int p = 0; p < R; p++) nbytes[p] = (size_t)num_layers * local * sizeof(double);
    moe_status st = par->ep->ops->allgatherv_bytes(par->ep, mine, nbytes[0], all, nbytes);
    for (int l = 0; l < num_layers; l++)
        for (int p = 0; p < R; p++) /* EP rank p holds global experts p * local .. */
            for (int e = 0; e < local; e++) total += all[((size_t)p * num_layers + l) * local + e];
    *norm = sqrt(total);
    free(mine), free(all), free(nbytes);
    return st;
}

double moe_model_clip_grads(moe_model *m, double norm, float clip) {
    if (!(clip > 0) || norm <= clip) return 1.0;
    double scale = clip / norm;
    moe_real *g = moe_model_grads(m);
    size_t n = moe_model_num_dense(m) + moe_model_num_expert(m);
    for (size_t i = 0; i < n; i++) g[i] = (moe_real)(g[i] * scale);
    return scale;
}

void moe_model_adamw_step(moe_model *m, size_t dense_begin, size_t dense_end, moe_real *moment1, moe_real *moment2,
                      const moe_adamw_params *hp) {
    int num_spans;
    const moe_model_param_span *spans = moe_model_spans(m, &num_spans);
    const size_t dense = moe_model_num_dense(m), kept = dense_end - dense_begin;
    moe_real *p = moe_model_params(m), *g = moe_model_grads(m);
    moe_adamw_params no_decay = *hp;
    no_decay.weight_decay = 0;
    for (int s = 0; s < num_spans; s++) {
        /* the part of the span inside [dense_begin, dense_end) or in the expert region */
        size_t lo = spans[s].offset, hi = lo + spans[s].count;
        if (lo < dense) { /* a dense span: only its part in this rank's range */
            lo = lo > dense_begin ? lo : dense_begin;
            hi = hi < dense_end ? hi : dense_end;
        }
        if (lo >= hi) continue;
        size_t at = lo < dense ? lo - dense_begin : kept + (lo - dense); /* index in the moments */
        moe_adamw_update_cpu(p + lo, g + lo, moment1 + at, moment2 + at, hi - lo, spans[s].decay ? hp : &no_decay);
    }
}
