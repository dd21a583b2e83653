/* embedding_cpu.c — token embedding gather and its scatter-add gradient (embedding.h).
 * Tested in tests/test_model_kernels.c: exact gather, and repeated tokens summed in token order. */
#include "kernels/embedding.h"

#include <string.h>

#include "core/threads.h"

void moe_embedding_forward_cpu(const moe_real *table, const int *tokens, int num_tokens, int d, moe_real *y) {
#pragma omp parallel for schedule(static) if ((size_t)num_tokens * d >= MOE__PAR_MIN_ELEMS)
    for (int t = 0; t < num_tokens; t++)
        memcpy(y + (size_t)t * d, table + (size_t)tokens[t] * d, (size_t)d * sizeof(moe_real));
}

/* Serial, in token order: a repeated token's rows are added in a fixed order, so the result is bitwise
 * reproducible (a parallel scatter would need atomics and lose that). */
void moe_embedding_backward_cpu(const moe_real *dy, const int *tokens, int num_tokens, int d, moe_real *dtable) {
    for (int t = 0; t < num_tokens; t++) {
        const moe_real *g = dy + (size_t)t * d;
        moe_real *row = dtable + (size_t)tokens[t] * d;
        for (int i = 0; i < d; i++) row[i] += g[i];
    }
}
