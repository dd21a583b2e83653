/* attention_gemms.c — the CUDA attention's products as data (why: attention_gemms.h). Per query head h, with
 * ldq = H hd, ldk = KV hd and the kv head h / (H / KV):
 *   scores^T [S, S]  = scale K Q^T:   (T, N, S, S, hd)   K (ldk), Q (ldq)          into P (S)
 *   out^T   [hd, S]  = V^T P^T:       (N, N, hd, S, S)   V (ldk), P (S)            into out (ldq)
 *   dV^T    [hd, S] += dO^T P:        (N, T, hd, S, S)   dO (ldq), P (S), beta 1   into dV (ldk)
 *   dP^T    [S, S]   = V dO^T:        (T, N, S, S, hd)   V (ldk), dO (ldq)         into dS (S)
 *   dQ^T    [hd, S]  = K^T dS^T:      (N, N, hd, S, S)   K (ldk), dS (S)           into dQ (ldq)
 *   dK^T    [hd, S] += Q^T dS:        (N, T, hd, S, S)   Q (ldq), dS (S), beta 1   into dK (ldk) */
#include "kernels/attention_gemms.h"

#include <math.h>

typedef struct {
    int S, H, KV, hd, ldq, ldk;
    long long q_batch, kv_batch, att_batch;
    float scale;
} att_shape;

static moe__att_gemm gemm(int ta, int tb, int m, int n, int k, float alpha, float beta) {
    return (moe__att_gemm){.trans_a = ta, .trans_b = tb, .m = m, .n = n, .k = k, .alpha = alpha, .beta = beta};
}

/* operand x of g: array, offset, leading dimension, stride */
static void operand(moe__att_array *array, size_t *off, int *ld, long long *stride, moe__att_array which,
                    const att_shape *s, int h) {
    *array = which;
    switch (which) {
    case MOE__ATT_Q: case MOE__ATT_DOUT: case MOE__ATT_OUT: case MOE__ATT_DQ:
        *off = (size_t)h * s->hd, *ld = s->ldq, *stride = s->q_batch;
        break;
    case MOE__ATT_K: case MOE__ATT_V: case MOE__ATT_DK: case MOE__ATT_DV:
        *off = (size_t)(h / (s->H / s->KV)) * s->hd, *ld = s->ldk, *stride = s->kv_batch;
        break;
    default: /* P, dS: [H, S, S] per sequence */
        *off = (size_t)h * s->S * s->S, *ld = s->S, *stride = s->att_batch;
        break;
    }
}

static moe__att_gemm with(moe__att_gemm g, moe__att_array a, moe__att_array b, moe__att_array c, const att_shape *s,
                          int h) {
    operand(&g.a, &g.a_off, &g.lda, &g.stride_a, a, s, h);
    operand(&g.b, &g.b_off, &g.ldb, &g.stride_b, b, s, h);
    operand(&g.c, &g.c_off, &g.ldc, &g.stride_c, c, s, h);
    return g;
}

int moe__attention_gemms(moe__att_phase phase, int seq_len, int num_heads, int num_kv_heads, int head_dim,
                         moe__att_gemm *out) {
    const int S = seq_len, hd = head_dim;
    const att_shape s = {S, num_heads, num_kv_heads, hd, num_heads * hd, num_kv_heads * hd,
                         (long long)S * num_heads * hd, (long long)S * num_kv_heads * hd,
                         (long long)num_heads * S * S, (float)(1 / sqrt((double)hd))};
    int count = 0;
    for (int h = 0; h < num_heads; h++) switch (phase) {
        case MOE__ATT_SCORES:
            out[count++] = with(gemm(1, 0, S, S, hd, s.scale, 0), MOE__ATT_K, MOE__ATT_Q, MOE__ATT_P, &s, h);
            break;
        case MOE__ATT_OUTPUT:
            out[count++] = with(gemm(0, 0, hd, S, S, 1, 0), MOE__ATT_V, MOE__ATT_P, MOE__ATT_OUT, &s, h);
            break;
        case MOE__ATT_DV_DP:
            out[count++] = with(gemm(0, 1, hd, S, S, 1, 1), MOE__ATT_DOUT, MOE__ATT_P, MOE__ATT_DV, &s, h);
            out[count++] = with(gemm(1, 0, S, S, hd, 1, 0), MOE__ATT_V, MOE__ATT_DOUT, MOE__ATT_DS, &s, h);
            break;
        case MOE__ATT_DQ_DK:
            out[count++] = with(gemm(0, 0, hd, S, S, 1, 0), MOE__ATT_K, MOE__ATT_DS, MOE__ATT_DQ, &s, h);
            out[count++] = with(gemm(0, 1, hd, S, S, 1, 1), MOE__ATT_Q, MOE__ATT_DS, MOE__ATT_DK, &s, h);
            break;
        }
    return count;
}
