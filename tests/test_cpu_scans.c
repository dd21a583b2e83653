/* test_cpu_scans.c — the CPU's two whole-buffer scans of every step against their plain definitions, bitwise, at
 * sizes around their chunk, lane and block boundaries and with 1 and 2 threads:
 *   sum_squares (moe/dense_ops_cpu.c, the gradient norm's): value k of a range into lane k % MOE__SUM_LANES in index
 *     order, the lanes then added in the pairwise tree (core/threads.h); the table vectorizes across lanes and splits
 *     the ranges over threads: each range of a list gives its own range's bits, with 1 and 2 threads;
 *   moe_find_nonfinite_cpu (the non-finite checks'): the index of the first NaN or Inf; it tests blocks of values
 *     without an early exit, so a NaN or Inf is planted at the first and last value, at chunk and block boundaries
 *     and at random places, alone and behind a later one.
 * And the kernels' row reductions (kernels/row_reduce.h: attention, cross-entropy, RMSNorm) against their definition,
 * bitwise, at every length 0-80: the max against the one-at-a-time max (NaNs passed over, a start value kept); the
 * sums against element c added into lane c % 16 in index order, the lanes then added in order; a row padded with
 * zeros to whole lanes sums to the same bits (the fused attention relies on it).
 * Run: meson test -C build test_cpu_scans (suite unit). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/threads.h"
#include "kernels/nonfinite.h"
#include "kernels/row_reduce.h"
#include "moe/dense_ops.h"
#include "tests/test_util.h"

/* core/threads.h's definition written out: value k into lane k % LANES, then lane j += lane j + h, h = LANES / 2 .. 1 */
static double plain_sum_squares(const moe_real *a, size_t n) {
    double lane[MOE__SUM_LANES] = {0};
    for (size_t k = 0; k < n; k++) lane[k % MOE__SUM_LANES] += (double)a[k] * a[k];
    for (int h = MOE__SUM_LANES / 2; h > 0; h /= 2)
        for (int j = 0; j < h; j++) lane[j] += lane[j + h];
    return lane[0];
}

static long long plain_first_nonfinite(const moe_real *a, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(a[i])) return (long long)i;
    return -1;
}

static void check_nonfinite(const moe_real *a, size_t n, const char *what, size_t at) {
    const long long got = moe_find_nonfinite_cpu(a, n), want = plain_first_nonfinite(a, n);
    CHECK(got == want, "n=%zu, %s at %zu: first non-finite %lld, want %lld", n, what, at, got, want);
}

/* a NaN or an Inf at `at` (and, when behind >= 0, another at `behind`), checked, then the values restored */
static void plant(moe_real *a, size_t n, size_t at, long long behind, int kind) {
    const moe_real saved = a[at], saved_behind = behind >= 0 ? a[behind] : 0;
    const moe_real bad = kind == 0 ? (moe_real)NAN : kind == 1 ? (moe_real)INFINITY : -(moe_real)INFINITY;
    if (behind >= 0) a[behind] = bad;
    a[at] = bad;
    check_nonfinite(a, n, kind == 0 ? "a NaN" : "an Inf", at);
    a[at] = saved;
    if (behind >= 0) a[behind] = saved_behind;
}

static void test_size(size_t n, moe_rng *rng) {
    moe_real *a = test_alloc_uniform(rng, n ? n : 1, 3.0);
    for (size_t i = 0; i < n; i += 7) a[i] *= 1e-3f; /* magnitudes apart, so that the order of the sums shows */
    double got;
    const size_t whole[2] = {0, n};
    CHECK_OK(moe_dense_ops_cpu.sum_squares(NULL, a, whole, 1, &got));
    const double want = plain_sum_squares(a, n);
    CHECK(!memcmp(&got, &want, sizeof got), "n=%zu: sum of squares %.17g, the plain lanes give %.17g", n, got, want);
    /* the same values as a list of ranges (an empty one among them): each range's own bits */
    const size_t cuts[] = {0, n / 3, n / 3, n / 2, n};
    double parts[4];
    CHECK_OK(moe_dense_ops_cpu.sum_squares(NULL, a, cuts, 4, parts));
    for (int r = 0; r < 4; r++) {
        const double one = plain_sum_squares(a + cuts[r], cuts[r + 1] - cuts[r]);
        CHECK(!memcmp(&parts[r], &one, sizeof one), "n=%zu: range %d of 4: %.17g, want %.17g", n, r, parts[r], one);
    }
    check_nonfinite(a, n, "none", 0);
    if (n) {
        const size_t chunk = n / MOE__SUM_CHUNKS;
        const size_t places[] = {0, n - 1, chunk, chunk ? chunk - 1 : 0, n / 2, 511 % n, 512 % n, 513 % n,
                                 (chunk + 512) % n, (size_t)moe_rng_next(rng) % n};
        for (size_t p = 0; p < sizeof places / sizeof *places; p++) {
            const size_t at = places[p];
            plant(a, n, at, -1, (int)(p % 3));
            if (at + 1 < n) plant(a, n, at, (long long)(at + 1 + (size_t)moe_rng_next(rng) % (n - at - 1)), 0);
        }
    }
    free(a);
}

/* row_reduce.h's lane order written out: term(c) into lane c % MOE_ROW_LANES, then the lanes in order */
static double lane_sum(const moe_real *a, const moe_real *b, const moe_real *w, int n, int exp_of, moe_real max) {
    double lane[MOE_ROW_LANES] = {0}, total = 0;
    for (int c = 0; c < n; c++) {
        double term = exp_of ? (double)moe__exp(a[c] - max) : (double)a[c];
        if (b) term *= b[c];
        if (w) term *= w[c];
        lane[c % MOE_ROW_LANES] += term;
    }
    for (int i = 0; i < MOE_ROW_LANES; i++) total += lane[i];
    return total;
}

static void same_bits(double got, double want, const char *what, int n) {
    CHECK(!memcmp(&got, &want, sizeof got), "%s, n=%d: %.17g, the definition gives %.17g", what, n, got, want);
}

static void test_row_reductions(moe_rng *rng) {
    enum { N = 80 };
    moe_real a[N + 2 * MOE_ROW_LANES], b[N], w[N];
    moe_rng_fill_uniform(rng, a, N, 4), moe_rng_fill_uniform(rng, b, N, 1), moe_rng_fill_uniform(rng, w, N, 1);
    for (int c = 0; c < N; c += 5) a[c] *= 1e-4f; /* magnitudes apart, so that the order shows */
    for (int n = 0; n <= N; n++) {
        moe_real max = -INFINITY;
        for (int c = 0; c < n; c++) max = a[c] > max ? a[c] : max;
        CHECK(moe_row_max(a, n, -INFINITY) == max, "row max, n=%d", n);
        CHECK(moe_row_max(a, n, 100) == 100, "row max from a larger start, n=%d", n);
        same_bits(moe_row_dot(a, NULL, n), lane_sum(a, NULL, NULL, n, 0, 0), "row sum", n);
        same_bits(moe_row_dot(a, b, n), lane_sum(a, b, NULL, n, 0, 0), "row dot", n);
        same_bits(moe_row_dot3(a, b, w, n), lane_sum(a, b, w, n, 0, 0), "row dot3", n);
        same_bits(moe_row_sum_exp(a, n, 1), lane_sum(a, NULL, NULL, n, 1, 1), "row sum of exp", n);
        /* zeros past n up to whole lanes: the same sum */
        moe_real padded[N + MOE_ROW_LANES];
        const int wide = (n + MOE_ROW_LANES - 1) / MOE_ROW_LANES * MOE_ROW_LANES;
        for (int c = 0; c < wide; c++) padded[c] = c < n ? fabs(a[c]) : 0;
        same_bits(moe_row_dot(padded, NULL, wide), moe_row_dot(padded, NULL, n), "zero-padded row sum", n);
    }
    moe_real with_nan[3] = {1, NAN, 2};
    CHECK(moe_row_max(with_nan, 3, -INFINITY) == 2, "row max over a NaN: %g, want 2 (NaN passed over)",
          (double)moe_row_max(with_nan, 3, -INFINITY));
}

int main(void) {
    moe_rng rng = moe_rng_seeded(29);
    test_row_reductions(&rng);
    const size_t sizes[] = {0, 1, 7, 63, 64, 65, 127, 511, 512, 513, 4095, 32767, 32768, 100003, 1 << 20};
    for (int threads = 1; threads <= 2; threads++) {
        moe_threads_set(threads);
        for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) test_size(sizes[i], &rng);
    }
    return test_finish("test_cpu_scans");
}
