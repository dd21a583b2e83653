/* test_dispatch_layout.c — exact checks of data movement (no tolerance anywhere):
 *  - the permutation is a bijection from kept assignments onto rows 0..num_kept-1, ordered by
 *    (expert, token), with perm_token the inverse; dropped assignments have slot -1;
 *  - num_tokens_per_expert, expert_offset and num_tokens_per_rank match brute-force counts;
 *  - permute then combine with unit gates is the identity times each token's kept fan-out.
 * Payload rows encode (token, column) as exact integers, DeepEP-style, so every moved row is checked. */
#include <stdlib.h>
#include <string.h>

#include "kernels/permute.h"
#include "router/capacity.h"
#include "tests/test_routing.h"
#include "router/layout.h"
#include "tests/test_util.h"

/* Random distinct top-k choices per token, skewed toward low ids so capacity bites; random scores. */
static void random_routing(test_routing *r, moe_rng *rng) {
    int T = r->num_tokens, E = r->num_experts, k = r->top_k;
    for (int t = 0; t < T; t++) {
        for (int e = 0; e < E; e++) r->scores[(size_t)t * E + e] = (moe_real)moe_rng_uniform(rng);
        for (int j = 0; j < k; j++) {
            int e, dup;
            do {
                double u = (moe_rng_uniform(rng) + 1) / 2;
                e = (int)(u * u * E) % E;
                dup = 0;
                for (int i = 0; i < j; i++) dup |= r->expert[t * k + i] == e;
            } while (dup);
            r->expert[t * k + j] = e;
            r->expert_score[t * k + j] = r->scores[(size_t)t * E + e];
        }
    }
}

static void check_layout(const test_routing *r) {
    int T = r->num_tokens, E = r->num_experts, k = r->top_k, R = r->num_ranks;
    int *hits = calloc((size_t)T * k + 1, sizeof(int));
    int kept = 0;
    for (int a = 0; a < T * k; a++) {
        if (!r->kept[a]) {
            CHECK(r->slot[a] == -1, "dropped assignment %d has slot %d", a, r->slot[a]);
            continue;
        }
        kept++;
        int s = r->slot[a];
        CHECK(s >= 0 && s < r->num_kept, "slot %d of assignment %d out of [0, %d)", s, a, r->num_kept);
        if (s < 0 || s >= r->num_kept) continue;
        hits[s]++;
        CHECK(r->perm_token[s] == a / k, "perm_token[%d] = %d, want %d", s, r->perm_token[s], a / k);
        int e = r->expert[a];
        CHECK(s >= r->expert_offset[e] && s < r->expert_offset[e + 1], "row %d outside expert %d's block", s, e);
    }
    CHECK(kept == r->num_kept && T * k - kept == r->num_dropped, "kept %d vs %d, dropped %d", kept, r->num_kept,
          r->num_dropped);
    for (int s = 0; s < r->num_kept; s++) CHECK(hits[s] == 1, "row %d hit %d times", s, hits[s]);
    /* rows of one expert ascend by token (stable) */
    for (int e = 0; e < E; e++)
        for (int s = r->expert_offset[e] + 1; s < r->expert_offset[e + 1]; s++)
            CHECK(r->perm_token[s - 1] < r->perm_token[s], "expert %d rows %d,%d out of token order", e, s - 1, s);
    /* brute-force counts */
    int offset = 0;
    for (int e = 0; e < E; e++) {
        int n = 0;
        for (int a = 0; a < T * k; a++) n += r->expert[a] == e && r->kept[a];
        CHECK(r->num_tokens_per_expert[e] == n, "expert %d: count %d, brute force %d", e, r->num_tokens_per_expert[e],
              n);
        CHECK(r->expert_offset[e] == offset, "offset[%d] = %d, want %d", e, r->expert_offset[e], offset);
        offset += n;
    }
    for (int q = 0; q < R; q++) {
        int n = 0;
        for (int a = 0; a < T * k; a++) n += r->kept[a] && r->expert[a] / (E / R) == q;
        CHECK(r->num_tokens_per_rank[q] == n, "rank %d: count %d, brute force %d", q, r->num_tokens_per_rank[q], n);
    }
    free(hits);
}

static void check_round_trip(const test_routing *r, int d) {
    int T = r->num_tokens, k = r->top_k;
    moe_real *x = malloc((size_t)T * d * sizeof *x), *xp = malloc(((size_t)T * k + 1) * d * sizeof *x);
    moe_real *back = malloc((size_t)T * d * sizeof *x);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < d; i++) x[(size_t)t * d + i] = (moe_real)(t * 64 + i); /* exact: < 2^24 */
    moe_permute_rows_cpu(x, r->perm_token, r->num_kept, d, xp);
    for (int s = 0; s < r->num_kept; s++)
        for (int i = 0; i < d; i++)
            CHECK(xp[(size_t)s * d + i] == (moe_real)(r->perm_token[s] * 64 + i), "row %d col %d carries %g", s, i,
                  (double)xp[(size_t)s * d + i]);
    moe_combine_rows_cpu(xp, r->slot, NULL, T, k, d, back);
    for (int t = 0; t < T; t++) {
        int fan_out = 0;
        for (int j = 0; j < k; j++) fan_out += r->kept[t * k + j];
        for (int i = 0; i < d; i++)
            CHECK(back[(size_t)t * d + i] == fan_out * x[(size_t)t * d + i], "token %d col %d: %g != %d * %g", t, i,
                  (double)back[(size_t)t * d + i], fan_out, (double)x[(size_t)t * d + i]);
    }
    free(x), free(xp), free(back);
}

int main(void) {
    const struct {
        int T, E, k, R;
        float cf;
        moe_drop_priority prio;
    } cases[] = {
        {1, 1, 1, 1, 0, MOE_DROP_BY_TOKEN_ORDER},      {37, 8, 2, 4, 0, MOE_DROP_BY_TOKEN_ORDER},
        {37, 8, 2, 2, 1.0f, MOE_DROP_BY_TOKEN_ORDER},  {37, 8, 2, 2, 1.0f, MOE_DROP_BY_SCORE},
        {200, 16, 4, 4, 1.25f, MOE_DROP_BY_SCORE},     {200, 16, 1, 8, 0.5f, MOE_DROP_BY_TOKEN_ORDER},
        {64, 64, 8, 64, 2.0f, MOE_DROP_BY_TOKEN_ORDER}, {9, 4, 3, 1, 1.0f, MOE_DROP_BY_SCORE},
    };
    moe_rng rng = moe_rng_seeded(7);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        test_routing r;
        CHECK_OK(test_routing_alloc(&r, cases[c].T, cases[c].E, cases[c].k, cases[c].R));
        r.num_tokens = cases[c].T;
        random_routing(&r, &rng);
        CHECK_OK(test_routing_capacity(&r, cases[c].cf, cases[c].prio));
        test_routing_layout(&r);
        if (cases[c].cf > 0 && cases[c].cf < 1.5f) CHECK(r.num_dropped > 0, "case %zu was meant to drop", c);
        check_layout(&r);
        check_round_trip(&r, 5);
        printf("T=%3d E=%2d k=%d R=%2d cf=%-4g kept=%4d dropped=%3d\n", r.num_tokens, r.num_experts, r.top_k,
               r.num_ranks, cases[c].cf, r.num_kept, r.num_dropped);
        test_routing_free(&r);
    }
    return test_finish("test_dispatch_layout");
}
