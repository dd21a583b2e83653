/* row_reduce.h — internal: the CPU kernels' reductions along one row (a max, sums in double), in
 * MOE_ROW_LANES interleaved partial results: element c goes into lane c % MOE_ROW_LANES, and the lanes are
 * combined in lane order at the end. That is a fixed order — the same for every row whatever its length, its
 * place in a buffer or the thread count, so results stay bitwise repeatable and layout-invariant
 * (docs/DETERMINISM.md) — and one the compiler vectorises, where a single running sum or max is a chain of
 * dependent operations (four cycles each: the attention's and the loss's rows spent most of their time there).
 * A max is exact in any order (NaN elements are passed over, as `p > m ? p : m` does one at a time). */
#ifndef MOE_KERNELS_ROW_REDUCE_H
#define MOE_KERNELS_ROW_REDUCE_H

#include "core/real.h"

enum { MOE_ROW_LANES = 16 };

/* max(start, p[0..n)) */
static inline moe_real moe_row_max(const moe_real *p, int n, moe_real start) {
    moe_real lane[MOE_ROW_LANES];
    for (int i = 0; i < MOE_ROW_LANES; i++) lane[i] = start;
    int c = 0;
    for (; c + MOE_ROW_LANES <= n; c += MOE_ROW_LANES)
        for (int i = 0; i < MOE_ROW_LANES; i++) lane[i] = p[c + i] > lane[i] ? p[c + i] : lane[i];
    for (int i = 0; c < n; c++, i++) lane[i] = p[c] > lane[i] ? p[c] : lane[i];
    moe_real m = lane[0];
    for (int i = 1; i < MOE_ROW_LANES; i++) m = lane[i] > m ? lane[i] : m;
    return m;
}

/* the lanes' sum, in lane order */
static inline double moe__row_lanes_total(const double lane[MOE_ROW_LANES]) {
    double sum = 0;
    for (int i = 0; i < MOE_ROW_LANES; i++) sum += lane[i];
    return sum;
}

/* sum over c of a[c] b[c] in double (a[c] alone when b is NULL) */
static inline double moe_row_dot(const moe_real *a, const moe_real *b, int n) {
    double lane[MOE_ROW_LANES] = {0};
    int c = 0;
    if (b) {
        for (; c + MOE_ROW_LANES <= n; c += MOE_ROW_LANES)
            for (int i = 0; i < MOE_ROW_LANES; i++) lane[i] += (double)a[c + i] * b[c + i];
        for (int i = 0; c < n; c++, i++) lane[i] += (double)a[c] * b[c];
    } else {
        for (; c + MOE_ROW_LANES <= n; c += MOE_ROW_LANES)
            for (int i = 0; i < MOE_ROW_LANES; i++) lane[i] += a[c + i];
        for (int i = 0; c < n; c++, i++) lane[i] += a[c];
    }
    return moe__row_lanes_total(lane);
}

/* sum over c of (a[c] b[c]) w[c] in double */
static inline double moe_row_dot3(const moe_real *a, const moe_real *b, const moe_real *w, int n) {
    double lane[MOE_ROW_LANES] = {0};
    int c = 0;
    for (; c + MOE_ROW_LANES <= n; c += MOE_ROW_LANES)
        for (int i = 0; i < MOE_ROW_LANES; i++) lane[i] += (double)a[c + i] * b[c + i] * w[c + i];
    for (int i = 0; c < n; c++, i++) lane[i] += (double)a[c] * b[c] * w[c];
    return moe__row_lanes_total(lane);
}

/* sum over c of e^(l[c] - max) in double (moe__exp in moe_real) */
static inline double moe_row_sum_exp(const moe_real *l, int n, moe_real max) {
    double lane[MOE_ROW_LANES] = {0};
    int c = 0;
    for (; c + MOE_ROW_LANES <= n; c += MOE_ROW_LANES)
        for (int i = 0; i < MOE_ROW_LANES; i++) lane[i] += moe__exp(l[c + i] - max);
    for (int i = 0; c < n; c++, i++) lane[i] += moe__exp(l[c] - max);
    return moe__row_lanes_total(lane);
}

#endif
