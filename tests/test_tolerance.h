/* test_tolerance.h — the one tolerance table of the tests (tests/test_tolerance.c) and the comparison that reads it.
 *
 * ggml's per-op max_nmse_err is the model: the CPU path is the oracle, and every op compared against it within
 * a tolerance has one row, keyed by op name and dtype ("f32": fp32 on both sides; "bf16": the GPU's bf16 path
 * against fp32 on bf16-rounded inputs; "cpu-bf16": the CPU's bf16 precision against its fp32). Comparisons that must be exact (data that only moves, counts, repeat
 * runs) do not go through the table; they compare bits.
 *
 * A comparison of got with want (count elements) passes when both hold:
 *   normalised MSE   sum (g - w)^2 / sum w^2  <=  max_nmse          (sum (g - w)^2 when every w is 0)
 *   every element    |g - w|  <=  atol + atol_rms * rms(want) + rtol * |w|,  rms(want) = sqrt(sum w^2 / count)
 * A NaN in got or want fails. Each row sets atol (absolute) or atol_rms (scaled by rms(want)) and leaves the
 * other 0, so one formula reads every row. */
#ifndef MOE_TESTS_TEST_TOLERANCE_H
#define MOE_TESTS_TEST_TOLERANCE_H

#include <stddef.h>

typedef struct {
    const char *op;
    const char *dtype; /* "f32", "bf16" (the GPU paths) or "cpu-bf16" (the CPU's bf16 precision vs its fp32) */
    double max_nmse;   /* INFINITY: no bound (a scalar, where the element bound is the whole check) */
    double atol;       /* absolute */
    double atol_rms;   /* times rms(want) */
    double rtol;       /* times |want| */
} test_tolerance;

/* Compares got with want under the row of (op, dtype), prints one line with the worst element, and counts a
 * CHECK failure (tests/test_util.h) when outside it or when (op, dtype) has no row. Returns 1 if within. The
 * label (printf format) says which tensor and case. */
int test_tolerance_check(const char *op, const char *dtype, const float *got, const float *want, size_t count,
                         const char *label_format, ...) __attribute__((format(printf, 6, 7)));

/* The same for one double-precision scalar (a loss), without rounding it to float. */
int test_tolerance_check_scalar(const char *op, const char *dtype, double got, double want, const char *label_format,
                                ...) __attribute__((format(printf, 5, 6)));

/* The table itself, for the test of its keys (tests/test_tolerance_check.c). */
const test_tolerance *test_tolerance_table(size_t *count);

#endif
