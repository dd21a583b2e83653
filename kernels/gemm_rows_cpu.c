/* gemm_rows_cpu.c — row-wise GEMM in fixed-shape blocks (why: gemm_rows.h). A, C row-major, dense
 * (lda = k, ldc = n); B is [n, k] for CblasTrans and [k, n] for CblasNoTrans. */
#include "kernels/gemm_rows.h"

#include <stdlib.h>
#include <string.h>

#include "core/real.h"
#include "kernels/cast.h"

moe_status moe_gemm_rows_plan_init(moe_gemm_rows_plan *plan, int layout_invariant, int bf16_inputs, int max_width) {
    plan->row_block = layout_invariant ? MOE_GEMM_ROW_BLOCK : 0;
    plan->bf16_inputs = bf16_inputs;
    plan->scratch = malloc((size_t)MOE_GEMM_ROUND_ROWS * 2 * (size_t)max_width * sizeof(moe_real));
    return plan->scratch ? MOE_OK : MOE_ERR_OUT_OF_MEMORY;
}

void moe_gemm_rows_plan_free(moe_gemm_rows_plan *plan) {
    free(plan->scratch);
    plan->scratch = NULL;
}

void moe_round_bf16_cpu(const moe_real *src, size_t n, moe_real *dst) {
    for (size_t i = 0; i < n; i++) dst[i] = (moe_real)moe_bf16_round((float)src[i]);
}

/* rows of A as a call reads them: A itself, or rounded to bf16 into dst */
static const moe_real *operand(const moe_gemm_rows_plan *plan, const moe_real *A, size_t count, moe_real *dst) {
    if (!plan->bf16_inputs) return A;
    moe_round_bf16_cpu(A, count, dst);
    return dst;
}

void moe_gemm_rows_cpu(const moe_gemm_rows_plan *plan, CBLAS_TRANSPOSE trans_b, int rows, int n, int k,
                       const moe_real *A, const moe_real *B, moe_real beta, moe_real *C) {
    const int ldb = trans_b == CblasTrans ? k : n, block = plan->row_block;
    if (rows == 0) return;
    if (block == 0 && !plan->bf16_inputs) {
        moe__gemm(CblasRowMajor, CblasNoTrans, trans_b, rows, n, k, 1, A, k, B, ldb, beta, C, n);
        return;
    }
    /* blocks of `block` rows (layout-invariant), or chunks that fit the rounding scratch */
    const int step = block ? block : MOE_GEMM_ROUND_ROWS, full = block ? rows / block * block : rows;
    for (int r = 0; r < full; r += step) {
        const int m = full - r < step ? full - r : step;
        const moe_real *a = operand(plan, A + (size_t)r * k, (size_t)m * k, plan->scratch);
        moe__gemm(CblasRowMajor, CblasNoTrans, trans_b, m, n, k, 1, a, k, B, ldb, beta, C + (size_t)r * n, n);
    }
    const int tail = rows - full;
    if (tail == 0) return;
    /* The last partial block goes through scratch: [block, k] input and [block, n] output. */
    moe_real *a = plan->scratch, *c = plan->scratch + (size_t)block * k;
    if (plan->bf16_inputs) moe_round_bf16_cpu(A + (size_t)full * k, (size_t)tail * k, a);
    else memcpy(a, A + (size_t)full * k, (size_t)tail * k * sizeof(moe_real));
    memset(a + (size_t)tail * k, 0, (size_t)(block - tail) * k * sizeof(moe_real));
    if (beta != 0) { /* beta = 0: OpenBLAS overwrites C without reading it */
        memcpy(c, C + (size_t)full * n, (size_t)tail * n * sizeof(moe_real));
        memset(c + (size_t)tail * n, 0, (size_t)(block - tail) * n * sizeof(moe_real));
    }
    moe__gemm(CblasRowMajor, CblasNoTrans, trans_b, block, n, k, 1, a, k, B, ldb, beta, c, n);
    memcpy(C + (size_t)full * n, c, (size_t)tail * n * sizeof(moe_real));
}

void moe_gemm_rows_at_b_cpu(const moe_gemm_rows_plan *plan, int rows, int m, int n, const moe_real *A,
                            const moe_real *B, moe_real beta, moe_real *C) {
    if (!plan->bf16_inputs) {
        moe__gemm(CblasRowMajor, CblasTrans, CblasNoTrans, m, n, rows, 1, A, m, B, n, beta, C, n);
        return;
    }
    moe_real *a = plan->scratch, *b = plan->scratch + (size_t)MOE_GEMM_ROUND_ROWS * m;
    for (int r = 0; r < rows; r += MOE_GEMM_ROUND_ROWS) {
        const int chunk = rows - r < MOE_GEMM_ROUND_ROWS ? rows - r : MOE_GEMM_ROUND_ROWS;
        moe_round_bf16_cpu(A + (size_t)r * m, (size_t)chunk * m, a);
        moe_round_bf16_cpu(B + (size_t)r * n, (size_t)chunk * n, b);
        moe__gemm(CblasRowMajor, CblasTrans, CblasNoTrans, m, n, chunk, 1, a, m, b, n, r ? 1 : beta, C, n);
    }
    if (rows == 0 && beta != 1)
        for (size_t i = 0; i < (size_t)m * n; i++) C[i] *= beta;
}
