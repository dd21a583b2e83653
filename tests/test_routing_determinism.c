/* test_routing_determinism.c — routing and the layer are pure functions of their inputs:
 *  - the same input twice (same layer, and a fresh layer) gives bitwise identical routing, outputs and
 *    gradients;
 *  - exact ties in the router go to the lower expert id (top-k alone, and through the whole layer with
 *    two identical router rows);
 *  - the result does not depend on the number of OpenBLAS threads (1 vs 2). */
#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#include "moe/layer_internal.h"
#include "router/topk.h"
#include "tests/test_util.h"

enum { T = 512, D = 64, F = 128, E = 8, K = 2 };

typedef struct {
    moe_real out[T * D], dx[T * D];
    int expert[T * K], slot[T * K];
    moe_real gate[T * K];
    moe_real *grads;
    size_t num_params;
} run_result;

static void run_layer(const moe_config *cfg, const test_weights *tw, const moe_real *x, const moe_real *dout,
                      moe_layer *L, run_result *res) {
    test_weights g = test_weights_zero(cfg, 1);
    CHECK_OK(moe_layer_forward(L, &tw->w, x, T, res->out, NULL));
    CHECK_OK(moe_layer_backward(L, &tw->w, dout, res->dx, &g.w));
    const moe_token_routing *r = moe__layer_token_routing(L);
    memcpy(res->expert, r->expert, sizeof res->expert);
    memcpy(res->slot, r->slot, sizeof res->slot);
    memcpy(res->gate, r->gate, sizeof res->gate);
    res->grads = g.buffer;
    res->num_params = moe_layer_num_params(cfg, 1);
}

static void check_identical(const char *what, const run_result *a, const run_result *b) {
    CHECK(!memcmp(a->expert, b->expert, sizeof a->expert), "%s: expert choices differ", what);
    CHECK(!memcmp(a->slot, b->slot, sizeof a->slot), "%s: slots differ", what);
    CHECK(!memcmp(a->gate, b->gate, sizeof a->gate), "%s: gates differ", what);
    CHECK(!memcmp(a->out, b->out, sizeof a->out), "%s: outputs differ", what);
    CHECK(!memcmp(a->dx, b->dx, sizeof a->dx), "%s: input gradients differ", what);
    CHECK(!memcmp(a->grads, b->grads, a->num_params * sizeof(moe_real)), "%s: weight gradients differ", what);
}

static void test_repeat_and_threads(void) {
    moe_config cfg = moe_config_default(D, F, E, K);
    cfg.capacity_factor = 1.0f;
    moe_rng rng = moe_rng_seeded(11);
    test_weights tw = test_weights_random(&cfg, 1, &rng);
    moe_real *x = test_alloc_uniform(&rng, T * D, 1), *dout = test_alloc_uniform(&rng, T * D, 1);
    static run_result first, again, fresh, one_thread, two_threads;
    moe_layer *L, *L2;
    CHECK_OK(moe_layer_create(&cfg, NULL, NULL, &L));
    CHECK_OK(moe_layer_create(&cfg, NULL, NULL, &L2));
    run_layer(&cfg, &tw, x, dout, L, &first);
    run_layer(&cfg, &tw, x, dout, L, &again);
    run_layer(&cfg, &tw, x, dout, L2, &fresh);
    check_identical("same layer twice", &first, &again);
    check_identical("fresh layer", &first, &fresh);

    openblas_set_num_threads(1);
    run_layer(&cfg, &tw, x, dout, L, &one_thread);
    openblas_set_num_threads(2);
    run_layer(&cfg, &tw, x, dout, L, &two_threads);
    check_identical("1 vs 2 OpenBLAS threads", &one_thread, &two_threads);
    check_identical("default vs 1 OpenBLAS thread", &first, &one_thread);
    printf("threads: default %d; 1 and 2 threads compared bitwise\n", openblas_get_num_threads());

    run_result *all[] = {&first, &again, &fresh, &one_thread, &two_threads};
    for (int i = 0; i < 5; i++) free(all[i]->grads);
    moe_layer_destroy(L);
    moe_layer_destroy(L2);
    test_weights_free(&tw);
    free(x), free(dout);
}

static void test_topk_ties(void) {
    /* token 0: all equal -> 0,1,2; token 1: 3 and 5 tie for first -> 3,5 then the tie 1/4 -> 1 */
    const moe_real scores[2 * 6] = {0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, /**/ 0.1f, 0.3f, 0.2f, 0.9f, 0.3f, 0.9f};
    int expert[6];
    moe_router_topk_cpu(scores, 2, 6, 3, expert);
    const int want[6] = {0, 1, 2, 3, 5, 1};
    for (int i = 0; i < 6; i++) CHECK(expert[i] == want[i], "choice %d: %d, want %d", i, expert[i], want[i]);
}

/* Router rows 2 and 5 identical -> their logits tie exactly for every token; 5 must never win over 2. */
static void test_layer_ties(void) {
    enum { TT = 32 };
    moe_config cfg = moe_config_default(D, F, E, K);
    moe_rng rng = moe_rng_seeded(12);
    test_weights tw = test_weights_random(&cfg, 1, &rng);
    memcpy(tw.w.router_w + 5 * D, tw.w.router_w + 2 * D, D * sizeof(moe_real));
    memset(tw.w.router_w + 6 * D, 0, D * sizeof(moe_real)); /* rows 6 and 7: zero logits, a tie of 0s */
    memset(tw.w.router_w + 7 * D, 0, D * sizeof(moe_real));
    moe_real *x = test_alloc_uniform(&rng, TT * D, 1), *out = test_alloc_uniform(&rng, TT * D, 0);
    moe_layer *L;
    CHECK_OK(moe_layer_create(&cfg, NULL, NULL, &L));
    CHECK_OK(moe_layer_forward(L, &tw.w, x, TT, out, NULL));
    const moe_token_routing *r = moe__layer_token_routing(L);
    int tie_hits = 0;
    for (int t = 0; t < TT; t++) {
        const int *c = r->expert + t * K;
        int has2 = c[0] == 2 || c[1] == 2, has5 = c[0] == 5 || c[1] == 5;
        int has6 = c[0] == 6 || c[1] == 6, has7 = c[0] == 7 || c[1] == 7;
        CHECK(!has5 || has2, "token %d picked 5 (%d,%d) without its twin 2", t, c[0], c[1]);
        CHECK(!has7 || has6, "token %d picked 7 (%d,%d) without its twin 6", t, c[0], c[1]);
        if (has2 && has5) CHECK(c[0] == 2 && c[1] == 5, "token %d: tie ordered %d,%d", t, c[0], c[1]);
        tie_hits += has2 || has6;
    }
    CHECK(tie_hits > 0, "no token reached a tie: the test would not test ties");
    moe_layer_destroy(L);
    test_weights_free(&tw);
    free(x), free(out);
}

int main(void) {
    test_topk_ties();
    test_layer_ties();
    test_repeat_and_threads();
    return test_finish("test_routing_determinism");
}
