/* optimizer.c — schedule, grad norm, clipping and AdamW over the model's [dense | experts] buffer; the
 * arithmetic runs in the runtime's dense ops (moe/dense_ops.h). */
#include "models/optimizer.h"

#include <math.h>
#include <stdlib.h>

#include "core/fail.h"

float moe_lr_at(const moe_lr_schedule *s, long step) {
    if (step <= s->warmup_steps) return s->lr * (float)step / (float)(s->warmup_steps > 0 ? s->warmup_steps : 1);
    long decay_steps = s->total_steps - s->warmup_steps;
    double progress = decay_steps > 0 ? (double)(step - s->warmup_steps) / decay_steps : 1.0;
    if (progress > 1) progress = 1;
    return (float)(s->min_lr + 0.5 * (s->lr - s->min_lr) * (1 + cos(M_PI * progress)));
}

/* Every expert's sum of squares is formed on its own, gathered over the EP group, and added in global
 * (MoE layer, expert) order: the same additions in the same order whether the experts are sharded or
 * replicated. mine[moe_layer * E_local + e], expert tensors in the table's order. */
static moe_status expert_sums(moe_model *m, int *num_moe_layers, double **out) {
    moe_dense_state *s;
    const moe_dense_ops *dense = moe_model_dense_ops(m, &s);
    const moe_real *g = moe_model_grads(m);
    const int local = moe_model_num_local_experts(m);
    int count, layers = 0;
    const moe_model_tensor *t = moe_model_tensors(m, &count);
    for (int i = 0; i < count; i++)
        layers += t[i].experts && (i == 0 || !t[i - 1].experts || t[i - 1].layer != t[i].layer);
    double *mine = calloc((size_t)(layers ? layers : 1) * local, sizeof(double));
    if (!mine) return MOE_ERR_OUT_OF_MEMORY;
    for (int i = 0, ml = -1; i < count; i++) {
        if (!t[i].experts) continue;
        if (i == 0 || !t[i - 1].experts || t[i - 1].layer != t[i].layer) ml++;
        const size_t per_expert = t[i].count / local;
        for (int e = 0; e < local; e++) {
            double sum;
            moe_status st = dense->sum_squares(s, g + t[i].offset + e * per_expert, per_expert, &sum);
            if (st != MOE_OK) return free(mine), st;
            mine[ml * local + e] += sum;
        }
    }
    *num_moe_layers = layers;
    *out = mine;
    return MOE_OK;
}

moe_status moe_model_grad_norm(moe_model *m, const moe_parallel *par, double *norm) {
    moe_dense_state *s;
    const moe_dense_ops *dense = moe_model_dense_ops(m, &s);
    moe_comm *ep = moe_parallel_ep(par);
    double total;
    MOE_TRY(dense->sum_squares(s, moe_model_grads(m), moe_model_num_dense(m), &total));
    int layers;
    double *mine;
    MOE_TRY(expert_sums(m, &layers, &mine));
    if (layers == 0) return free(mine), *norm = sqrt(total), MOE_OK;
    const int local = moe_model_num_local_experts(m), R = moe_comm_size(ep);
    double *all = calloc((size_t)R * layers * local, sizeof(double));
    size_t *nbytes = calloc(R, sizeof(size_t));
    moe_status st = all && nbytes ? MOE_OK : MOE_ERR_OUT_OF_MEMORY;
    for (int p = 0; p < R && st == MOE_OK; p++) nbytes[p] = (size_t)layers * local * sizeof(double);
    if (st == MOE_OK) st = moe_comm_allgatherv_bytes(ep, mine, nbytes[0], all, nbytes);
    for (int l = 0; l < layers && st == MOE_OK; l++)
        for (int p = 0; p < R; p++) /* EP rank p holds global experts p * local .. */
            for (int e = 0; e < local; e++) total += all[((size_t)p * layers + l) * local + e];
    *norm = sqrt(total);
    free(mine), free(all), free(nbytes);
    return st;
}

moe_status moe_model_clip_grads(moe_model *m, double norm, float clip, double *factor) {
    *factor = 1.0;
    if (!(clip > 0) || norm <= clip) return MOE_OK;
    *factor = clip / norm;
    moe_dense_state *s;
    const moe_dense_ops *dense = moe_model_dense_ops(m, &s);
    return dense->scale(s, moe_model_grads(m), moe_model_num_dense(m) + moe_model_num_expert(m), *factor);
}

moe_status moe_model_adamw_step(moe_model *m, const moe_update_range *r, moe_real *moment1, moe_real *moment2,
                                const moe_adamw_params *hp) {
    moe_dense_state *s;
    const moe_dense_ops *ops = moe_model_dense_ops(m, &s);
    int count;
    const moe_model_tensor *t = moe_model_tensors(m, &count);
    const size_t dense = moe_model_num_dense(m), kept = r->dense_end - r->dense_begin;
    moe_real *p = moe_model_params(m), *g = moe_model_grads(m);
    moe_adamw_params no_decay = *hp;
    no_decay.weight_decay = 0;
    for (int i = 0; i < count; i++) {
        /* the part of the tensor inside this rank's range of its region */
        const size_t begin = t[i].offset < dense ? r->dense_begin : dense + r->expert_begin;
        const size_t end = t[i].offset < dense ? r->dense_end : dense + r->expert_end;
        size_t lo = t[i].offset > begin ? t[i].offset : begin, hi = t[i].offset + t[i].count;
        hi = hi < end ? hi : end;
        if (lo >= hi) continue;
        const size_t at = lo < dense ? lo - begin : kept + (lo - begin); /* index in the moments */
        MOE_TRY(ops->adamw_update(s, p + lo, g + lo, moment1 + at, moment2 + at, hi - lo,
                                  t[i].kind != MOE_TENSOR_NORM ? hp : &no_decay));
    }
    return MOE_OK;
}
