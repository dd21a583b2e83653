/* gemm_rows.h — row-wise GEMMs whose every output row is independent of the other rows in the call.
 *
 *   C[rows, n] = A[rows, k] op(B) + beta * C,   op(B) = B^T (B is [n, k]) or B (B is [k, n])
 *
 * OpenBLAS picks different kernels by problem size (a "small matrix" path, a gemv path for one row), and
 * these round differently, so the same row can get different bits depending on how many rows share its
 * call (measured with 0.3.21: see docs/DETERMINISM.md). Expert parallelism changes how many rows each
 * call sees. With row_block > 0 every call has exactly row_block rows, the last block zero-padded
 * through scratch: all calls have one shape, and a row's result depends only on its own values, which
 * makes outputs bitwise identical across expert-parallel layouts. row_block = 0 makes one call (faster;
 * the bits may then depend on the layout). */
#ifndef MOE_KERNELS_GEMM_ROWS_H
#define MOE_KERNELS_GEMM_ROWS_H

#include <cblas.h>

#include "core/types.h"

/* The block size of the layout-invariant mode: 64 rows fill OpenBLAS's AVX-512 tiles and keep the
 * padding small; larger blocks saved little (docs/BENCHMARKS.md). */
enum { MOE_GEMM_ROW_BLOCK = 64 };

typedef struct {
    int row_block;     /* MOE_GEMM_ROW_BLOCK or 0 */
    moe_real *scratch; /* row_block * (max k + max n) reals */
} moe_gemm_rows_plan;

/* row_block = MOE_GEMM_ROW_BLOCK when layout_invariant, else 0; scratch for k and n up to max_width. */
moe_status moe_gemm_rows_plan_init(moe_gemm_rows_plan *plan, int layout_invariant, int max_width);
void moe_gemm_rows_plan_free(moe_gemm_rows_plan *plan);

void moe_gemm_rows_cpu(const moe_gemm_rows_plan *plan, CBLAS_TRANSPOSE trans_b, int rows, int n, int k,
                       const moe_real *A, const moe_real *B, moe_real beta, moe_real *C);

#endif
