/* optimizer.c — schedule, grad norm, clipping and AdamW over the model's [dense | experts] buffer. */
#include "models/optimizer.h"

#include <math.h>

float lr_at(const lr_schedule *s, long step) {
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

moe_status model_grad_norm(moe_model *m, const moe_parallel *par, double *norm) {
    const moe_real *g = moe_model_grads(m);
    size_t dense = moe_model_num_dense(m);
    double experts = sum_squares(g + dense, moe_model_num_expert(m));
    moe_status st = par->ep->ops->allreduce_sum_f64(par->ep, &experts, 1);
    *norm = sqrt(sum_squares(g, dense) + experts);
    return st;
}

double model_clip_grads(moe_model *m, double norm, float clip) {
    if (!(clip > 0) || norm <= clip) return 1.0;
    double scale = clip / norm;
    moe_real *g = moe_model_grads(m);
    size_t n = moe_model_num_dense(m) + moe_model_num_expert(m);
    for (size_t i = 0; i < n; i++) g[i] = (moe_real)(g[i] * scale);
    return scale;
}

void model_adamw_step(moe_model *m, moe_real *moment1, moe_real *moment2, const adamw_params *hp) {
    int num_spans;
    const model_param_span *spans = moe_model_spans(m, &num_spans);
    moe_real *p = moe_model_params(m), *g = moe_model_grads(m);
    adamw_params no_decay = *hp;
    no_decay.weight_decay = 0;
    for (int s = 0; s < num_spans; s++) {
        size_t o = spans[s].offset;
        adamw_update_cpu(p + o, g + o, moment1 + o, moment2 + o, spans[s].count, spans[s].decay ? hp : &no_decay);
    }
}
