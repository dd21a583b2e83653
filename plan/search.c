/* plan/search.c — enumerate, predict and rank layouts (plan/search.h). */
#include "plan/search.h"

#include <stdlib.h>

static int better_first(const void *a, const void *b) {
    const moe_plan_candidate *x = a, *y = b;
    const double tx = x->prediction.tokens_per_s_serial, ty = y->prediction.tokens_per_s_serial;
    if (tx != ty) return tx > ty ? -1 : 1;
    if (x->run.layout.ep != y->run.layout.ep) return x->run.layout.ep < y->run.layout.ep ? -1 : 1;
    if (x->run.layout.pp != y->run.layout.pp) return x->run.layout.pp < y->run.layout.pp ? -1 : 1;
    if (x->run.layout.tp != y->run.layout.tp) return x->run.layout.tp < y->run.layout.tp ? -1 : 1;
    if (x->run.layout.virtual_stages != y->run.layout.virtual_stages)
        return x->run.layout.virtual_stages < y->run.layout.virtual_stages ? -1 : 1;
    if (x->run.layout.zero != y->run.layout.zero) return x->run.layout.zero - y->run.layout.zero;
    if (x->run.layout.recompute != y->run.layout.recompute)
        return (int)x->run.layout.recompute - (int)y->run.layout.recompute;
    return x->run.layout.micro_batch > y->run.layout.micro_batch ? -1 : 1;
}

moe_status moe_plan_search(const moe_plan_model *m, const moe_plan_cluster *c, const moe_plan_run *base,
                           const moe_plan_routing *routing, moe_plan_candidate **out, int *num_fit, int *num_tried) {
    const int64_t W = base->layout.world;
    int cap = 64, n = 0;
    moe_plan_candidate *all = malloc((size_t)cap * sizeof *all);
    *out = NULL, *num_fit = 0, *num_tried = 0;
    if (!all) return MOE_ERR_OUT_OF_MEMORY;
    /* pp dividing the GPUs, its stages cut evenly or with uneven ends (moe_plan_layout_cut_layers); V from 1 while pp V
     * divides the layers (V without pp > 1 is no layout); tp a power of two inside a node (moe_plan_run_problem
     * refuses the ones the model's shape does not allow) */
    for (int64_t pp = 1; pp <= W && pp <= m->num_layers; pp++)
    for (int64_t V = 1; pp * V <= m->num_layers && (V == 1 || pp > 1); V++)
    for (int64_t tp = 1; tp <= c->gpus_per_node && W % pp == 0 && tp <= W / pp; tp *= 2)
    for (int64_t ep = 1; ep <= W / pp / tp; ep++) {
        const int64_t data = W / pp / tp; /* a stage's GPUs reading distinct sequences */
        moe_plan_layout cut = {.pp = pp, .virtual_stages = V};
        if (W % pp || !moe_plan_layout_cut_layers(m, &cut) || (W / pp) % tp || data % ep || m->num_experts % ep)
            continue;
        if (base->global_batch % data) continue; /* every tensor-parallel group of a stage reads its own sequences */
        const int64_t per_gpu = base->global_batch / data; /* sequences per such group */
        for (int zero = 0; zero <= 2; zero++) /* 2: skipped by moe_plan_run_problem without the tree */
            for (int recompute = MOE_RECOMPUTE_NONE; recompute <= MOE_RECOMPUTE_FULL; recompute++)
            for (int64_t mb = 1; mb <= per_gpu; mb++) {
                if (per_gpu % mb) continue;
                moe_plan_run r = *base;
                r.layout.ep = ep, r.layout.zero = zero, r.layout.micro_batch = mb;
                r.layout.pp = pp, r.layout.virtual_stages = V, r.layout.tp = tp;
                r.layout.first_stage_layers = cut.first_stage_layers;
                r.layout.last_stage_layers = cut.last_stage_layers;
                r.layout.recompute = (moe_recompute)recompute;
                if (routing) r.layout.routing_skew = moe_plan_routing_skew(routing, ep);
                if (moe_plan_run_problem(m, c, &r)) continue;
                const moe_plan_prediction p = moe_plan_predict(m, c, &r);
                ++*num_tried;
                if (!p.fits) continue;
                if (n == cap) {
                    moe_plan_candidate *grown = realloc(all, (size_t)(cap *= 2) * sizeof *all);
                    if (!grown) return free(all), MOE_ERR_OUT_OF_MEMORY;
                    all = grown;
                }
                all[n++] = (moe_plan_candidate){.run = r, .prediction = p};
            }
    }
    qsort(all, (size_t)n, sizeof *all, better_first);
    *out = all, *num_fit = n;
    return MOE_OK;
}
