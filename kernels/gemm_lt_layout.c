/* gemm_lt_layout.c — the column-major view of a pinned GEMM (gemm_lt.h): row lengths and cuBLASLt's layouts, on the
 * CPU (libmoe) so that tests/test_gemm_lt_layout.c runs them with cblas without a GPU.
 *
 * Row-major M [r, c] with row length L is column-major M^T [c, r] with leading dimension L. So D [M, N] (row length N)
 * is D^T [N, M], ld N, and D^T = op_b(B)^T op_a(A)^T:
 *   op_b(B)^T, cuBLASLt's A:  trans_b 1: B [N, K] stored is B^T [K, N] column-major; (B^T)^T = B: op T on K x N
 *                             trans_b 0: B [K, N] stored is B^T [N, K] column-major: op N on N x K
 *   op_a(A)^T, cuBLASLt's B:  trans_a 0: A [M, K] stored is A^T [K, M] column-major: op N on K x M
 *                             trans_a 1: A [K, M] stored is A^T [M, K] column-major; (A^T)^T = A: op T on M x K */
#include <stdio.h>

#include "kernels/gemm_lt.h"

static int pad(int width, moe_gemm_lt_inputs inputs) {
    const int per_16_bytes = inputs == MOE_GEMM_LT_BF16 ? 8 : 4;
    return (width + per_16_bytes - 1) / per_16_bytes * per_16_bytes;
}

int moe_gemm_lt_ld_a(const moe_gemm_lt_shape *s, int M) { return pad(s->trans_a ? M : s->k, s->inputs); }

int moe_gemm_lt_ld_b(const moe_gemm_lt_shape *s) { return pad(s->trans_b ? s->k : s->n, s->inputs); }

moe__gemm_lt_colmajor moe__gemm_lt_colmajor_of(const moe_gemm_lt_shape *s, int M) {
    const int N = s->n, K = s->k;
    moe__gemm_lt_colmajor c = {.m = N, .n = M, .k = K, .d_rows = N, .d_cols = M, .d_ld = N};
    c.op_first = s->trans_b, c.first_ld = moe_gemm_lt_ld_b(s);
    c.first_rows = s->trans_b ? K : N, c.first_cols = s->trans_b ? N : K;
    c.op_second = s->trans_a, c.second_ld = moe_gemm_lt_ld_a(s, M);
    c.second_rows = s->trans_a ? M : K, c.second_cols = s->trans_a ? K : M;
    return c;
}

void moe_gemm_lt_shape_text(const moe_gemm_lt_shape *s, char *out, size_t n) {
    snprintf(out, n, "%s %s n %d k %d %s%s", s->trans_a ? "A^T" : "A", s->trans_b ? "B^T" : "B", s->n, s->k,
             s->inputs == MOE_GEMM_LT_BF16 ? "bf16" : "fp32", s->bf16_out ? " -> bf16" : "");
}
