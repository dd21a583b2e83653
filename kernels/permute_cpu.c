/* permute_cpu.c — gather into expert order, and the fixed-order weighted combine back to token order. Rows
 * (tokens) are split over the threads: each writes its own output rows (an assignment has its own slot). */
#include "kernels/permute.h"

#include <string.h>

#include "core/threads.h"

void moe_permute_rows_cpu(const moe_real *x, const int *perm_token, int num_rows, int d, moe_real *xp) {
    MOE__PARALLEL_FOR((size_t)num_rows * d >= MOE__PAR_MIN_ELEMS,
    for (int r = 0; r < num_rows; r++)
        memcpy(xp + (size_t)r * d, x + (size_t)perm_token[r] * d, (size_t)d * sizeof(moe_real)));
}

void moe_combine_rows_cpu(const moe_real *y, const int *slot, const moe_real *gate, int num_tokens, int top_k,
                          int d, moe_real *out) {
    MOE__PARALLEL_FOR((size_t)num_tokens * d >= MOE__PAR_MIN_ELEMS,
    for (int t = 0; t < num_tokens; t++) {
        moe_real *o = out + (size_t)t * d;
        memset(o, 0, (size_t)d * sizeof(moe_real));
        for (int j = 0; j < top_k; j++) {
            int a = t * top_k + j;
            if (slot[a] < 0) continue;
            const moe_real *yr = y + (size_t)slot[a] * d;
            moe_real g = gate ? gate[a] : 1;
            for (int i = 0; i < d; i++) o[i] += g * yr[i];
        }
    });
}

void moe_combine_rows_backward_cpu(const moe_real *dout, const moe_real *y, const int *slot, const moe_real *gate,
                                   int num_tokens, int top_k, int d, moe_real *dy, moe_real *dgate) {
    MOE__PARALLEL_FOR((size_t)num_tokens * d >= MOE__PAR_MIN_ELEMS,
    for (int t = 0; t < num_tokens; t++) {
        const moe_real *dot_row = dout + (size_t)t * d;
        for (int j = 0; j < top_k; j++) {
            int a = t * top_k + j;
            dgate[a] = 0;
            if (slot[a] < 0) continue;
            const moe_real *yr = y + (size_t)slot[a] * d;
            moe_real *dyr = dy + (size_t)slot[a] * d, dot = 0;
            for (int i = 0; i < d; i++) {
                dot += dot_row[i] * yr[i];
                dyr[i] = gate[a] * dot_row[i];
            }
            dgate[a] = dot;
        }
    });
}
