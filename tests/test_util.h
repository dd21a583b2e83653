/* test_util.h — what every test program shares: a seeded RNG, random fills, and failure counting.
 * A test's exit code is its verdict: test_finish() returns 1 if any CHECK failed. */
#ifndef MOE_TESTS_TEST_UTIL_H
#define MOE_TESTS_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/fail.h"
#include "core/rng.h"
#include "moe/moe.h"

/* meson's code for a skipped test */
#define TEST_SKIP 77

extern int test_failures;

#define CHECK(cond, ...)                                                     \
    do {                                                                     \
        if (!(cond)) {                                                       \
            test_failures++;                                                 \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                    \
            fputc('\n', stderr);                                             \
        }                                                                    \
    } while (0)

/* On failure prints the library's recorded sentence (core/fail.h: the file, line and call of a failed CUDA,
 * cuBLAS or MPI call), not only the status's name. */
#define CHECK_OK(call)                                                                      \
    do {                                                                                    \
        moe_status check_ok_status_ = (call);                                               \
        CHECK(check_ok_status_ == MOE_OK, "%s", moe_failure_message(check_ok_status_));   \
    } while (0)

/* Every random input derives from a fixed seed (core/rng.h), so a failure reproduces. */
moe_real *test_alloc_uniform(moe_rng *rng, size_t count, double scale); /* aborts on OOM */

/* A layer's weights in one buffer (a rank's of an expert-parallel group of ep: moe_layer_weights_view), filled with
 * uniform values of a scale that keeps activations O(1). */
typedef struct {
    moe_real *buffer;
    moe_layer_weights w;
} test_weights;

test_weights test_weights_random(const moe_config *cfg, int ep, moe_rng *rng);
test_weights test_weights_zero(const moe_config *cfg, int ep);
void test_weights_free(test_weights *tw);

/* A property checker's findings (the schedule and grid tests): each counted in test_problems and printed
 * ("  problem: ..." on stderr), or, while test_expecting_problems is set (a layout broken on purpose),
 * as "  caught, as it should be: ..." on stdout. The checker resets test_problems and returns it. */
extern int test_problems, test_expecting_problems;
void test_problem(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* st must be a failure whose message holds expect (a CHECK each); the refusal printed after what. */
void test_expect_refusal(const char *what, moe_status st, const char *expect);

int test_finish(const char *name);

#endif
