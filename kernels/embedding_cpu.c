/* embedding_cpu.c — token embedding gather and its scatter-add gradient (embedding.h).
 * Tested in tests/test_model_kernels.c: exact gather, and repeated tokens summed in token order. */
#include "kernels/embedding.h"

#include <limits.h>
#include <string.h>

#include "core/threads.h"

void moe_embedding_forward_range_cpu(const moe_real *table, const int *tokens, int num_tokens, int d, int first,
                                     int rows, moe_real *y) {
    MOE__PARALLEL_FOR((size_t)num_tokens * d >= MOE__PAR_MIN_ELEMS,
    for (int t = 0; t < num_tokens; t++) {
        const long row = (long)tokens[t] - first;
        if (row >= 0 && row < rows) {
            memcpy(y + (size_t)t * d, table + (size_t)row * d, (size_t)d * sizeof(moe_real));
        } else {
            for (int i = 0; i < d; i++) y[(size_t)t * d + i] = -0.0f;
        }
    });
}

void moe_embedding_forward_cpu(const moe_real *table, const int *tokens, int num_tokens, int d, moe_real *y) {
    moe_embedding_forward_range_cpu(table, tokens, num_tokens, d, 0, INT_MAX, y);
}

/* Serial, in token order: a repeated token's rows are added in a fixed order, so the result is bitwise
 * reproducible (a parallel scatter would need atomics and lose that). */
void moe_embedding_backward_range_cpu(const moe_real *dy, const int *tokens, int num_tokens, int d, int first, int rows,
                                      moe_real *dtable) {
    for (int t = 0; t < num_tokens; t++) {
        const long r = (long)tokens[t] - first;
        if (r < 0 || r >= rows) continue;
        const moe_real *g = dy + (size_t)t * d;
        moe_real *row = dtable + (size_t)r * d;
        for (int i = 0; i < d; i++) row[i] += g[i];
    }
}

void moe_embedding_backward_cpu(const moe_real *dy, const int *tokens, int num_tokens, int d, moe_real *dtable) {
    moe_embedding_backward_range_cpu(dy, tokens, num_tokens, d, 0, INT_MAX, dtable);
}
