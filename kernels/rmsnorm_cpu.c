/* rmsnorm_cpu.c — RMSNorm forward and backward (formulas: rmsnorm.h). Row sums are accumulated in double.
 * Tested in tests/test_model_kernels.c: dx and dw against central finite differences (float64 build),
 * including that dx and dw accumulate.
 * Threads: rows are split for y and dx; dw (a sum over tokens) is split by columns, each column summed in
 * token order, so its bits are those of one thread. */
#include "kernels/rmsnorm.h"

#include <math.h>

#include "core/threads.h"
#include "kernels/row_reduce.h"

void moe_rmsnorm_forward_cpu(const moe_real *x, const moe_real *w, int num_tokens, int d, moe_real eps, moe_real *y,
                             moe_real *rstd) {
    MOE__PARALLEL_FOR((size_t)num_tokens * d >= MOE__PAR_MIN_ELEMS,
    for (int t = 0; t < num_tokens; t++) {
        const moe_real *xr = x + (size_t)t * d;
        moe_real *yr = y + (size_t)t * d;
        const moe_real r = (moe_real)(1 / sqrt(moe_row_dot(xr, xr, d) / d + eps));
        rstd[t] = r;
        for (int i = 0; i < d; i++) yr[i] = xr[i] * r * w[i];
    });
}

/* With r = rstd and dr/dx_j = -r^3 x_j / d:
 *   dL/dx_j = r * (dy_j w_j - x_j r^2 * (1/d) sum_i dy_i w_i x_i),   dL/dw_i = sum_t dy_i x_i r */
void moe_rmsnorm_backward_cpu(const moe_real *x, const moe_real *w, const moe_real *rstd, const moe_real *dy,
                              int num_tokens, int d, moe_real *dx, moe_real *dw) {
    const int par = (size_t)num_tokens * d >= MOE__PAR_MIN_ELEMS, cols = 16; /* a 64-byte line of floats */
    MOE__PARALLEL_FOR(par,
    for (int t = 0; t < num_tokens; t++) {
        const moe_real *xr = x + (size_t)t * d, *dyr = dy + (size_t)t * d;
        moe_real *dxr = dx + (size_t)t * d, r = rstd[t];
        const moe_real c = (moe_real)(moe_row_dot3(dyr, w, xr, d) / d) * r * r;
        for (int i = 0; i < d; i++) dxr[i] += r * (dyr[i] * w[i] - xr[i] * c);
    });
    MOE__PARALLEL_FOR(par,
    for (int i0 = 0; i0 < d; i0 += cols) {
        const int i1 = i0 + cols < d ? i0 + cols : d;
        for (int t = 0; t < num_tokens; t++) {
            const moe_real *xr = x + (size_t)t * d, *dyr = dy + (size_t)t * d, r = rstd[t];
            for (int i = i0; i < i1; i++) dw[i] += dyr[i] * xr[i] * r;
        }
    });
}
