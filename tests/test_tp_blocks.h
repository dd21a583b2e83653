/* test_tp_blocks.h — what the tensor-parallel tests share (host memory): a rank's block of columns of a whole
 * operand, and counting the values whose bits differ. */
#ifndef MOE_TESTS_TEST_TP_BLOCKS_H
#define MOE_TESTS_TEST_TP_BLOCKS_H

#include <stdlib.h>
#include <string.h>

#include "tests/test_util.h"

/* [rows, cols / parts]: columns [part cols / parts, (part + 1) cols / parts) of a row-major [rows, cols] (malloc'ed) */
static inline moe_real *test_tp_column_block(const moe_real *m, int rows, int cols, int part, int parts) {
    const int w = cols / parts;
    moe_real *b = malloc((size_t)rows * w * sizeof *b);
    if (!b) abort();
    for (int r = 0; r < rows; r++) memcpy(b + (size_t)r * w, m + (size_t)r * cols + (size_t)part * w, w * sizeof *b);
    return b;
}

static inline size_t test_tp_count_diff(const moe_real *a, const moe_real *b, size_t n) {
    size_t d = 0;
    for (size_t i = 0; i < n; i++) d += memcmp(&a[i], &b[i], sizeof *a) != 0;
    return d;
}

#endif
