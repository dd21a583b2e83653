/* test_layer_gradcheck.c — the whole layer's analytic gradients against central finite differences,
 * in the float64 build (so the tolerance can be tight): input, router weights and every expert weight,
 * for softmax and sigmoid routing, k = 1 and 2, renormalised or not, dropless and with drops by either
 * priority, and DeepSeek-V3's group-limited routing with routed scaling. The loss is
 * L = <out, R> + aux_coef * L_aux + z_coef * L_z for a fixed random R.
 * Run: meson test -C build test_layer_gradcheck */
#include <math.h>
#include <stdlib.h>

#include "tests/test_util.h"

enum { T = 12, D = 6, DFF = 5, E = 4 };

/* Relative to the larger magnitude, with an absolute floor for gradients that are ~0. */
static const double kEps = 1e-5, kAbsTol = 1e-8, kRelTol = 1e-6;

typedef struct {
    moe_config cfg;
    moe_layer *layer;
    test_weights weights, grads;
    moe_real *x, *dx, *r, *out;
} problem;

static double loss_of(problem *p) {
    moe_layer_stats st;
    CHECK_OK(moe_layer_forward(p->layer, &p->weights.w, p->x, T, p->out, &st));
    double loss = st.weighted_loss;
    for (int i = 0; i < T * D; i++) loss += p->out[i] * p->r[i];
    return loss;
}

/* Compares the analytic gradient of every entry of `values` with (L(v+eps) - L(v-eps)) / 2eps. */
static int check_entries(problem *p, const char *what, moe_real *values, const moe_real *analytic, size_t count) {
    int bad = 0;
    for (size_t i = 0; i < count; i++) {
        moe_real saved = values[i];
        values[i] = saved + kEps;
        double up = loss_of(p);
        values[i] = saved - kEps;
        double down = loss_of(p);
        values[i] = saved;
        double numeric = (up - down) / (2 * kEps), a = analytic[i];
        double tol = kAbsTol + kRelTol * fmax(fabs(a), fabs(numeric));
        if (fabs(a - numeric) > tol && bad++ < 3)
            CHECK(0, "%s[%zu]: analytic %.10g, finite difference %.10g", what, i, a, numeric);
    }
    return bad;
}

/* deepseek: DeepSeek-V3's routing on top: 2 groups of E / 2 experts, the best one kept, gates scaled by 2.5 */
static void run_case(moe_score_func func, int k, int renorm, float cf, moe_drop_priority prio, int deepseek,
                     uint64_t seed) {
    problem p = {0};
    p.cfg = moe_config_default(D, DFF, E, k);
    if (deepseek) p.cfg.num_groups = 2, p.cfg.topk_groups = 1, p.cfg.routed_scaling = 2.5f;
    p.cfg.score_func = func;
    p.cfg.renormalize = renorm;
    p.cfg.capacity_factor = cf;
    p.cfg.drop_priority = prio;
    p.cfg.aux_loss_coef = 0.1f;
    p.cfg.z_loss_coef = 0.05f;
    moe_rng rng = moe_rng_seeded(seed);
    CHECK_OK(moe_layer_create(&p.cfg, NULL, NULL, &p.layer));
    p.weights = test_weights_random(&p.cfg, 1, &rng);
    p.grads = test_weights_zero(&p.cfg, 1);
    p.x = test_alloc_uniform(&rng, T * D, 1.5);
    p.r = test_alloc_uniform(&rng, T * D, 1.0);
    p.dx = test_alloc_uniform(&rng, T * D, 0);
    p.out = test_alloc_uniform(&rng, T * D, 0);
    if (func == MOE_SCORE_SIGMOID) moe_rng_fill_uniform(&rng, moe_layer_expert_bias(p.layer), E, 0.3);

    moe_layer_stats st;
    CHECK_OK(moe_layer_forward(p.layer, &p.weights.w, p.x, T, p.out, &st));
    int drops = st.num_dropped;
    /* A drop configuration that drops nothing would not test what it claims to. */
    CHECK((cf > 0) == (drops > 0), "cf %g gave %d drops", cf, drops);
    CHECK_OK(moe_layer_backward(p.layer, &p.weights.w, p.r, p.dx, &p.grads.w));

    size_t Ed = (size_t)E * D, Efd = (size_t)E * DFF * D;
    int bad = check_entries(&p, "dx", p.x, p.dx, T * D);
    bad += check_entries(&p, "d_router_w", p.weights.w.router_w, p.grads.w.router_w, Ed);
    bad += check_entries(&p, "d_w1", p.weights.w.w1, p.grads.w.w1, Efd);
    bad += check_entries(&p, "d_w3", p.weights.w.w3, p.grads.w.w3, Efd);
    bad += check_entries(&p, "d_w2", p.weights.w.w2, p.grads.w.w2, Efd);
    printf("%-7s k=%d renorm=%d cf=%-4g priority=%-5s%s dropped=%2d/%2d  mismatches=%d\n",
           func == MOE_SCORE_SOFTMAX ? "softmax" : "sigmoid", k, renorm, cf,
           prio == MOE_DROP_BY_SCORE ? "score" : "token", deepseek ? " groups 1 of 2, scaled 2.5" : "", drops, T * k,
           bad);

    moe_layer_destroy(p.layer);
    test_weights_free(&p.weights);
    test_weights_free(&p.grads);
    free(p.x), free(p.r), free(p.dx), free(p.out);
}

int main(void) {
    const moe_score_func funcs[] = {MOE_SCORE_SOFTMAX, MOE_SCORE_SIGMOID};
    uint64_t seed = 1;
    for (int f = 0; f < 2; f++)
        for (int k = 1; k <= 2; k++)
            for (int renorm = 0; renorm <= (k > 1); renorm++) {
                run_case(funcs[f], k, renorm, 0, MOE_DROP_BY_TOKEN_ORDER, 0, seed++);
                run_case(funcs[f], k, renorm, 1.0f, MOE_DROP_BY_TOKEN_ORDER, 0, seed++);
                run_case(funcs[f], k, renorm, 1.0f, MOE_DROP_BY_SCORE, 0, seed++);
                run_case(funcs[f], k, renorm, 0, MOE_DROP_BY_TOKEN_ORDER, 1, seed++);
            }
    return test_finish("test_layer_gradcheck");
}
