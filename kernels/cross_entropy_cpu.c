/* cross_entropy_cpu.c — softmax cross-entropy (cross_entropy.h), with the max subtracted before exp
 * (stable for any logit scale); sums in double. Rows are split over the threads; the loss sums rows in
 * MOE__SUM_CHUNKS fixed chunks, then the chunks in order (the same bits for any thread count).
 * Tested in tests/test_model_kernels.c: hand-computed values (also at logits ~1000), log V for uniform
 * logits, and the gradient against central finite differences (float64 build). */
#include "kernels/cross_entropy.h"

#include "core/real.h"
#include "core/threads.h"

static moe_real row_max(const moe_real *l, int n) {
    moe_real max = l[0];
    for (int i = 1; i < n; i++) max = l[i] > max ? l[i] : max;
    return max;
}

/* loss_t = max + log(sum_i exp(l_i - max)) - l_target */
double moe_cross_entropy_forward_cpu(const moe_real *logits, const int *targets, int num_tokens, int vocab) {
    double part[MOE__SUM_CHUNKS], total = 0;
#pragma omp parallel for schedule(static) if ((size_t)num_tokens * vocab >= MOE__PAR_MIN_ELEMS)
    for (int c = 0; c < MOE__SUM_CHUNKS; c++) {
        const int t0 = (int)((long long)num_tokens * c / MOE__SUM_CHUNKS);
        const int t1 = (int)((long long)num_tokens * (c + 1) / MOE__SUM_CHUNKS);
        part[c] = 0;
        for (int t = t0; t < t1; t++) {
            const moe_real *l = logits + (size_t)t * vocab;
            moe_real max = row_max(l, vocab);
            double sum = 0;
            for (int i = 0; i < vocab; i++) sum += moe__exp(l[i] - max);
            part[c] += (double)max + log(sum) - (double)l[targets[t]];
        }
    }
    for (int c = 0; c < MOE__SUM_CHUNKS; c++) total += part[c];
    return total;
}

/* dl_i = scale * (exp(l_i - max) / sum - [i == target]); the exps are stored in place, then scaled. */
void moe_cross_entropy_backward_cpu(moe_real *logits, const int *targets, int num_tokens, int vocab, moe_real scale) {
#pragma omp parallel for schedule(static) if ((size_t)num_tokens * vocab >= MOE__PAR_MIN_ELEMS)
    for (int t = 0; t < num_tokens; t++) {
        moe_real *l = logits + (size_t)t * vocab;
        moe_real max = row_max(l, vocab);
        double sum = 0;
        for (int i = 0; i < vocab; i++) l[i] = moe__exp(l[i] - max); /* apart from the in-order sum: vectorises */
        for (int i = 0; i < vocab; i++) sum += l[i];
        moe_real k = (moe_real)(scale / sum);
        for (int i = 0; i < vocab; i++) l[i] *= k;
        l[targets[t]] -= scale;
    }
}
