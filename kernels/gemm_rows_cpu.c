/* gemm_rows_cpu.c — row-wise GEMM in fixed-shape blocks (why: gemm_rows.h). A, C row-major, dense
 * (lda = k, ldc = n); B is [n, k] for CblasTrans and [k, n] for CblasNoTrans. */
#include "kernels/gemm_rows.h"

#include <stdlib.h>
#include <string.h>

#include "core/real.h"

moe_status moe_gemm_rows_plan_init(moe_gemm_rows_plan *plan, int layout_invariant, int max_width) {
    plan->row_block = layout_invariant ? MOE_GEMM_ROW_BLOCK : 0;
    plan->scratch = malloc((size_t)MOE_GEMM_ROW_BLOCK * 2 * (size_t)max_width * sizeof(moe_real));
    return plan->scratch ? MOE_OK : MOE_ERR_OUT_OF_MEMORY;
}

void moe_gemm_rows_plan_free(moe_gemm_rows_plan *plan) {
    free(plan->scratch);
    plan->scratch = NULL;
}

void moe_gemm_rows_cpu(const moe_gemm_rows_plan *plan, CBLAS_TRANSPOSE trans_b, int rows, int n, int k,
                       const moe_real *A, const moe_real *B, moe_real beta, moe_real *C) {
    const int ldb = trans_b == CblasTrans ? k : n, block = plan->row_block;
    if (rows == 0) return;
    if (block == 0) {
        moe__gemm(CblasRowMajor, CblasNoTrans, trans_b, rows, n, k, 1, A, k, B, ldb, beta, C, n);
        return;
    }
    const int full = rows / block * block, tail = rows - full;
    for (int r = 0; r < full; r += block)
        moe__gemm(CblasRowMajor, CblasNoTrans, trans_b, block, n, k, 1, A + (size_t)r * k, k, B, ldb, beta,
                  C + (size_t)r * n, n);
    if (tail == 0) return;
    /* The last partial block goes through scratch: [block, k] input and [block, n] output. */
    moe_real *a = plan->scratch, *c = plan->scratch + (size_t)block * k;
    memcpy(a, A + (size_t)full * k, (size_t)tail * k * sizeof(moe_real));
    memset(a + (size_t)tail * k, 0, (size_t)(block - tail) * k * sizeof(moe_real));
    if (beta != 0) { /* beta = 0: OpenBLAS overwrites C without reading it */
        memcpy(c, C + (size_t)full * n, (size_t)tail * n * sizeof(moe_real));
        memset(c + (size_t)tail * n, 0, (size_t)(block - tail) * n * sizeof(moe_real));
    }
    moe__gemm(CblasRowMajor, CblasNoTrans, trans_b, block, n, k, 1, a, k, B, ldb, beta, c, n);
    memcpy(C + (size_t)full * n, c, (size_t)tail * n * sizeof(moe_real));
}
