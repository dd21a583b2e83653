/* vocab_cross_entropy_cpu.c — the vocabulary-parallel cross-entropy's per-row parts on the CPU
 * (vocab_cross_entropy.h), with kernels/cross_entropy_cpu.c's formulas. */
#include "kernels/vocab_cross_entropy.h"

#include "core/real.h"
#include "core/threads.h"
#include "kernels/row_reduce.h"

void moe_vocab_row_max_cpu(const moe_real *logits, int num_tokens, int width, moe_real *max) {
    MOE__PARALLEL_FOR((size_t)num_tokens * width >= MOE__PAR_MIN_ELEMS,
    for (int t = 0; t < num_tokens; t++) {
        const moe_real *l = logits + (size_t)t * width;
        max[t] = moe_row_max(l, width, l[0]);
    });
}

void moe_vocab_piece_sums_cpu(const moe_real *logits, const moe_real *max, const int *targets, int num_tokens,
                              int width, int piece, int first, double *sums, double *target) {
    const int T = num_tokens, pieces = width / piece;
    MOE__PARALLEL_FOR((size_t)T * width >= MOE__PAR_MIN_ELEMS,
    for (int t = 0; t < T; t++) {
        const moe_real *row = logits + (size_t)t * width;
        for (int j = 0; j < pieces; j++) {
            sums[(size_t)j * T + t] = moe_row_sum_exp(row + (size_t)j * piece, piece, max[t]);
        }
        const int c = targets[t] - first;
        target[t] = c >= 0 && c < width ? (double)row[c] : 0.0;
    });
}

void moe_vocab_backward_cpu(moe_real *logits, const moe_real *max, const double *z, const int *targets, int num_tokens,
                            int width, int first, moe_real scale) {
    MOE__PARALLEL_FOR((size_t)num_tokens * width >= MOE__PAR_MIN_ELEMS,
    for (int t = 0; t < num_tokens; t++) {
        moe_real *l = logits + (size_t)t * width;
        const moe_real m = max[t], k = (moe_real)(scale / z[t]);
        for (int i = 0; i < width; i++) l[i] = moe__exp(l[i] - m);
        for (int i = 0; i < width; i++) l[i] *= k;
        const int c = targets[t] - first;
        if (c >= 0 && c < width) l[c] -= scale;
    });
}
