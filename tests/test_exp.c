/* test_exp.c — core/real.h's moe__exp_poly, the float build's exp: within 2 ulp of e^x (computed in double) over
 * its whole range, the edges exact (0, inf, NaN, exp(0) = 1), and the same bits from a vectorised loop as from
 * one call at a time (what makes it safe for layout invariance). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/real.h"
#include "core/rng.h"
#include "tests/test_util.h"

/* one element at a time: a loop calling a function that is not inlined is not vectorised */
__attribute__((noinline)) static float exp_alone(float x) { return moe__exp_poly(x); }

/* the distance from y to e^x in units of the float spacing at e^x */
static double ulps(float y, float x) {
    const double want = exp((double)x);
    int e;
    frexp(want, &e);
    const double ulp = ldexp(1.0, (e - 1 > -126 ? e - 1 : -126) - 23);
    return fabs((double)y - want) / ulp;
}

int main(void) {
    enum { N = 1 << 22 };
    float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
    CHECK(x && y, "out of memory");
    moe_rng rng = moe_rng_seeded(1234);
    for (long i = 0; i < N; i++)
        x[i] = i < N / 2 ? -87.3f + 176.0f * (float)i / (N / 2) : (float)(0.7 + 88.0 * moe_rng_uniform(&rng));
    for (long i = 0; i < N; i++) y[i] = moe__exp_poly(x[i]); /* vectorised at -O2 and above */
    double worst = 0;
    float worst_x = 0;
    long differ = 0;
    for (long i = 0; i < N; i++) {
        const double u = ulps(y[i], x[i]);
        if (u > worst) worst = u, worst_x = x[i];
        const float alone = exp_alone(x[i]);
        differ += memcmp(&alone, &y[i], sizeof alone) != 0;
    }
    printf("moe__exp_poly: worst error %.3f ulp (at x = %.9g) over %d values in [-87.3, 88.7)\n", worst, worst_x, N);
    CHECK(worst <= 2.0, "error %.3f ulp at x = %.9g, more than 2", worst, worst_x);
    CHECK(differ == 0, "%ld values got other bits from the vectorised loop than from one call", differ);

    CHECK(moe__exp_poly(0.0f) == 1.0f && moe__exp_poly(-0.0f) == 1.0f, "exp(0) is not 1");
    CHECK(moe__exp_poly(-87.4f) == 0.0f && moe__exp_poly(-1e30f) == 0.0f && moe__exp_poly(-INFINITY) == 0.0f,
          "below the range: not 0");
    CHECK(isinf(moe__exp_poly(88.8f)) && isinf(moe__exp_poly(1e30f)) && isinf(moe__exp_poly(INFINITY)),
          "above the range: not inf");
    CHECK(isnan(moe__exp_poly(NAN)) && isnan(moe__exp_poly(-NAN)), "NaN does not stay NaN");
    free(x), free(y);
    return test_finish("test_exp");
}
