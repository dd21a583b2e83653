/* test_config.c — bad input gets a status, never a crash: invalid configurations, NULL arguments,
 * backward before forward, non-finite inputs; and every status has its own string. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tests/test_util.h"

static void expect_invalid(const char *what, moe_config cfg) {
    moe_layer *L = (moe_layer *)&cfg; /* must be reset to NULL on failure */
    CHECK(moe_config_validate(&cfg) == MOE_ERR_INVALID_CONFIG, "%s accepted by validate", what);
    CHECK(moe_layer_create(&cfg, NULL, NULL, &L) == MOE_ERR_INVALID_CONFIG && L == NULL, "%s accepted by create", what);
    const char *problem = moe_config_problem(&cfg);
    CHECK(problem && *problem, "%s: no explanation", what);
    if (problem) printf("%-28s -> %s\n", what, problem);
}

/* The layout's ep against the config (the layer takes it from its moe_parallel: tests/test_ep_faults.c's
 * ep_not_dividing_experts has a layer refuse one). */
static void expect_invalid_ep(const char *what, const moe_config *cfg, int ep) {
    const char *problem = moe_config_ep_problem(cfg, ep);
    CHECK(problem && *problem, "%s accepted", what);
    if (problem) printf("%-28s -> %s\n", what, problem);
}

static void test_configs(void) {
    const moe_config ok = moe_config_default(8, 16, 4, 2);
    CHECK_OK(moe_config_validate(&ok));
    CHECK(moe_config_problem(&ok) == NULL, "a valid config has a problem: %s", moe_config_problem(&ok));
    moe_config c;
    c = ok, c.top_k = 0, expect_invalid("k = 0", c);
    c = ok, c.top_k = 5, expect_invalid("k > E", c);
    c = ok, c.num_experts = 0, expect_invalid("E = 0", c);
    c = ok, c.d_model = 0, expect_invalid("d_model = 0", c);
    c = ok, c.d_ff = -3, expect_invalid("d_ff < 0", c);
    CHECK(moe_config_ep_problem(&ok, 4) == NULL, "ep 4 of 4 experts refused: %s", moe_config_ep_problem(&ok, 4));
    expect_invalid_ep("E not divisible by ep", &ok, 3);
    expect_invalid_ep("ep = 0", &ok, 0);
    c = ok, c.layer_index = -1, expect_invalid("negative layer index", c);
    c = ok, c.score_func = (moe_score_func)7, expect_invalid("unknown score function", c);
    c = ok, c.drop_priority = (moe_drop_priority)-1, expect_invalid("unknown drop priority", c);
    c = ok, c.renormalize = 2, expect_invalid("renormalize = 2", c);
    c = ok, c.capacity_factor = NAN, expect_invalid("NaN capacity factor", c);
    c = ok, c.aux_loss_coef = -0.1f, expect_invalid("negative aux coefficient", c);
    c = ok, c.z_loss_coef = INFINITY, expect_invalid("infinite z coefficient", c);
    c = ok, c.bias_update_rate = -1, expect_invalid("negative bias rate", c);
    CHECK(moe_config_validate(NULL) == MOE_ERR_INVALID_ARG, "NULL config");
    CHECK(moe_layer_create(&ok, NULL, NULL, NULL) == MOE_ERR_INVALID_ARG, "NULL out pointer");
}

static void test_calls(void) {
    moe_config cfg = moe_config_default(8, 16, 4, 2);
    moe_rng rng = moe_rng_seeded(1);
    test_weights tw = test_weights_random(&cfg, 1, &rng), g = test_weights_zero(&cfg, 1);
    moe_real *x = test_alloc_uniform(&rng, 10 * 8, 1), *out = test_alloc_uniform(&rng, 10 * 8, 0);
    moe_layer *L;
    CHECK_OK(moe_layer_create(&cfg, NULL, NULL, &L));
    CHECK(moe_layer_backward(L, &tw.w, out, x, &g.w) == MOE_ERR_NO_FORWARD, "backward before forward");
    CHECK(moe_layer_update_expert_bias(L) == MOE_ERR_INVALID_CONFIG, "bias update under softmax");
    CHECK(moe_layer_forward(L, &tw.w, x, 0, out, NULL) == MOE_ERR_INVALID_ARG, "zero tokens");
    CHECK(moe_layer_forward(L, &tw.w, NULL, 10, out, NULL) == MOE_ERR_INVALID_ARG, "NULL input");
    CHECK(moe_layer_forward(NULL, &tw.w, x, 10, out, NULL) == MOE_ERR_INVALID_ARG, "NULL layer");
    x[17] = NAN;
    CHECK(moe_layer_forward(L, &tw.w, x, 10, out, NULL) == MOE_ERR_NONFINITE, "NaN input not reported");
    CHECK(moe_layer_backward(L, &tw.w, out, x, &g.w) == MOE_ERR_NO_FORWARD, "backward after a failed forward");
    x[17] = 0.5f;
    CHECK_OK(moe_layer_forward(L, &tw.w, x, 10, out, NULL));
    CHECK_OK(moe_layer_backward(L, &tw.w, out, x, &g.w));
    /* a probe's misuses (2026-12-07): a weight view left NULL (a crash under OpenBLAS), NULL layers where other calls
     * took them, a layer sharing its bias with itself or with a layer that shares its own (freed, then read) */
    moe_config negative = cfg;
    negative.d_model = -4;
    CHECK(moe_layer_num_params(&cfg, 0) == 0 && moe_layer_num_params(&negative, 1) == 0 &&
              moe_layer_num_params(&cfg, 3) == 0 && moe_layer_num_params(&cfg, 2) == 4 * 8 + 3 * 2 * 16 * 8,
          "parameter counts of ep 0, a negative width, ep 3 of 4 experts, ep 2");
    moe_layer_weights no_w2 = tw.w;
    no_w2.w2 = NULL;
    CHECK(moe_layer_forward(L, &no_w2, x, 10, out, NULL) == MOE_ERR_INVALID_ARG, "a NULL w2");
    CHECK(moe_layer_finish_forward(NULL, NULL) == MOE_ERR_INVALID_ARG, "finish of a NULL layer");
    moe_layer_defer_finish(NULL, 1);
    moe_config sig = cfg;
    sig.score_func = MOE_SCORE_SIGMOID;
    moe_layer *A, *B;
    CHECK_OK(moe_layer_create(&sig, NULL, NULL, &A));
    CHECK_OK(moe_layer_create(&sig, NULL, NULL, &B));
    CHECK_OK(moe_layer_share_expert_bias(A, A));
    CHECK_OK(moe_layer_share_expert_bias(B, A));
    CHECK_OK(moe_layer_share_expert_bias(A, B));
    moe_layer_expert_bias(A)[0] = 0.25f, moe_layer_expert_bias(B)[1] = 0.5f; /* one live bias: ASan would see it freed */
    CHECK(moe_layer_expert_bias(A) == moe_layer_expert_bias(B) && moe_layer_expert_bias(A)[1] == 0.5f,
          "two layers sharing each other's bias hold two");
    CHECK_OK(moe_layer_forward(A, &tw.w, x, 10, out, NULL));
    moe_layer_destroy(B), moe_layer_destroy(A);
    /* a bigger batch after a smaller one: the workspace grows */
    moe_real *x2 = test_alloc_uniform(&rng, 300 * 8, 1), *out2 = test_alloc_uniform(&rng, 300 * 8, 0);
    CHECK_OK(moe_layer_forward(L, &tw.w, x2, 300, out2, NULL));
    moe_layer_destroy(L);
    moe_layer_destroy(NULL);
    test_weights_free(&tw), test_weights_free(&g);
    free(x), free(out), free(x2), free(out2);
}

static void test_status_strings(void) {
    for (int a = 0; a < MOE_STATUS_COUNT; a++) {
        const char *s = moe_status_string((moe_status)a);
        CHECK(s && *s && strcmp(s, "unknown status"), "status %d has no string", a);
        for (int b = 0; b < a; b++)
            CHECK(strcmp(s, moe_status_string((moe_status)b)), "statuses %d, %d share '%s'", a, b, s);
    }
    CHECK(!strcmp(moe_status_string(MOE_STATUS_COUNT), "unknown status"), "out-of-range status");
}

int main(void) {
    test_configs();
    test_calls();
    test_status_strings();
    return test_finish("test_config");
}
