/* test_runtime_scratch.c — the runtime's shared scratch (moe/runtime.h moe_runtime_scratch), which every MoE layer
 * of a runtime uses for its experts' per-segment weight-gradient leaves:
 *  - it grows to the largest request and keeps its buffer for smaller ones; a bad slot is refused;
 *  - two world-invariant layers (8 shards, so 8 segments per expert) sharing one runtime, run as a model runs them
 *    (forward 0, forward 1, backward 1, backward 0, twice), give bitwise the outputs and gradients of the same two
 *    layers each on a runtime of its own: nothing one layer leaves in the scratch reaches the other.
 *   meson test -C build test_runtime_scratch */
#include <stdlib.h>
#include <string.h>

#include "alltoall/parallel.h"
#include "core/fail.h"
#include "core/rng.h"
#include "moe/moe.h"
#include "moe/runtime.h"
#include "test_util.h"

enum { T = 64, D = 16, F = 24, E = 4, K = 2, LAYERS = 2, ROUNDS = 2 };

static void check_growth(void) {
    moe_runtime *rt;
    CHECK(moe_runtime_create_cpu(&rt) == MOE_OK, "cpu runtime");
    void *a = NULL, *b = NULL, *c = NULL;
    CHECK(moe_runtime_scratch(rt, MOE_SCRATCH_EXPERT_WGRAD, 1000, &a) == MOE_OK && a, "first request");
    memset(a, 1, 1000);
    CHECK(moe_runtime_scratch(rt, MOE_SCRATCH_EXPERT_WGRAD, 10, &b) == MOE_OK && b == a,
          "a smaller request got another buffer");
    CHECK(moe_runtime_scratch(rt, MOE_SCRATCH_EXPERT_WGRAD, 5000, &c) == MOE_OK && c, "a larger request");
    memset(c, 2, 5000); /* all of it is ours (ASan would say otherwise) */
    CHECK(moe_runtime_scratch(rt, MOE_SCRATCH_SLOTS, 10, &a) == MOE_ERR_INVALID_ARG, "a bad slot is not refused");
    moe_runtime_destroy(rt);
}

typedef struct {
    moe_real *w[LAYERS], *g[LAYERS], *y[LAYERS], *dx[LAYERS];
} results;

/* Both layers on runtimes rts[0], rts[1] (the same one, or two). */
static void run_layers(moe_runtime *rts[LAYERS], const moe_real *x, const moe_real *dy, results *r) {
    moe_config cfg = moe_config_default(D, F, E, K);
    cfg.num_shards = 8;
    const size_t P = moe_layer_num_params(&cfg, 1);
    moe_parallel *par;
    CHECK(moe_parallel_create_self(&par) == MOE_OK, "self layout");
    moe_layer *layer[LAYERS];
    moe_layer_weights w[LAYERS], g[LAYERS];
    for (int l = 0; l < LAYERS; l++) {
        moe_status st = moe_layer_create(&cfg, rts[l], par, &layer[l]);
        CHECK(st == MOE_OK, "layer %d: %s", l, moe_failure_message(st));
        if (st != MOE_OK) exit(test_finish("test_runtime_scratch"));
        r->w[l] = calloc(P, sizeof(moe_real)), r->g[l] = calloc(P, sizeof(moe_real));
        r->y[l] = calloc((size_t)T * D, sizeof(moe_real)), r->dx[l] = calloc((size_t)T * D, sizeof(moe_real));
        w[l] = moe_layer_weights_view(&cfg, 1, r->w[l]), g[l] = moe_layer_weights_view(&cfg, 1, r->g[l]);
        moe_rng rng = moe_rng_seeded(100 + (uint64_t)l);
        moe_layer_weights_init(&cfg, 1, &w[l], &rng);
    }
    for (int round = 0; round < ROUNDS; round++) {
        /* a model's order: layer 1 reads layer 0's output; backward in reverse */
        CHECK(moe_layer_forward(layer[0], &w[0], x, T, r->y[0], NULL) == MOE_OK, "forward 0");
        CHECK(moe_layer_forward(layer[1], &w[1], r->y[0], T, r->y[1], NULL) == MOE_OK, "forward 1");
        CHECK(moe_layer_backward(layer[1], &w[1], dy, r->dx[1], &g[1]) == MOE_OK, "backward 1");
        CHECK(moe_layer_backward(layer[0], &w[0], r->dx[1], r->dx[0], &g[0]) == MOE_OK, "backward 0");
    }
    for (int l = 0; l < LAYERS; l++) moe_layer_destroy(layer[l]);
    moe_parallel_destroy(par);
}

static void free_results(results *r) {
    for (int l = 0; l < LAYERS; l++) free(r->w[l]), free(r->g[l]), free(r->y[l]), free(r->dx[l]);
}

static void check_shared_by_layers(void) {
    moe_real *x = malloc((size_t)T * D * sizeof *x), *dy = malloc((size_t)T * D * sizeof *dy);
    moe_rng rng = moe_rng_seeded(7);
    moe_rng_fill_uniform(&rng, x, (size_t)T * D, 1.0);
    moe_rng_fill_uniform(&rng, dy, (size_t)T * D, 1.0);
    moe_runtime *shared, *own[LAYERS];
    CHECK(moe_runtime_create_cpu(&shared) == MOE_OK && moe_runtime_create_cpu(&own[0]) == MOE_OK &&
              moe_runtime_create_cpu(&own[1]) == MOE_OK, "cpu runtimes");
    moe_runtime *both[LAYERS] = {shared, shared};
    results one, two;
    run_layers(both, x, dy, &one);
    run_layers(own, x, dy, &two);
    const moe_config cfg = moe_config_default(D, F, E, K);
    const size_t P = moe_layer_num_params(&cfg, 1);
    for (int l = 0; l < LAYERS; l++) {
        CHECK(!memcmp(one.y[l], two.y[l], (size_t)T * D * sizeof(moe_real)), "layer %d output differs", l);
        CHECK(!memcmp(one.dx[l], two.dx[l], (size_t)T * D * sizeof(moe_real)), "layer %d dx differs", l);
        CHECK(!memcmp(one.g[l], two.g[l], P * sizeof(moe_real)), "layer %d weight gradients differ", l);
    }
    free_results(&one), free_results(&two);
    moe_runtime_destroy(shared), moe_runtime_destroy(own[0]), moe_runtime_destroy(own[1]);
    free(x), free(dy);
}

int main(void) {
    check_growth();
    check_shared_by_layers();
    return test_finish("test_runtime_scratch");
}
