/* optimizer.c — schedule, grad norm, clipping and AdamW over the model's [dense | experts] buffer; the
 * arithmetic runs in the runtime's dense ops (moe/dense_ops.h). */
#include "models/optimizer.h"

#include <math.h>
#include <stdlib.h>

#include "core/fail.h"
#include "models/zero.h"

float moe_lr_at(const moe_lr_schedule *s, long step) {
    if (step <= s->warmup_steps) return s->lr * (float)step / (float)(s->warmup_steps > 0 ? s->warmup_steps : 1);
    long decay_steps = s->total_steps - s->warmup_steps;
    double progress = decay_steps > 0 ? (double)(step - s->warmup_steps) / decay_steps : 1.0;
    if (progress > 1) progress = 1;
    return (float)(s->min_lr + 0.5 * (s->lr - s->min_lr) * (1 + cos(M_PI * progress)));
}

/* sums[i] = the sum of squares of region r's atom i (models/zero.h): computed for the atoms of this rank's range from
 * g (that range's gradients), 0 for the others; with the region sharded over its group, added over it: an atom is
 * non-zero on its owner alone, so the sum is exact in any order. */
static moe_status atom_sums(moe_model *m, const moe_zero_region *r, const moe_real *g, double **out) {
    moe_dense_state *s;
    const moe_dense_ops *dense = moe_model_dense_ops(m, &s);
    const size_t n = moe_zero_num_atoms(r);
    double *sums = calloc(n, sizeof(double));
    if (!sums) return MOE_ERR_OUT_OF_MEMORY;
    moe_status st = MOE_OK;
    for (size_t i = 0; i < n && st == MOE_OK; i++) {
        const size_t a = moe_zero_atom_begin(r, i), b = moe_zero_atom_begin(r, i + 1);
        if (a >= r->begin && b <= r->end && b > a) st = dense->sum_squares(s, g + (a - r->begin), b - a, &sums[i]);
    }
    if (st == MOE_OK && (r->begin > 0 || r->end < r->part.count)) st = moe_comm_allreduce_sum_f64(r->group, sums, n);
    if (st != MOE_OK) return free(sums), st;
    *out = sums;
    return MOE_OK;
}

/* Every local expert's sum of squares, its atoms added in table order (tensor by tensor: the atoms of its slice):
 * mine[moe_layer * E_local + e]. The expert region's atoms follow the table, so one walk visits them in order. */
static moe_status expert_sums(moe_model *m, int *num_moe_layers, double **out) {
    const moe_zero_region *r = &moe_model_zero(m)->expert;
    const int local = moe_model_num_local_experts(m);
    const size_t dense = moe_model_num_dense(m);
    int count, layers = 0;
    const moe_model_tensor *t = moe_model_tensors(m, &count);
    for (int i = 0; i < count; i++)
        layers += t[i].experts && (i == 0 || !t[i - 1].experts || t[i - 1].layer != t[i].layer);
    double *atoms, *mine = calloc((size_t)(layers ? layers : 1) * local, sizeof(double));
    if (!mine) return MOE_ERR_OUT_OF_MEMORY;
    moe_status st = atom_sums(m, r, moe_model_range_grads(m, 1), &atoms);
    if (st != MOE_OK) return free(mine), st;
    size_t k = 0; /* the next atom */
    for (int i = 0, ml = -1; i < count; i++) {
        if (!t[i].experts) continue;
        if (i == 0 || !t[i - 1].experts || t[i - 1].layer != t[i].layer) ml++;
        const size_t per_expert = t[i].count / local;
        for (int e = 0; e < local; e++)
            for (const size_t end = t[i].offset - dense + (e + 1) * per_expert; moe_zero_atom_begin(r, k) < end; k++)
                mine[ml * local + e] += atoms[k];
    }
    free(atoms);
    *num_moe_layers = layers;
    *out = mine;
    return MOE_OK;
}

/* Every stage's terms, in pipeline (= the whole model's) order, on every rank of the pipeline (collective over it):
 * *all malloc'd, *total values. With one stage, a copy of mine. */
static moe_status gather_stages(moe_comm *pipeline, const double *mine, size_t n, double **all, size_t *total) {
    const int P = moe_comm_size(pipeline);
    size_t *counts = calloc(P, sizeof(size_t)), *nbytes = calloc(P, sizeof(size_t)), sum = 0;
    moe_status st = counts && nbytes ? MOE_OK : MOE_ERR_OUT_OF_MEMORY;
    for (int p = 0; p < P && st == MOE_OK; p++) nbytes[p] = sizeof(size_t);
    if (st == MOE_OK) st = moe_comm_allgatherv_bytes(pipeline, &n, sizeof n, counts, nbytes);
    for (int p = 0; p < P && st == MOE_OK; p++) sum += counts[p], nbytes[p] = counts[p] * sizeof(double);
    *all = st == MOE_OK ? malloc((sum ? sum : 1) * sizeof(double)) : NULL;
    if (st == MOE_OK && !*all) st = MOE_ERR_OUT_OF_MEMORY;
    if (st == MOE_OK) st = moe_comm_allgatherv_bytes(pipeline, mine, n * sizeof(double), *all, nbytes);
    if (st != MOE_OK) free(*all), *all = NULL;
    *total = sum;
    free(counts), free(nbytes);
    return st;
}

/* Removes from the dense atoms' sums [moe_zero_num_atoms] those of replica tensors (model.h: another stage counts
 * them), keeping the order; returns how many remain. */
static size_t drop_replica_atoms(moe_model *m, const moe_zero_region *r, double *sums) {
    int count;
    const moe_model_tensor *t = moe_model_tensors(m, &count);
    size_t kept = 0;
    for (size_t i = 0; i < moe_zero_num_atoms(r); i++) {
        const size_t at = moe_zero_atom_begin(r, i); /* atoms never cross a tensor's start */
        int replica = 0;
        for (int k = 0; k < count && !replica; k++)
            replica = t[k].replica && at >= t[k].offset && at < t[k].offset + t[k].count;
        if (!replica) sums[kept++] = sums[i];
    }
    return kept;
}

/* This stage's terms of the norm in the order the whole model adds them: its dense atoms' sums in buffer order into
 * dense[0 .. *num_dense), then every MoE layer's global experts (layer, EP rank, local expert) into experts[...]. */
static moe_status stage_terms(moe_model *m, const moe_parallel *par, double **dense, size_t *num_dense,
                              double **experts, size_t *num_experts) {
    moe_comm *ep = moe_parallel_ep(par);
    const moe_zero_region *region = &moe_model_zero(m)->dense;
    MOE_TRY(atom_sums(m, region, moe_model_range_grads(m, 0), dense));
    *num_dense = drop_replica_atoms(m, region, *dense);
    int layers;
    double *mine;
    moe_status st = expert_sums(m, &layers, &mine);
    if (st != MOE_OK) return free(*dense), st;
    const int local = moe_model_num_local_experts(m), R = moe_comm_size(ep);
    double *all = calloc((size_t)R * layers * local + 1, sizeof(double)), *ordered = calloc((size_t)R * layers * local + 1,
                                                                                            sizeof(double));
    size_t *nbytes = calloc(R, sizeof(size_t));
    st = all && ordered && nbytes ? MOE_OK : MOE_ERR_OUT_OF_MEMORY;
    for (int p = 0; p < R && st == MOE_OK; p++) nbytes[p] = (size_t)layers * local * sizeof(double);
    if (st == MOE_OK && layers) st = moe_comm_allgatherv_bytes(ep, mine, nbytes[0], all, nbytes);
    size_t k = 0;
    for (int l = 0; l < layers && st == MOE_OK; l++)
        for (int p = 0; p < R; p++) /* EP rank p holds global experts p * local .. */
            for (int e = 0; e < local; e++) ordered[k++] = all[((size_t)p * layers + l) * local + e];
    free(mine), free(all), free(nbytes);
    if (st != MOE_OK) return free(*dense), free(ordered), st;
    *experts = ordered, *num_experts = k;
    return MOE_OK;
}

moe_status moe_model_grad_norm(moe_model *m, const moe_parallel *par, double *norm) {
    double *dense, *experts, *all_dense = NULL, *all_experts = NULL;
    size_t num_dense, num_experts, n_dense = 0, n_experts = 0;
    MOE_TRY(stage_terms(m, par, &dense, &num_dense, &experts, &num_experts));
    /* the stages hold consecutive pieces of the whole model's order: gathered stage by stage, the same list */
    moe_comm *pipeline = moe_parallel_pipeline(par);
    moe_status st = gather_stages(pipeline, dense, num_dense, &all_dense, &n_dense);
    if (st == MOE_OK) st = gather_stages(pipeline, experts, num_experts, &all_experts, &n_experts);
    double total = 0;
    for (size_t i = 0; i < n_dense && st == MOE_OK; i++) total += all_dense[i];
    for (size_t i = 0; i < n_experts && st == MOE_OK; i++) total += all_experts[i];
    *norm = sqrt(total);
    free(dense), free(experts), free(all_dense), free(all_experts);
    return st;
}

moe_status moe_model_clip_grads(moe_model *m, double norm, float clip, double *factor) {
    *factor = 1.0;
    if (!(clip > 0) || norm <= clip) return MOE_OK;
    *factor = clip / norm;
    moe_dense_state *s;
    const moe_dense_ops *dense = moe_model_dense_ops(m, &s);
    const moe_zero_layout *z = moe_model_zero(m);
    MOE_TRY(dense->scale(s, moe_model_range_grads(m, 0), z->dense.end - z->dense.begin, *factor));
    return dense->scale(s, moe_model_range_grads(m, 1), z->expert.end - z->expert.begin, *factor);
}

moe_status moe_model_adamw_step(moe_model *m, moe_real *moment1, moe_real *moment2, const moe_adamw_params *hp) {
    moe_dense_state *s;
    const moe_dense_ops *ops = moe_model_dense_ops(m, &s);
    int count;
    const moe_model_tensor *t = moe_model_tensors(m, &count);
    const moe_zero_layout *z = moe_model_zero(m);
    const size_t dense = moe_model_num_dense(m), kept = z->dense.end - z->dense.begin;
    moe_real *p = moe_model_params(m);
    moe_adamw_params no_decay = *hp;
    no_decay.weight_decay = 0;
    for (int i = 0; i < count; i++) {
        if (t[i].replica) continue; /* another stage updates it and sends it back (moe_model_sync_tied) */
        /* the part of the tensor inside this rank's range of its region, in the buffer */
        const int expert = t[i].offset >= dense;
        const moe_zero_region *r = expert ? &z->expert : &z->dense;
        const size_t base = expert ? dense : 0, begin = base + r->begin, end = base + r->end;
        size_t lo = t[i].offset > begin ? t[i].offset : begin, hi = t[i].offset + t[i].count;
        hi = hi < end ? hi : end;
        if (lo >= hi) continue;
        const size_t at = (expert ? kept : 0) + (lo - begin); /* index in the moments */
        MOE_TRY(ops->adamw_update(s, p + lo, moe_model_range_grads(m, expert) + (lo - begin), moment1 + at,
                                  moment2 + at, hi - lo, t[i].kind != MOE_TENSOR_NORM ? hp : &no_decay));
    }
    return MOE_OK;
}
