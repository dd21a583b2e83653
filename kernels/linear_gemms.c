/* linear_gemms.c — the linear layer's cuBLAS products as data (why: linear_gemms.h). For a block of n token rows
 * starting at row r (all T rows without row blocks):
 *   y^T [out, n]   = W x^T:      (T, N, out, n, in)    W (lda in), x + r in (ldb in)        into y + r out (ldc out)
 *   dx^T [in, n]  (+)= W^T dy^T: (N, N, in, n, out)    W (lda in), dy + r out (ldb out)     into dx + r in (ldc in)
 *   dW^T [in, out] += x^T dy:    (N, T, in, out, T)    x (lda in), dy (ldb out)             into dW (ldc in) */
#include "kernels/linear_gemms.h"

#include "kernels/gemm_rows.h"

static int row_block(int rows, int layout_invariant) { return layout_invariant ? MOE_GEMM_ROW_BLOCK : rows; }

int moe__linear_gemm_count(moe__lin_product product, int rows, int layout_invariant) {
    if (rows <= 0) return 0;
    if (product == MOE__LIN_BACKWARD_WEIGHT) return 1;
    const int block = row_block(rows, layout_invariant);
    return (rows + block - 1) / block;
}

moe__lin_gemm moe__linear_gemm(moe__lin_product product, int rows, int in, int out, int layout_invariant, float beta,
                               int index) {
    if (product == MOE__LIN_BACKWARD_WEIGHT)
        return (moe__lin_gemm){.trans_a = 0, .trans_b = 1, .m = in, .n = out, .k = rows, .beta = beta,
                               .a = MOE__LIN_X, .b = MOE__LIN_DY, .c = MOE__LIN_DW, .lda = in, .ldb = out, .ldc = in};
    const int forward = product == MOE__LIN_FORWARD;
    const int block = row_block(rows, layout_invariant), first = index * block;
    const int width_in = forward ? in : out, width_out = forward ? out : in; /* of the token rows read, written */
    moe__lin_gemm g = {.trans_a = forward, .trans_b = 0, .m = width_out, .n = block, .k = width_in,
                       .beta = forward ? 0 : beta, .a = MOE__LIN_W, .lda = in, .ldb = width_in, .ldc = width_out,
                       .first_row = first, .rows = rows - first < block ? rows - first : block,
                       .token_in = forward ? MOE__LIN_X : MOE__LIN_DY, .token_out = forward ? MOE__LIN_Y : MOE__LIN_DX};
    g.padded = g.rows < block;
    if (g.padded) {
        g.b = MOE__LIN_PAD_IN, g.c = MOE__LIN_PAD_OUT;
    } else {
        g.b = g.token_in, g.c = g.token_out;
        g.b_off = (size_t)first * width_in, g.c_off = (size_t)first * width_out;
    }
    return g;
}

moe__lin_lt_call moe__linear_lt_call(moe__lin_product product, int rows, int in, int out, int bf16_inputs) {
    const moe_gemm_lt_inputs inputs = bf16_inputs ? MOE_GEMM_LT_BF16 : MOE_GEMM_LT_FP32;
    switch (product) {
    case MOE__LIN_FORWARD: /* y [rows, out] = x [rows, in] W^T */
        return (moe__lin_lt_call){{0, 1, out, in, inputs, 0}, rows, MOE__LIN_X, MOE__LIN_W, MOE__LIN_Y};
    case MOE__LIN_BACKWARD_INPUT: /* dx [rows, in] = dy [rows, out] W */
        return (moe__lin_lt_call){{0, 0, in, out, inputs, 0}, rows, MOE__LIN_DY, MOE__LIN_W, MOE__LIN_DX};
    default: /* dW [out, in] = dy^T x, dy [rows, out], x [rows, in] */
        return (moe__lin_lt_call){{1, 0, in, rows, inputs, 0}, out, MOE__LIN_DY, MOE__LIN_X, MOE__LIN_DW};
    }
}
