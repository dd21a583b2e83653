/* test_tolerance_check.c — the comparison of tests/test_tolerance.c on the CPU (the GPU tests that use it
 * skip without a GPU, so this is where it is shown to pass and to fail):
 *   within a row's bounds passes; an element outside the element bound, an NMSE above its maximum, a NaN on
 *   either side, an op or a dtype with no row each count exactly one failure; the rms-scaled bound scales
 *   with want; scalars likewise; the table's keys are unique and its bounds non-negative.
 * Run: meson test -C build --suite unit */
#include <math.h>
#include <string.h>

#include "tests/test_tolerance.h"
#include "tests/test_util.h"

enum { N = 1000 };

static int wrong; /* verdicts not as expected; the failures the checks count themselves are taken back */

/* ok and the failures counted since `before` must say `passes` */
static void expect(int passes, int ok, int before, const char *what) {
    int counted = test_failures - before;
    test_failures = before;
    if (ok == passes && counted == !passes) return;
    wrong++;
    fprintf(stderr, "WRONG: %s: returned %d with %d failure(s) counted, want %s\n", what, ok, counted,
            passes ? "a pass" : "one failure");
}

static void fill(float *a, size_t n, double scale) {
    moe_rng rng = moe_rng_seeded(7);
    moe_rng_fill_uniform(&rng, a, n, scale);
}

int main(void) {
    static float want[N], got[N];
    int before;
    printf("each case that must fail prints its FAIL line on stderr, as a failing check would\n");

    /* "router logits" f32: nmse <= 1e-10, |g - w| <= 1e-5 + 1e-4 |w| */
    fill(want, N, 1.0);
    for (int i = 0; i < N; i++) got[i] = want[i] + (i % 2 ? 4e-6f : -4e-6f);
    before = test_failures;
    expect(1, test_tolerance_check("router logits", "f32", got, want, N, "within"), before, "within");

    memcpy(got, want, sizeof got);
    before = test_failures;
    expect(1, test_tolerance_check("router logits", "f32", got, want, N, "equal"), before, "equal");

    got[N / 2] = want[N / 2] + 1e-3f; /* one element far outside; the NMSE alone would still pass */
    before = test_failures;
    expect(0, test_tolerance_check("router logits", "f32", got, want, N, "one element outside"), before,
           "one element outside");

    /* every element within its bound but the NMSE, ~(9e-6)^2 / (1/3) ~ 2.4e-10, above 1e-10 */
    for (int i = 0; i < N; i++) got[i] = want[i] + 9e-6f;
    before = test_failures;
    expect(0, test_tolerance_check("router logits", "f32", got, want, N, "nmse above its maximum"), before,
           "nmse above its maximum");

    memcpy(got, want, sizeof got);
    got[3] = NAN;
    before = test_failures;
    expect(0, test_tolerance_check("router logits", "f32", got, want, N, "NaN in got"), before, "NaN in got");
    got[3] = want[3], want[5] = NAN;
    before = test_failures;
    expect(0, test_tolerance_check("router logits", "f32", got, want, N, "NaN in want"), before, "NaN in want");
    fill(want, N, 1.0);

    memcpy(got, want, sizeof got);
    before = test_failures;
    expect(0, test_tolerance_check("no such op", "f32", got, want, N, "unknown op"), before, "unknown op");
    before = test_failures;
    expect(0, test_tolerance_check("router logits", "bf16", got, want, N, "unknown dtype"), before, "unknown dtype");

    /* "expert_ffn y" bf16: |g - w| <= 5e-2 rms(want) + 2e-2 |w|. An offset of 3e-3 rms passes at both scales
     * (at 1000 it is ~1.7, far above any absolute bound of the table); one element 0.2 rms away fails on its
     * element bound alone (the NMSE, ~5e-5, stays below 1e-4). */
    for (int s = 0; s < 2; s++) {
        double scale = s ? 1000.0 : 1e-3, rms = 0;
        fill(want, N, scale);
        for (int i = 0; i < N; i++) rms += (double)want[i] * want[i];
        rms = sqrt(rms / N);
        for (int i = 0; i < N; i++) got[i] = want[i] + (float)(3e-3 * rms);
        before = test_failures;
        expect(1, test_tolerance_check("expert_ffn y", "bf16", got, want, N, "scale %g within", scale), before,
               "rms-scaled bound, within");
        got[0] = want[0] + (float)(0.2 * rms);
        before = test_failures;
        expect(0, test_tolerance_check("expert_ffn y", "bf16", got, want, N, "scale %g outside", scale), before,
               "rms-scaled bound, outside");
    }

    /* scalars: "layer aux loss" f32, |g - w| <= 1e-7 + 1e-5 |w| */
    before = test_failures;
    expect(1, test_tolerance_check_scalar("layer aux loss", "f32", 1.000005, 1.0, "within"), before, "scalar within");
    before = test_failures;
    expect(0, test_tolerance_check_scalar("layer aux loss", "f32", 1.00002, 1.0, "outside"), before, "scalar outside");
    before = test_failures;
    expect(1, test_tolerance_check_scalar("layer aux loss", "f32", 5e-8, 0.0, "near 0"), before, "scalar near 0");
    before = test_failures;
    expect(0, test_tolerance_check_scalar("layer aux loss", "f32", NAN, 1.0, "NaN"), before, "scalar NaN");
    before = test_failures;
    expect(0, test_tolerance_check_scalar("no such loss", "f32", 1.0, 1.0, "unknown"), before, "scalar unknown op");

    /* the table: one row per (op, dtype), a known dtype, bounds that are numbers >= 0 */
    size_t rows = 0;
    const test_tolerance *t = test_tolerance_table(&rows);
    CHECK(rows > 0, "the table is empty");
    for (size_t i = 0; i < rows; i++) {
        CHECK(!strcmp(t[i].dtype, "f32") || !strcmp(t[i].dtype, "bf16") || !strcmp(t[i].dtype, "cpu-bf16"),
              "%s: dtype %s", t[i].op, t[i].dtype);
        CHECK(t[i].max_nmse >= 0 && t[i].atol >= 0 && t[i].atol_rms >= 0 && t[i].rtol >= 0, "%s %s: a bound is "
              "negative or NaN", t[i].op, t[i].dtype);
        CHECK(t[i].atol == 0 || t[i].atol_rms == 0, "%s %s: both an absolute and an rms-scaled bound", t[i].op,
              t[i].dtype);
        for (size_t j = 0; j < i; j++)
            CHECK(strcmp(t[i].op, t[j].op) || strcmp(t[i].dtype, t[j].dtype), "%s %s: two rows", t[i].op,
                  t[i].dtype);
    }
    printf("%zu rows\n", rows);

    CHECK(wrong == 0, "%d verdict(s) not as expected", wrong);
    return test_finish("test_tolerance_check");
}
