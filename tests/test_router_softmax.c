/* test_router_softmax.c — the router's fp32 softmax (router/scores.h) against an fp64 reference at E = 8 to 1024
 * (issue 29, part 6): its denominator is summed in a fixed pairwise order, so the error stays near the floor that the
 * exps and the division set. 512 rows of logits ~ N(0, 1) per E; every probability's relative error to
 * exp(l - max) / sum in double must stay within 6e-7 (measured 2026-11-27: 2.6e-7 and 3.0e-7 at E 4 and 8, 4.3e-7,
 * 4.5e-7 and 4.9e-7 at 64, 256 and 1024; the one-at-a-time sum it replaced gives 6.1e-7, 1.1e-6 and 1.9e-6 there and
 * fails this: tried). At E <= 8 the sum is the plain in-order one, bit for bit (what every smaller model computed
 * before). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/real.h"
#include "router/scores.h"
#include "tests/test_util.h"

enum { ROWS = 512 };

/* N(0, 1) by Box-Muller from two uniforms of [0, 1) (the first kept off 0) */
static double normal(moe_rng *rng) {
    const double u1 = 1 - (moe_rng_uniform(rng) + 1) / 2, u2 = (moe_rng_uniform(rng) + 1) / 2;
    return sqrt(-2 * log(u1)) * cos(2 * M_PI * u2);
}

static double worst_relative_error(const moe_real *logits, const moe_real *scores, int E) {
    double worst = 0;
    for (int t = 0; t < ROWS; t++) {
        const moe_real *l = logits + (size_t)t * E;
        double max = l[0], z = 0;
        for (int e = 1; e < E; e++) max = l[e] > max ? l[e] : max;
        for (int e = 0; e < E; e++) z += exp((double)l[e] - max);
        for (int e = 0; e < E; e++) {
            const double p = exp((double)l[e] - max) / z, err = fabs((double)scores[(size_t)t * E + e] - p) / p;
            worst = err > worst ? err : worst;
        }
    }
    return worst;
}

int main(void) {
    const int sizes[] = {4, 8, 64, 256, 1024};
    moe_rng rng = moe_rng_seeded(29);
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        const int E = sizes[k];
        moe_real *logits = malloc(sizeof *logits * ROWS * E), *scores = malloc(sizeof *scores * ROWS * E);
        if (!logits || !scores) return 1;
        for (int i = 0; i < ROWS * E; i++) logits[i] = (moe_real)normal(&rng);
        moe_router_scores_cpu(MOE_SCORE_SOFTMAX, logits, ROWS, E, scores);
        const double err = worst_relative_error(logits, scores, E);
        printf("E %4d: worst relative error of a probability %.3g\n", E, err);
        CHECK(err <= 6e-7, "E %d: a probability %.3g off the fp64 softmax (bound 6e-7)", E, err);
        if (E <= 8) { /* the plain in-order sum, bit for bit */
            int same = 1;
            for (int t = 0; t < ROWS && same; t++) {
                const moe_real *l = logits + (size_t)t * E;
                moe_real max = l[0], sum = 0, e_[8];
                for (int e = 1; e < E; e++) max = l[e] > max ? l[e] : max;
                for (int e = 0; e < E; e++) sum += e_[e] = moe__exp(l[e] - max);
                for (int e = 0; e < E && same; e++) same = e_[e] / sum == scores[(size_t)t * E + e];
            }
            CHECK(same, "E %d: not the in-order sum's bits", E);
        }
        free(logits), free(scores);
    }
    return test_finish("test_router_softmax");
}
