/* linear_gemms.h — internal: the cuBLAS products of the dense linear layer (kernels/linear.cu; the router's too,
 * router/scores.cu, and in bf16 each CUDA expert's row projections in row-block mode, experts/expert_ffn.cu) as data,
 * so that the list the GPU runs can also run on the CPU: tests/test_linear_gemms.c executes it with column-major
 * cblas calls and compares with the CPU's row-wise GEMMs (kernels/gemm_rows.h), which checks every transpose, m/n/k,
 * leading dimension, offset and the padding of the last row block on a machine without a GPU.
 *
 * The three products (row-major, W [out, in], T token rows):
 *   forward          y[T, out]   = x[T, in] W^T
 *   backward input   dx[T, in]   = dy[T, out] W + beta dx
 *   backward weight  dW[out, in] = dy^T x + beta dW
 * Each entry is one cublasSgemm call, column-major as cuBLAS means it: a row-major M [r, c] with leading dimension
 * L is the column-major M^T [c, r] with the same L.
 *
 * Row blocks: with layout_invariant the row-wise products (forward, backward input) are cut into the fixed blocks of
 * kernels/gemm_rows.h (MOE_GEMM_ROW_BLOCK rows), every call of the same shape, so that cuBLAS picks one kernel for
 * all of them and a token's row does not depend on how many tokens share the call. The last partial block is a
 * padded call: its rows are copied into PAD_IN (zeros after them), the product runs on full blocks of PAD_IN and
 * PAD_OUT, and its rows are copied back (before it, when beta is 1, C's rows go into PAD_OUT). The weight gradient
 * sums over the rows: one call. */
#ifndef MOE_KERNELS_LINEAR_GEMMS_H
#define MOE_KERNELS_LINEAR_GEMMS_H

#include <stddef.h>

#include "kernels/gemm_lt.h"

typedef enum { MOE__LIN_FORWARD, MOE__LIN_BACKWARD_INPUT, MOE__LIN_BACKWARD_WEIGHT } moe__lin_product;

/* The arrays a product reads or writes; PAD_IN, PAD_OUT: [MOE_GEMM_ROW_BLOCK, width] each, the padded block. */
typedef enum {
    MOE__LIN_X, MOE__LIN_W, MOE__LIN_Y, MOE__LIN_DY, MOE__LIN_DX, MOE__LIN_DW, MOE__LIN_PAD_IN, MOE__LIN_PAD_OUT,
    MOE__LIN_ARRAYS
} moe__lin_array;

typedef struct {
    int trans_a, trans_b, m, n, k;      /* C[m, n] = op(A) op(B) + beta C, column-major, alpha 1 */
    float beta;
    moe__lin_array a, b, c;
    size_t a_off, b_off, c_off;         /* floats into the array */
    int lda, ldb, ldc;
    /* padded calls only (b = PAD_IN, c = PAD_OUT): the token rows [first_row, first_row + rows) of token_in (width
     * ldb) and token_out (width ldc) that the block holds; n is a whole block, n > rows */
    int padded, first_row, rows;
    moe__lin_array token_in, token_out;
} moe__lin_gemm;

/* How many calls a product of `rows` token rows takes (0 when rows is 0: nothing is read or written). */
int moe__linear_gemm_count(moe__lin_product product, int rows, int layout_invariant);
/* Call `index` of them (0 <= index < count); they may run in any order: their outputs are disjoint. beta is 0 or 1
 * (the forward's is 0). */
moe__lin_gemm moe__linear_gemm(moe__lin_product product, int rows, int in, int out, int layout_invariant, float beta,
                               int index);

/* The product as one pinned cuBLASLt GEMM (kernels/gemm_lt.h; linear.h's MOE_LINEAR_LT): its shape and M, and which
 * arrays are its A, B and D (D is also its C): forward (x, W, y; M = rows), backward input (dy, W, dx; M = rows),
 * weight gradient (dy, x, dW; M = out, K = rows). rows >= 1. */
typedef struct {
    moe_gemm_lt_shape shape;
    int M;
    moe__lin_array a, b, d;
} moe__lin_lt_call;
moe__lin_lt_call moe__linear_lt_call(moe__lin_product product, int rows, int in, int out, int bf16_inputs);

#endif
