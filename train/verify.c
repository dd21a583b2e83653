/* verify.c — --verify-steps: the run's step against the CPU fp32 reference (train/verify.h). */
#include "train/verify.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/fail.h"

moe_verify_tolerances moe_verify_tolerances_for(const moe_model_config *c, int on_gpu) {
    if (c->moe.precision == MOE_PRECISION_BF16) /* bf16 GEMM inputs: 2^-9 relative per input, measured */
        return (moe_verify_tolerances){.loss_rel = 1e-2, .grad_norm_rel = 5e-2, .grad_rel = 0.25,
                                       .routing_agreement = 0.95};
    if (on_gpu) /* fp32 on cuBLAS and CUDA kernels: other summation orders, no TF32 */
        return (moe_verify_tolerances){.loss_rel = 1e-4, .grad_norm_rel = 1e-3, .grad_rel = 1e-2,
                                       .routing_agreement = 0.99};
    /* the CPU fp32 run is the reference's own code: bitwise, up to nothing */
    return (moe_verify_tolerances){.loss_rel = 0, .grad_norm_rel = 0, .grad_rel = 0, .routing_agreement = 1};
}

static int num_moe_layers(const moe_model_config *c) {
    int n = 0;
    for (int l = 0; l < c->num_layers; l++) n += moe_model_layer_is_moe(c, l);
    return n;
}

/* A step's global routing choices: [micro_batches][MoE layers][global tokens * k]. */
static size_t route_count(const moe_trainer_shape *s) {
    return (size_t)s->micro_batches * num_moe_layers(s->config) * s->batch * s->config->seq_len * s->config->moe.top_k;
}

moe_status moe_verifier_create(moe_verifier *v, const moe_trainer *run, const moe_parallel *ref_par) {
    memset(v, 0, sizeof *v);
    v->shape = moe_trainer_shape_of(run);
    v->tol = moe_verify_tolerances_for(v->shape.config, moe_runtime_gpu(moe_model_runtime(run->model)) != NULL);
    MOE_TRY(moe_trainer_create_reference(&v->ref, run, ref_par));
    const size_t n = moe_model_num_dense(run->model) + moe_model_num_expert(run->model);
    const size_t routes = route_count(&v->shape) ? route_count(&v->shape) : 1;
    v->host = malloc((n ? n : 1) * sizeof(moe_real));
    v->routes = malloc(routes * sizeof(int));
    v->ref_routes = malloc(routes * sizeof(int));
    if (!v->host || !v->routes || !v->ref_routes) return moe_verifier_destroy(v), MOE_ERR_OUT_OF_MEMORY;
    return MOE_OK;
}

void moe_verifier_destroy(moe_verifier *v) {
    moe_trainer_destroy(&v->ref);
    free(v->host), free(v->routes), free(v->ref_routes);
    memset(v, 0, sizeof *v);
}

/* The fraction of the run's choices that the reference made for the same token, over the MoE layers this rank's
 * pipeline stage holds (the others' places in the arrays are not written here), then over the whole pipeline: each
 * stage's counts added (integers: exact in any order). Collective over the pipeline. */
static moe_status routing_agreement(const moe_trainer_shape *s, const moe_trainer *run, const int *a, const int *b,
                                    double *agreement) {
    const moe_model_config *c = s->config;
    const int k = c->moe.top_k, moe_layers = num_moe_layers(c);
    const size_t per_layer = route_count(s) / (size_t)s->micro_batches / (moe_layers ? moe_layers : 1);
    double counts[2] = {0, 0}; /* agreeing choices, choices */
    for (int mb = 0; mb < s->micro_batches; mb++)
        for (int l = 0, i = 0; l < c->num_layers; l++) {
            if (!moe_model_layer_is_moe(c, l)) continue;
            const size_t from = ((size_t)mb * moe_layers + i++) * per_layer;
            if (moe_model_pipeline_stage_of(c, &moe_model_stage_of(run->model)->split, l) != run->ranks.pp_rank)
                continue;
            for (size_t tok = from; tok < from + per_layer; tok += k)
                for (int x = 0; x < k; x++)
                    for (int y = 0; y < k; y++)
                        if (a[tok + x] == b[tok + y]) {
                            counts[0]++;
                            break;
                        }
            counts[1] += (double)per_layer;
        }
    MOE_TRY(moe_comm_allreduce_sum_f64(moe_parallel_pipeline(run->par), counts, 2));
    *agreement = counts[1] > 0 ? counts[0] / counts[1] : 1;
    return MOE_OK;
}

/* The reference takes the run's weights and sigmoid routing's selection biases. */
static moe_status copy_state(moe_verifier *v, moe_trainer *run) {
    const size_t n = moe_model_num_dense(run->model) + moe_model_num_expert(run->model);
    MOE_TRY(moe_runtime_download(moe_model_runtime(run->model), v->host, moe_model_params(run->model),
                                 n * sizeof(moe_real)));
    memcpy(moe_model_params(v->ref.model), v->host, n * sizeof(moe_real));
    for (int l = 0; l < v->shape.config->num_layers; l++) {
        const moe_real *bias = moe_model_expert_bias(run->model, l);
        if (bias) memcpy(moe_model_expert_bias(v->ref.model, l), bias, v->shape.config->moe.num_experts * sizeof *bias);
    }
    return MOE_OK;
}

/* One rank's view of the gradients: the worst tensor, and the first one backward produces that is outside the
 * tolerance (order: larger comes first). */
typedef struct {
    double worst_rel, first_rel, first_order;
    char worst[160], first[160];
} grad_findings;

/* Backward's order, roughly: the head (layer L), then layers L-1 .. 0 with a layer's experts before its dense
 * tensors and those from the last in the buffer (router, ffn norm, o_proj, v, k, q, attention norm), then
 * the embedding (layer -1). */
static double backward_order(const moe_model_tensor *t) {
    return (t->layer + 1) * 1e13 + (t->experts ? 5e12 : 0) + (double)t->offset;
}

/* A tensor's name; the local experts of an expert tensor as a range ("experts.4-7.w1.weight"). */
static void tensor_name(const moe_trainer *run, const moe_model_tensor *t, char *out, size_t n) {
    if (!t->experts) {
        snprintf(out, n, "%s", t->name);
        return;
    }
    const int first = run->ranks.ep_rank * t->experts;
    char range[32];
    snprintf(range, sizeof range, t->experts > 1 ? "%d-%d" : "%d", first, first + t->experts - 1);
    const char *at = strstr(t->name, "%d");
    snprintf(out, n, "%.*s%s%s", (int)(at - t->name), t->name, range, at + 2);
}

/* Relative L2 error per tensor of the buffer (an expert tensor: this rank's experts of one layer and matrix
 * together, so that a routing choice that moved one token to a nearly idle expert does not count as that
 * expert's whole gradient). The denominator is at least a tenth of what the tensor's share of the global
 * gradient norm would be if the norm were spread evenly (ref_norm * sqrt(count / buffer)): a tensor whose
 * gradient is nearly zero (k_proj's early on) is compared against the scale of the step, not against its own
 * rounding noise. */
static void compare_grads(const moe_verifier *v, const moe_trainer *run, const moe_real *g, const moe_real *ref,
                          double ref_norm, grad_findings *f) {
    int count;
    const moe_model_tensor *tensors = moe_model_tensors(run->model, &count);
    const double buffer = (double)(moe_model_num_dense(run->model) + moe_model_num_expert(run->model));
    *f = (grad_findings){.worst_rel = 0, .first_rel = 0, .first_order = -1, .worst = "", .first = ""};
    for (int i = 0; i < count; i++) {
        const moe_model_tensor *t = &tensors[i];
        double diff = 0, norm = 0;
        for (size_t j = t->offset; j < t->offset + t->count; j++) {
            const double d = (double)g[j] - ref[j];
            diff += d * d, norm += (double)ref[j] * ref[j];
        }
        const double floor = 0.1 * ref_norm * sqrt((double)t->count / buffer);
        const double scale = fmax(sqrt(norm), floor), rel = diff == 0 ? 0 : scale > 0 ? sqrt(diff) / scale : INFINITY;
        char name[160];
        tensor_name(run, t, name, sizeof name);
        if (rel > f->worst_rel || !*f->worst) f->worst_rel = rel, snprintf(f->worst, sizeof f->worst, "%s", name);
        if (!(rel <= v->tol.grad_rel) && backward_order(t) > f->first_order)
            f->first_order = backward_order(t), f->first_rel = rel, snprintf(f->first, sizeof f->first, "%s", name);
    }
}

/* Every rank's findings into one (the worst of all; the earliest in backward of all), on every rank. */
static moe_status share_findings(const moe_trainer *run, grad_findings *f) {
    moe_comm *world = moe_parallel_world(run->par);
    const int W = moe_comm_size(world);
    grad_findings *all = malloc((size_t)W * sizeof *all);
    size_t *nbytes = malloc((size_t)W * sizeof(size_t));
    if (!all || !nbytes) return free(all), free(nbytes), MOE_ERR_OUT_OF_MEMORY;
    for (int p = 0; p < W; p++) nbytes[p] = sizeof *all;
    moe_status st = moe_comm_allgatherv_bytes(world, f, sizeof *f, all, nbytes);
    for (int p = 0; p < W && st == MOE_OK; p++) {
        if (all[p].worst_rel > f->worst_rel) f->worst_rel = all[p].worst_rel, memcpy(f->worst, all[p].worst, 160);
        if (all[p].first_order > f->first_order)
            f->first_order = all[p].first_order, f->first_rel = all[p].first_rel, memcpy(f->first, all[p].first, 160);
    }
    free(all), free(nbytes);
    return st;
}

static double relative(double a, double b) {
    return a == b ? 0 : fabs(a - b) / fmax(fabs(b), 1e-30);
}

moe_status moe_verify_step(moe_verifier *v, moe_trainer *run, int step, moe_step_result *r, moe_verify_report *rep) {
    moe_step_result ref_r = {0};
    const moe_model_config *c = v->shape.config;
    ref_r.expert_tokens = calloc((size_t)c->num_layers * c->moe.num_experts, sizeof(double));
    if (!ref_r.expert_tokens) return MOE_ERR_OUT_OF_MEMORY;
    /* the run, recording its routing; the reference on the same weights (only apply changes them) by its own
     * router, recording; then again with the run's routing forced, so that its loss and gradients differ from the
     * run's by arithmetic alone (a changed choice can move a token into or out of an expert's capacity, and
     * that is no error of the arithmetic) */
    moe_status st = copy_state(v, run);
    run->routing_record = v->routes, v->ref.routing_record = v->ref_routes;
    if (st == MOE_OK) st = moe_trainer_compute(run, step, r);
    if (st == MOE_OK) st = moe_trainer_compute(&v->ref, step, &ref_r);
    run->routing_record = NULL, v->ref.routing_record = NULL;
    v->ref.routing_replay = v->routes;
    if (st == MOE_OK) memset(ref_r.expert_tokens, 0, (size_t)c->num_layers * c->moe.num_experts * sizeof(double));
    if (st == MOE_OK) st = moe_trainer_compute(&v->ref, step, &ref_r);
    v->ref.routing_replay = NULL;
    free(ref_r.expert_tokens);
    MOE_TRY(st);
    *rep = (moe_verify_report){.step = step, .loss = r->loss, .ref_loss = ref_r.loss};
    MOE_TRY(moe_model_grad_norm(run->model, run->par, &rep->grad_norm));
    MOE_TRY(moe_model_grad_norm(v->ref.model, v->ref.par, &rep->ref_grad_norm));
    MOE_TRY(routing_agreement(&v->shape, run, v->routes, v->ref_routes, &rep->routing_agreement));
    const size_t n = moe_model_num_dense(run->model) + moe_model_num_expert(run->model);
    MOE_TRY(moe_runtime_download(moe_model_runtime(run->model), v->host, moe_model_grads(run->model),
                                 n * sizeof(moe_real)));
    grad_findings f;
    compare_grads(v, run, v->host, moe_model_grads(v->ref.model), rep->ref_grad_norm, &f);
    MOE_TRY(share_findings(run, &f));
    rep->worst_grad_rel = f.worst_rel;
    snprintf(rep->worst_tensor, sizeof rep->worst_tensor, "%s", f.worst);
    /* what disagrees first: the forward (loss, then routing), then the gradients in backward's order */
    const double loss_rel = relative(rep->loss, rep->ref_loss), norm_rel = relative(rep->grad_norm, rep->ref_grad_norm);
    if (!(loss_rel <= v->tol.loss_rel))
        return moe_fail(MOE_ERR_MISMATCH, "step %d: the loss %.9g differs from the CPU fp32 reference's %.9g by %.3g "
                        "(relative; tolerance %g): the forward pass disagrees", step, rep->loss, rep->ref_loss,
                        loss_rel, v->tol.loss_rel);
    if (!(rep->routing_agreement >= v->tol.routing_agreement))
        return moe_fail(MOE_ERR_MISMATCH, "step %d: %.2f%% of the routing choices agree with the CPU fp32 reference "
                        "(at least %.2f%% expected): the router disagrees", step, 100 * rep->routing_agreement,
                        100 * v->tol.routing_agreement);
    if (f.first_order >= 0)
        return moe_fail(MOE_ERR_MISMATCH, "step %d: the gradient of %s differs from the CPU fp32 reference's by %.3g "
                        "(relative L2; tolerance %g): the first tensor backward produces outside the tolerance",
                        step, f.first, f.first_rel, v->tol.grad_rel);
    if (!(norm_rel <= v->tol.grad_norm_rel))
        return moe_fail(MOE_ERR_MISMATCH, "step %d: the gradient norm %.9g differs from the CPU fp32 reference's %.9g "
                        "by %.3g (relative; tolerance %g)", step, rep->grad_norm, rep->ref_grad_norm, norm_rel,
                        v->tol.grad_norm_rel);
    return MOE_OK;
}

void moe_verify_report_print(const moe_verify_report *rep, FILE *f) {
    fprintf(f, "verify step %d: loss %.6f vs reference %.6f (rel %.2g) | grad norm %.6f vs %.6f (rel %.2g) | "
               "routing agrees %.2f%% | worst grad rel %.2g (%s)\n",
            rep->step, rep->loss, rep->ref_loss, relative(rep->loss, rep->ref_loss), rep->grad_norm,
            rep->ref_grad_norm, relative(rep->grad_norm, rep->ref_grad_norm), 100 * rep->routing_agreement,
            rep->worst_grad_rel, rep->worst_grad_rel > 0 ? rep->worst_tensor : "every gradient bitwise equal");
    fflush(f);
}
