/* attention_cpu.c — causal GQA self-attention, forward and backward (shapes: attention.h). For each
 * (sequence, head) the products are cblas GEMMs on strided views: a query head's rows are H*hd apart in
 * q, a kv head's KV*hd apart in k and v. Softmax and the causal mask are plain loops. Threads: forward splits
 * the (sequence, head) pairs, backward the (sequence, kv head) pairs (a kv head's query heads in order inside
 * one), each running its GEMMs on its own thread: every output has one writer, in the order of one thread.
 * Tested in tests/test_model_kernels.c: dq, dk, dv against central finite differences for H = KV,
 * H = 2 KV and KV = 1 (float64 build); causality (a later token does not change earlier outputs, bitwise);
 * the saved probabilities (zero above the diagonal, rows summing to 1). */
#include "kernels/attention.h"

#include <string.h>

#include "core/real.h"
#include "core/threads.h"
#include "kernels/row_reduce.h"

typedef struct {
    int S, H, KV, hd, group; /* group = H / KV query heads per kv head */
    moe_real scale;          /* 1 / sqrt(hd) */
} attn_dims;

static attn_dims dims_of(int seq_len, int num_heads, int num_kv_heads, int head_dim) {
    attn_dims a = {seq_len, num_heads, num_kv_heads, head_dim, num_heads / num_kv_heads, 0};
    a.scale = (moe_real)(1 / sqrt((double)head_dim));
    return a;
}

/* Offsets of sequence n, query head h (and its kv head) in the [tokens, heads, hd] arrays. */
static size_t q_off(const attn_dims *a, int n, int h) { return (size_t)n * a->S * a->H * a->hd + (size_t)h * a->hd; }
static size_t kv_off(const attn_dims *a, int n, int h) {
    return (size_t)n * a->S * a->KV * a->hd + (size_t)(h / a->group) * a->hd;
}

void moe_attention_forward_cpu(const moe_real *q, const moe_real *k, const moe_real *v, int num_seqs, int seq_len,
                               int num_heads, int num_kv_heads, int head_dim, moe_real *att, moe_real *out) {
    const attn_dims a = dims_of(seq_len, num_heads, num_kv_heads, head_dim);
    const int S = a.S, hd = a.hd, ldq = a.H * hd, ldk = a.KV * hd;
    if (S == 0) return; /* cblas rejects a leading dimension of 0 */
    const int pairs = num_seqs * a.H, blas = moe__blas_serial_begin();
    MOE__PARALLEL_FOR(pairs > 1,
    for (int nh = 0; nh < pairs; nh++) {
        const int n = nh / a.H, h = nh % a.H;
        const moe_real *Q = q + q_off(&a, n, h), *K = k + kv_off(&a, n, h), *V = v + kv_off(&a, n, h);
        moe_real *P = att + ((size_t)n * a.H + h) * S * S;
        /* scores = scale * Q K^T (the part above the diagonal is computed, then ignored) */
        moe__gemm(CblasRowMajor, CblasNoTrans, CblasTrans, S, S, hd, a.scale, Q, ldq, K, ldk, 0, P, S);
        for (int i = 0; i < S; i++) {
            moe_real *p = P + (size_t)i * S;
            const moe_real max = moe_row_max(p, i + 1, p[0]);
            for (int j = 0; j <= i; j++) p[j] = moe__exp(p[j] - max);
            const moe_real inv = (moe_real)(1 / moe_row_dot(p, NULL, i + 1));
            for (int j = 0; j <= i; j++) p[j] *= inv;
            for (int j = i + 1; j < S; j++) p[j] = 0;
        }
        /* out = P V */
        moe__gemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, S, hd, S, 1, P, S, V, ldk, 0, out + q_off(&a, n, h),
                  ldq);
    });
    moe__blas_serial_end(blas);
}

/* Per (sequence, head), with dO the head's slice of dout:
 *   dV += P^T dO;   dP = dO V^T;   dS = P * (dP - rowsum(dP * P)) * scale   (zero above the diagonal)
 *   dQ = dS K;      dK += dS^T Q
 * dk and dv of a kv head sum over its group of query heads, in increasing head order (deterministic). */
void moe_attention_backward_cpu(const moe_real *q, const moe_real *k, const moe_real *v, const moe_real *att,
                                const moe_real *dout, int num_seqs, int seq_len, int num_heads, int num_kv_heads,
                                int head_dim, moe_real *dq, moe_real *dk, moe_real *dv, moe_real *scratch) {
    const attn_dims a = dims_of(seq_len, num_heads, num_kv_heads, head_dim);
    const int S = a.S, hd = a.hd, ldq = a.H * hd, ldk = a.KV * hd;
    const size_t kv_count = (size_t)num_seqs * S * ldk;
    memset(dk, 0, kv_count * sizeof(moe_real));
    memset(dv, 0, kv_count * sizeof(moe_real));
    if (S == 0) return;
    const int pairs = num_seqs * a.KV, blas = moe__blas_serial_begin();
    MOE__PARALLEL_FOR(pairs > 1,
    for (int nk = 0; nk < pairs; nk++)
        for (int h = nk % a.KV * a.group; h < (nk % a.KV + 1) * a.group; h++) {
            const int n = nk / a.KV;
            const size_t qo = q_off(&a, n, h), ko = kv_off(&a, n, h);
            const moe_real *P = att + ((size_t)n * a.H + h) * S * S, *dO = dout + qo;
            moe_real *dS = scratch + (size_t)moe__thread_id() * S * S;
            moe__gemm(CblasRowMajor, CblasTrans, CblasNoTrans, S, hd, S, 1, P, S, dO, ldq, 1, dv + ko, ldk);
            moe__gemm(CblasRowMajor, CblasNoTrans, CblasTrans, S, S, hd, 1, dO, ldq, v + ko, ldk, 0, dS, S);
            for (int i = 0; i < S; i++) {
                const moe_real *p = P + (size_t)i * S;
                moe_real *ds = dS + (size_t)i * S;
                const moe_real dot = (moe_real)moe_row_dot(ds, p, i + 1);
                for (int j = 0; j <= i; j++) ds[j] = p[j] * (ds[j] - dot) * a.scale;
                for (int j = i + 1; j < S; j++) ds[j] = 0;
            }
            moe__gemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, S, hd, S, 1, dS, S, k + ko, ldk, 0, dq + qo, ldq);
            moe__gemm(CblasRowMajor, CblasTrans, CblasNoTrans, S, hd, S, 1, dS, S, q + qo, ldq, 1, dk + ko, ldk);
        });
    moe__blas_serial_end(blas);
}
