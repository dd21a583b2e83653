/* test_capacity.c — capacity limiting on hand-built routings where the dropped set is known exactly,
 * for both priorities; the capacity formula; dropless keeps everything; in the layer, a token whose
 * every assignment was dropped outputs exactly zero. */
#include <stdlib.h>
#include <string.h>

#include "moe/layer_internal.h"
#include "alltoall/comm.h"
#include "router/capacity.h"
#include "tests/test_routing.h"
#include "tests/test_util.h"

static void check_kept(const char *name, const test_routing *r, const unsigned char *want) {
    for (int a = 0; a < r->num_tokens * r->top_k; a++)
        CHECK(r->kept[a] == want[a], "%s: assignment %d (token %d, choice %d) kept=%d, want %d", name, a,
              a / r->top_k, a % r->top_k, r->kept[a], want[a]);
}

/* Builds a routing of T tokens from explicit choices and their scores in a [T, E] table. */
static test_routing make_routing(int T, int E, int k, const int *expert, const moe_real *scores) {
    test_routing r;
    CHECK_OK(test_routing_alloc(&r, T, E, k, 1));
    r.num_tokens = T;
    memcpy(r.expert, expert, (size_t)T * k * sizeof(int));
    for (int a = 0; a < T * k; a++) r.expert_score[a] = scores[(size_t)(a / k) * E + expert[a]];
    return r;
}

static void test_formula(void) {
    const struct {
        float cf;
        int T, k, E, want;
    } cases[] = {{1.0f, 6, 1, 2, 3},  {1.1f, 40, 2, 8, 11}, {1.25f, 10, 1, 4, 4}, {1.0f, 7, 1, 2, 4},
                 {2.0f, 1, 1, 8, 1},  {0.0f, 10, 2, 4, 0},  {-1.0f, 10, 2, 4, 0}, {1.0f, 4096, 2, 8, 1024},
                 /* a probe, 2026-12-07: a tiny factor gave 0 (dropless), a huge one overflowed the int (every token
                  * dropped), 2^20 and more lost a slot to the slack */
                 {1e-7f, 16, 2, 8, 1}, {1e6f, 16384, 2, 1, 16384}, {2e9f, 4096, 2, 8, 4096},
                 {1.0f, 4194304, 2, 8, 1048576}, {2.0f, 1 << 24, 8, 64, 4194304}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int c = moe_router_capacity(cases[i].cf, cases[i].T, cases[i].k, cases[i].E);
        CHECK(c == cases[i].want, "C(cf=%g, T=%d, k=%d, E=%d) = %d, want %d", cases[i].cf, cases[i].T, cases[i].k,
              cases[i].E, c, cases[i].want);
    }
}

/* k = 1, T = 6, E = 2, cf = 1 -> C = 3. Expert 0 is chosen by tokens 0,1,3,4,5. */
static void test_top1(void) {
    const int expert[6] = {0, 0, 1, 0, 0, 0};
    const moe_real scores[12] = {0.6f, 0.4f, 0.9f, 0.1f, 0.2f, 0.8f, 0.7f, 0.3f, 0.95f, 0.05f, 0.7f, 0.3f};
    test_routing r = make_routing(6, 2, 1, expert, scores);

    CHECK_OK(test_routing_capacity(&r, 1.0f, MOE_DROP_BY_TOKEN_ORDER));
    CHECK(r.capacity == 3, "capacity %d", r.capacity);
    CHECK(r.num_selected_per_expert[0] == 5 && r.num_selected_per_expert[1] == 1, "selected %d %d",
          r.num_selected_per_expert[0], r.num_selected_per_expert[1]);
    check_kept("top1/token-order", &r, (const unsigned char[]){1, 1, 1, 1, 0, 0});

    /* by score: 0.95 (t4), 0.9 (t1), then 0.7 twice: the tie goes to the earlier token t3, t5 is dropped */
    CHECK_OK(test_routing_capacity(&r, 1.0f, MOE_DROP_BY_SCORE));
    check_kept("top1/score", &r, (const unsigned char[]){0, 1, 1, 1, 1, 0});
    /* ... and so does the layer's rule over the world (here one rank), the ties included (mutation testing,
     * 2026-12-08: the later token winning a tie there was caught only by the PyTorch reference suite) */
    moe_comm *self;
    moe_routing_counts counts;
    unsigned char kept[6];
    CHECK_OK(moe_comm_create_self("test", &self));
    CHECK_OK(moe_routing_counts_alloc(&counts, 2));
    counts.num_tokens = 6, counts.nonfinite_local = 0;
    CHECK_OK(moe_router_global_capacity(self, 1.0f, MOE_DROP_BY_SCORE, 2, 1, r.expert, r.expert_score, kept, &counts));
    for (int t = 0; t < 6; t++)
        CHECK(kept[t] == r.kept[t], "global rule, by score: token %d kept=%d, the single-rank rule's %d", t, kept[t],
              r.kept[t]);
    moe_routing_counts_free(&counts);
    moe_comm_destroy(self);

    CHECK_OK(test_routing_capacity(&r, 0.0f, MOE_DROP_BY_SCORE));
    CHECK(r.capacity == 0, "dropless capacity %d", r.capacity);
    check_kept("top1/dropless", &r, (const unsigned char[]){1, 1, 1, 1, 1, 1});
    test_routing_free(&r);
}

/* k = 2, T = 4, E = 4, cf = 0.5 -> C = 1. A dropped first choice leaves the second choice alone. */
static void test_top2(void) {
    const int expert[8] = {0, 1, /**/ 0, 2, /**/ 1, 0, /**/ 3, 2};
    const moe_real scores[16] = {0.1f, 0.2f, 0.0f, 0.0f, /**/ 0.5f, 0.0f, 0.3f, 0.0f,
                                 0.4f, 0.6f, 0.0f, 0.0f, /**/ 0.0f, 0.0f, 0.3f, 0.9f};
    test_routing r = make_routing(4, 4, 2, expert, scores);
    /* token order: expert 0 keeps t0, expert 1 keeps t0, expert 2 keeps t1, expert 3 keeps t3 */
    CHECK_OK(test_routing_capacity(&r, 0.5f, MOE_DROP_BY_TOKEN_ORDER));
    CHECK(r.capacity == 1, "capacity %d", r.capacity);
    check_kept("top2/token-order", &r, (const unsigned char[]){1, 1, 0, 1, 0, 0, 1, 0});
    /* score: expert 0 keeps t1 (0.5), expert 1 keeps t2 (0.6), expert 2 ties 0.3/0.3 -> t1, expert 3 t3 */
    CHECK_OK(test_routing_capacity(&r, 0.5f, MOE_DROP_BY_SCORE));
    check_kept("top2/score", &r, (const unsigned char[]){0, 0, 1, 1, 1, 0, 1, 0});
    test_routing_free(&r);
}

/* Every token to expert 0: dropless keeps all 100; cf = 1 keeps the first 25 (C = 100/4). */
static void test_skew(void) {
    enum { T = 100, E = 4 };
    int expert[T];
    moe_real scores[T * E];
    for (int t = 0; t < T; t++) {
        expert[t] = 0;
        for (int e = 0; e < E; e++) scores[t * E + e] = e == 0 ? 0.7f : 0.1f;
    }
    test_routing r = make_routing(T, E, 1, expert, scores);
    CHECK_OK(test_routing_capacity(&r, -1.0f, MOE_DROP_BY_TOKEN_ORDER));
    int kept = 0;
    for (int t = 0; t < T; t++) kept += r.kept[t];
    CHECK(kept == T, "dropless kept %d of %d", kept, T);
    for (int prio = 0; prio < 2; prio++) {
        CHECK_OK(test_routing_capacity(&r, 1.0f, (moe_drop_priority)prio));
        for (int t = 0; t < T; t++) CHECK(r.kept[t] == (t < 25), "priority %d token %d kept=%d", prio, t, r.kept[t]);
    }
    test_routing_free(&r);
}

/* In the layer: fully dropped tokens give exactly zero; a token's kept assignments still contribute. */
static void test_layer_drops(void) {
    enum { T = 64, D = 16, F = 8, E = 4 };
    moe_config cfg = moe_config_default(D, F, E, 2);
    cfg.capacity_factor = 0.25f; /* C = 8 of the 128 assignments' 32-per-expert average */
    moe_rng rng = moe_rng_seeded(3);
    test_weights tw = test_weights_random(&cfg, 1, &rng);
    moe_real *x = test_alloc_uniform(&rng, T * D, 1), *out = test_alloc_uniform(&rng, T * D, 0);
    moe_layer *L;
    CHECK_OK(moe_layer_create(&cfg, NULL, NULL, &L));
    moe_layer_stats st;
    CHECK_OK(moe_layer_forward(L, &tw.w, x, T, out, &st));
    const moe_token_routing *r = moe__layer_token_routing(L);
    int fully_dropped = 0, partly = 0;
    for (int t = 0; t < T; t++) {
        int kept = r->kept[2 * t] + r->kept[2 * t + 1], nonzero = 0;
        for (int i = 0; i < D; i++) nonzero += out[t * D + i] != 0;
        if (kept == 0) {
            fully_dropped++;
            CHECK(nonzero == 0, "token %d: all dropped but output nonzero", t);
        } else {
            CHECK(nonzero > 0, "token %d: %d kept assignments but zero output", t, kept);
        }
        partly += kept == 1;
    }
    CHECK(st.num_dropped > 0 && fully_dropped > 0 && partly > 0, "dropped %d, fully %d, partly %d",
          st.num_dropped, fully_dropped, partly);
    int sum = 0;
    for (int e = 0; e < E; e++) {
        sum += st.num_tokens_per_expert[e];
        CHECK(st.num_tokens_per_expert[e] <= 8, "expert %d holds %d > C", e, st.num_tokens_per_expert[e]);
    }
    CHECK(sum + st.num_dropped == T * 2, "kept %d + dropped %d != %d", sum, st.num_dropped, T * 2);
    moe_layer_destroy(L);
    test_weights_free(&tw);
    free(x), free(out);
}

int main(void) {
    test_formula();
    test_top1();
    test_top2();
    test_skew();
    test_layer_drops();
    return test_finish("test_capacity");
}
