/* test_balancing.c — the load-balancing machinery, in the float64 build:
 *  - the Switch/GShard loss has its known values: 1 under perfect balance (k = 1 and 2, softmax and
 *    normalised sigmoid), E when every token sends everything to one expert; the z-loss of zero logits
 *    is log(E)^2;
 *  - both losses' gradients match central finite differences;
 *  - DeepSeek-V3's bias update moves each bias by exactly -rate*sign(load - mean), and repeated updates
 *    flatten a skewed load. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "router/aux_loss.h"
#include "router/scores.h"
#include "tests/test_util.h"

enum { E = 4, T = 16 };

static void test_known_values(void) {
    moe_real logits[T * E] = {0}, scores[T * E];
    int counts[E];
    for (int f = 0; f < 2; f++) {
        moe_score_func func = f ? MOE_SCORE_SIGMOID : MOE_SCORE_SOFTMAX;
        moe_router_scores_cpu(func, logits, T, E, scores);
        for (int k = 1; k <= 2; k++) {
            for (int e = 0; e < E; e++) counts[e] = T * k / E;
            double aux = moe_router_load_balance_loss_cpu(func, scores, counts, T, T, E, k);
            CHECK(fabs(aux - 1.0) < 1e-12, "balanced %s k=%d: aux %.15g, want 1", f ? "sigmoid" : "softmax", k, aux);
        }
    }
    /* everything on expert 0, with all probability there: E * (1 * 1) */
    for (int t = 0; t < T; t++)
        for (int e = 0; e < E; e++) scores[t * E + e] = e == 0;
    memset(counts, 0, sizeof counts);
    counts[0] = T;
    double aux = moe_router_load_balance_loss_cpu(MOE_SCORE_SOFTMAX, scores, counts, T, T, E, 1);
    CHECK(fabs(aux - E) < 1e-12, "collapsed: aux %.15g, want %d", aux, E);
    double z = moe_router_z_loss_cpu(logits, T, T, E);
    CHECK(fabs(z - log(E) * log(E)) < 1e-12, "z-loss of zero logits %.15g, want log(E)^2", z);
}

/* f(v) for finite differences: the loss as a function of one perturbed buffer. */
typedef double (*loss_fn)(moe_score_func func, moe_real *values, const int *counts);

static double aux_of_scores(moe_score_func func, moe_real *scores, const int *counts) {
    return moe_router_load_balance_loss_cpu(func, scores, counts, T, T, E, 2);
}
static double z_of_logits(moe_score_func func, moe_real *logits, const int *counts) {
    (void)func, (void)counts;
    return moe_router_z_loss_cpu(logits, T, T, E);
}

static void check_fd(const char *what, loss_fn f, moe_score_func func, moe_real *v, const int *counts,
                     const moe_real *grad) {
    const double eps = 1e-6;
    for (int i = 0; i < T * E; i++) {
        moe_real saved = v[i];
        v[i] = saved + eps;
        double up = f(func, v, counts);
        v[i] = saved - eps;
        double down = f(func, v, counts);
        v[i] = saved;
        double num = (up - down) / (2 * eps);
        CHECK(fabs(num - grad[i]) <= 1e-9 + 1e-6 * fabs(num), "%s[%d]: analytic %.12g, numeric %.12g", what, i,
              grad[i], num);
    }
}

static void test_gradients(void) {
    moe_rng rng = moe_rng_seeded(5);
    moe_real logits[T * E], scores[T * E], grad[T * E];
    int counts[E] = {10, 3, 12, 7}; /* sums to T*k = 32 */
    moe_rng_fill_uniform(&rng, logits, T * E, 2);
    for (int f = 0; f < 2; f++) {
        moe_score_func func = f ? MOE_SCORE_SIGMOID : MOE_SCORE_SOFTMAX;
        moe_router_scores_cpu(func, logits, T, E, scores);
        memset(grad, 0, sizeof grad);
        moe_router_load_balance_loss_backward_cpu(func, scores, counts, T, T, E, 2, 1.0, grad);
        check_fd(f ? "d aux/d sigmoid scores" : "d aux/d softmax probs", aux_of_scores, func, scores, counts, grad);
    }
    memset(grad, 0, sizeof grad);
    moe_router_z_loss_backward_cpu(logits, T, T, E, 1.0, grad);
    check_fd("d z/d logits", z_of_logits, MOE_SCORE_SOFTMAX, logits, counts, grad);
}

/* Sigmoid routing whose router prefers expert 0 for every token (a constant input feature). */
static void test_bias_update(void) {
    enum { D = 8, F = 4, TT = 256, K = 2 };
    moe_config cfg = moe_config_default(D, F, E, K);
    cfg.score_func = MOE_SCORE_SIGMOID;
    cfg.bias_update_rate = 0.02f;
    moe_rng rng = moe_rng_seeded(9);
    test_weights tw = test_weights_random(&cfg, 1, &rng);
    moe_real *x = test_alloc_uniform(&rng, TT * D, 1), *out = test_alloc_uniform(&rng, TT * D, 0);
    for (int t = 0; t < TT; t++) x[t * D] = 1;
    for (int e = 0; e < E; e++) tw.w.router_w[e * D] = e == 0 ? 3 : 0;
    moe_layer *L;
    CHECK_OK(moe_layer_create(&cfg, NULL, NULL, &L));
    moe_real *bias = moe_layer_expert_bias(L);
    moe_layer_stats st;
    int first_max = 0, last_max = 0;
    for (int step = 0; step < 200; step++) {
        CHECK_OK(moe_layer_forward(L, &tw.w, x, TT, out, &st));
        moe_real before[E];
        memcpy(before, bias, sizeof before);
        CHECK_OK(moe_layer_update_expert_bias(L));
        int max = 0, mean = TT * K / E;
        for (int e = 0; e < E; e++) {
            int n = st.num_selected_per_expert[e];
            double want = before[e] + cfg.bias_update_rate * ((n < mean) - (n > mean));
            CHECK(bias[e] == want, "step %d expert %d: load %d mean %d, bias %g -> %g", step, e, n, mean,
                  before[e], bias[e]);
            max = n > max ? n : max;
        }
        if (step == 0) first_max = max;
        last_max = max;
    }
    printf("bias update: max expert load %d -> %d (mean %d)\n", first_max, last_max, TT * K / E);
    CHECK(first_max > 220 && last_max < 180, "loads did not flatten: %d -> %d", first_max, last_max);
    moe_config softmax_cfg = moe_config_default(D, F, E, K);
    moe_layer *L2;
    CHECK_OK(moe_layer_create(&softmax_cfg, NULL, NULL, &L2));
    CHECK(moe_layer_update_expert_bias(L2) == MOE_ERR_INVALID_CONFIG, "bias update allowed for softmax routing");
    moe_layer_destroy(L2);
    moe_layer_destroy(L);
    test_weights_free(&tw);
    free(x), free(out);
}

int main(void) {
    test_known_values();
    test_gradients();
    test_bias_update();
    return test_finish("test_balancing");
}
