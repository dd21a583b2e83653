/* cross_entropy_cpu.c — softmax cross-entropy (cross_entropy.h), with the max subtracted before exp
 * (stable for any logit scale); sums in double. Rows are split over the threads; the loss sums rows in
 * MOE__SUM_CHUNKS fixed chunks, then the chunks in order (the same bits for any thread count).
 * Tested in tests/test_model_kernels.c: hand-computed values (also at logits ~1000), log V for uniform
 * logits, and the gradient against central finite differences (float64 build). */
#include "kernels/cross_entropy.h"

#include "core/real.h"
#include "core/threads.h"
#include "kernels/row_reduce.h"

/* loss_t = max + log(sum_i exp(l_i - max)) - l_target */
double moe_cross_entropy_forward_cpu(const moe_real *logits, const int *targets, int num_tokens, int vocab) {
    double part[MOE__SUM_CHUNKS], total = 0;
    MOE__PARALLEL_FOR((size_t)num_tokens * vocab >= MOE__PAR_MIN_ELEMS,
    for (int c = 0; c < MOE__SUM_CHUNKS; c++) {
        const int t0 = (int)((long long)num_tokens * c / MOE__SUM_CHUNKS);
        const int t1 = (int)((long long)num_tokens * (c + 1) / MOE__SUM_CHUNKS);
        part[c] = 0;
        for (int t = t0; t < t1; t++) {
            const moe_real *l = logits + (size_t)t * vocab;
            const moe_real max = moe_row_max(l, vocab, l[0]);
            part[c] += (double)max + log(moe_row_sum_exp(l, vocab, max)) - (double)l[targets[t]];
        }
    });
    for (int c = 0; c < MOE__SUM_CHUNKS; c++) total += part[c];
    return total;
}

/* dl_i = scale * (exp(l_i - max) / sum - [i == target]); the exps are stored in place, then scaled. */
void moe_cross_entropy_backward_cpu(moe_real *logits, const int *targets, int num_tokens, int vocab, moe_real scale) {
    MOE__PARALLEL_FOR((size_t)num_tokens * vocab >= MOE__PAR_MIN_ELEMS,
    for (int t = 0; t < num_tokens; t++) {
        moe_real *l = logits + (size_t)t * vocab;
        const moe_real max = moe_row_max(l, vocab, l[0]);
        for (int i = 0; i < vocab; i++) l[i] = moe__exp(l[i] - max);
        const moe_real k = (moe_real)(scale / moe_row_dot(l, NULL, vocab)); /* forward's sum: the same lanes */
        for (int i = 0; i < vocab; i++) l[i] *= k;
        l[targets[t]] -= scale;
    });
}
