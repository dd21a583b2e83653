/* test_util.c — RNG, fills, weight fixtures, a property checker's findings and the verdict of a test program. */
#include "tests/test_util.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int test_failures = 0;

moe_real *test_alloc_uniform(moe_rng *rng, size_t count, double scale) {
    moe_real *a = malloc((count ? count : 1) * sizeof *a);
    if (!a) {
        fprintf(stderr, "test: out of memory\n");
        exit(1);
    }
    moe_rng_fill_uniform(rng, a, count, scale);
    return a;
}

test_weights test_weights_zero(const moe_config *cfg, int ep) {
    test_weights tw;
    tw.buffer = calloc(moe_layer_num_params(cfg, ep), sizeof(moe_real));
    if (!tw.buffer) {
        fprintf(stderr, "test: out of memory\n");
        exit(1);
    }
    tw.w = moe_layer_weights_view(cfg, ep, tw.buffer);
    return tw;
}

test_weights test_weights_random(const moe_config *cfg, int ep, moe_rng *rng) {
    test_weights tw = test_weights_zero(cfg, ep);
    moe_layer_weights_init(cfg, ep, &tw.w, rng);
    return tw;
}

void test_weights_free(test_weights *tw) {
    free(tw->buffer);
    tw->buffer = NULL;
}

int test_problems = 0, test_expecting_problems = 0;

void test_problem(const char *fmt, ...) {
    test_problems++;
    FILE *out = test_expecting_problems ? stdout : stderr;
    fputs(test_expecting_problems ? "  caught, as it should be: " : "  problem: ", out);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(out, fmt, ap);
    va_end(ap);
    fputc('\n', out);
}

void test_expect_refusal(const char *what, moe_status st, const char *expect) {
    CHECK(st != MOE_OK, "%s: accepted", what);
    if (st == MOE_OK) return;
    CHECK(strstr(moe_failure_message(st), expect) != NULL, "%s: message '%s' lacks '%s'", what,
          moe_failure_message(st), expect);
    printf("%-40s refused: %s\n", what, moe_failure_message(st));
}

int test_finish(const char *name) {
    if (test_failures) {
        fprintf(stderr, "%s: %d check(s) failed\n", name, test_failures);
        return 1;
    }
    printf("%s: all checks passed\n", name);
    return 0;
}
