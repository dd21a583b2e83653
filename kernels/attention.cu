/* attention.cu — causal GQA self-attention on the GPU (shapes: attention.h; the CPU twin: attention_cpu.c).
 * Products are cuBLAS strided-batched GEMMs (fp32, the context's pedantic math mode: no TF32), one call per
 * query head h, batched over the sequences: a sequence's block of q is S H hd floats after the previous one's,
 * of k and v S KV hd, of att H S S. The causal softmax and its backward are kernels, one warp per row.
 *
 * Row-major M [r, c] (leading dimension L) is column-major M^T [c, r] (same L), so each product below is
 * written for the transposes, with ldq = H hd, ldk = KV hd:
 *   scores^T [S, S]  = scale K Q^T:   gemm(T, N, S, S, hd, K (ldk), Q (ldq))
 *   out^T   [hd, S]  = V^T P^T:       gemm(N, N, hd, S, S, V (ldk), P (S))
 *   dV^T    [hd, S] += dO^T P:        gemm(N, T, hd, S, S, dO (ldq), P (S)), beta 1
 *   dP^T    [S, S]   = V dO^T:        gemm(T, N, S, S, hd, V (ldk), dO (ldq))
 *   dQ^T    [hd, S]  = K^T dS^T:      gemm(N, N, hd, S, S, K (ldk), dS (S))
 *   dK^T    [hd, S] += Q^T dS:        gemm(N, T, hd, S, S, Q (ldq), dS (S)), beta 1
 * dK and dV of a kv head accumulate its query heads' products by beta = 1 in increasing h, one call after
 * another on the stream: a fixed order, no atomics, as the CPU's loop. Entries of P above the diagonal are
 * written 0, so full-length products equal the causal ones.
 * Checked by tests/test_gpu_dense_ops_b.cu (build: ninja -C build; run: meson test -C build --suite gpu). */
#include <math.h>

#include "core/gpu_cuda.h"

#include "kernels/warp_reduce.cuh"

extern "C" {
#include "kernels/attention.h"
}

namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kRowThreads = kWarpsPerBlock * kWarpSize;

struct Dims {
    int S, H, KV, hd, group;
    long long q_batch, kv_batch, att_batch; /* floats from one sequence to the next */
    float scale;                            /* 1 / sqrt(hd), rounded as on the CPU */
};

Dims dims_of(int seq_len, int num_heads, int num_kv_heads, int head_dim) {
    Dims a;
    a.S = seq_len, a.H = num_heads, a.KV = num_kv_heads, a.hd = head_dim, a.group = num_heads / num_kv_heads;
    a.q_batch = (long long)seq_len * num_heads * head_dim;
    a.kv_batch = (long long)seq_len * num_kv_heads * head_dim;
    a.att_batch = (long long)num_heads * seq_len * seq_len;
    a.scale = (float)(1 / sqrt((double)head_dim));
    return a;
}

size_t q_off(const Dims &a, int h) { return (size_t)h * a.hd; }
size_t kv_off(const Dims &a, int h) { return (size_t)(h / a.group) * a.hd; }
size_t att_off(const Dims &a, int h) { return (size_t)h * a.S * a.S; }

/* Row i of a [S, S] score matrix (rows: num_seqs H S): p_j = exp(s_j - max) / sum over j <= i, 0 for j > i.
 * The exps are stored, their sum taken in double, then multiplied by (float)(1 / sum), as on the CPU. */
__global__ void causal_softmax(float *att, size_t num_rows, int S) {
    const size_t row = (size_t)blockIdx.x * kWarpsPerBlock + threadIdx.x / kWarpSize;
    const int lane = threadIdx.x % kWarpSize;
    if (row >= num_rows) return; /* the whole warp: row is warp-uniform */
    const int i = (int)(row % S);
    float *p = att + row * S;
    float max = -INFINITY;
    for (int j = lane; j <= i; j += kWarpSize) max = fmaxf(max, p[j]);
    max = warp_max(max);
    double sum = 0;
    for (int j = lane; j <= i; j += kWarpSize) {
        const float e = expf(p[j] - max);
        p[j] = e;
        sum += e;
    }
    sum = warp_sum(sum);
    const float inv = (float)(1 / sum);
    for (int j = lane; j <= i; j += kWarpSize) p[j] = __fmul_rn(p[j], inv);
    for (int j = i + 1 + lane; j < S; j += kWarpSize) p[j] = 0;
}

/* In place on dP: dS_j = P_j (dP_j - sum_{j' <= i} dP_j' P_j') scale for j <= i, 0 above the diagonal. */
__global__ void causal_softmax_backward(const float *att, float *ds, size_t num_rows, int S, float scale) {
    const size_t row = (size_t)blockIdx.x * kWarpsPerBlock + threadIdx.x / kWarpSize;
    const int lane = threadIdx.x % kWarpSize;
    if (row >= num_rows) return;
    const int i = (int)(row % S);
    const float *p = att + row * S;
    float *d = ds + row * S;
    double dot = 0;
    for (int j = lane; j <= i; j += kWarpSize) dot += (double)d[j] * p[j];
    const float dotf = (float)warp_sum(dot);
    for (int j = lane; j <= i; j += kWarpSize) d[j] = __fmul_rn(__fmul_rn(p[j], __fsub_rn(d[j], dotf)), scale);
    for (int j = i + 1 + lane; j < S; j += kWarpSize) d[j] = 0;
}

unsigned row_blocks(size_t num_rows) { return (unsigned)((num_rows + kWarpsPerBlock - 1) / kWarpsPerBlock); }

bool bad_dims(int num_seqs, int seq_len, int num_heads, int num_kv_heads, int head_dim) {
    return num_seqs < 0 || seq_len < 0 || num_heads < 1 || num_kv_heads < 1 || head_dim < 1 ||
           num_heads % num_kv_heads != 0;
}

} // namespace

extern "C" moe_status moe_attention_forward_cuda(moe_gpu *gpu, const float *q, const float *k, const float *v,
                                                 int num_seqs, int seq_len, int num_heads, int num_kv_heads,
                                                 int head_dim, float *att, float *out) {
    if (bad_dims(num_seqs, seq_len, num_heads, num_kv_heads, head_dim) || !q || !k || !v || !att || !out)
        return MOE_ERR_INVALID_ARG;
    if (num_seqs == 0 || seq_len == 0) return MOE_OK;
    const Dims a = dims_of(seq_len, num_heads, num_kv_heads, head_dim);
    const int S = a.S, hd = a.hd, ldq = a.H * hd, ldk = a.KV * hd;
    const float one = 1.0f, zero = 0.0f;
    for (int h = 0; h < a.H; h++) /* scores^T = scale K Q^T */
        MOE_CUBLAS_TRY(cublasSgemmStridedBatched(gpu->blas, CUBLAS_OP_T, CUBLAS_OP_N, S, S, hd, &a.scale,
                                                 k + kv_off(a, h), ldk, a.kv_batch, q + q_off(a, h), ldq, a.q_batch,
                                                 &zero, att + att_off(a, h), S, a.att_batch, num_seqs));
    const size_t num_rows = (size_t)num_seqs * a.H * S;
    causal_softmax<<<row_blocks(num_rows), kRowThreads, 0, gpu->stream>>>(att, num_rows, S);
    MOE_CUDA_LAUNCHED();
    for (int h = 0; h < a.H; h++) /* out^T = V^T P^T */
        MOE_CUBLAS_TRY(cublasSgemmStridedBatched(gpu->blas, CUBLAS_OP_N, CUBLAS_OP_N, hd, S, S, &one,
                                                 v + kv_off(a, h), ldk, a.kv_batch, att + att_off(a, h), S,
                                                 a.att_batch, &zero, out + q_off(a, h), ldq, a.q_batch, num_seqs));
    return MOE_OK;
}

extern "C" moe_status moe_attention_backward_cuda(moe_gpu *gpu, const float *q, const float *k, const float *v,
                                                  const float *att, const float *dout, int num_seqs, int seq_len,
                                                  int num_heads, int num_kv_heads, int head_dim, float *dq, float *dk,
                                                  float *dv) {
    if (bad_dims(num_seqs, seq_len, num_heads, num_kv_heads, head_dim) || !q || !k || !v || !att || !dout || !dq ||
        !dk || !dv)
        return MOE_ERR_INVALID_ARG;
    if (num_seqs == 0 || seq_len == 0) return MOE_OK;
    const Dims a = dims_of(seq_len, num_heads, num_kv_heads, head_dim);
    const int S = a.S, hd = a.hd, ldq = a.H * hd, ldk = a.KV * hd;
    const size_t kv_nbytes = (size_t)num_seqs * a.kv_batch * sizeof(float);
    MOE_CUDA_TRY(cudaMemsetAsync(dk, 0, kv_nbytes, gpu->stream));
    MOE_CUDA_TRY(cudaMemsetAsync(dv, 0, kv_nbytes, gpu->stream));
    void *scratch = NULL; /* dS: [num_seqs, H, S, S], the layout of att */
    moe_status st = moe_gpu_scratch(gpu, (size_t)num_seqs * a.att_batch * sizeof(float), &scratch);
    if (st != MOE_OK) return st;
    float *ds = (float *)scratch;
    const float one = 1.0f, zero = 0.0f;
    for (int h = 0; h < a.H; h++) {
        /* dV^T += dO^T P (query heads of a group in increasing h) */
        MOE_CUBLAS_TRY(cublasSgemmStridedBatched(gpu->blas, CUBLAS_OP_N, CUBLAS_OP_T, hd, S, S, &one,
                                                 dout + q_off(a, h), ldq, a.q_batch, att + att_off(a, h), S,
                                                 a.att_batch, &one, dv + kv_off(a, h), ldk, a.kv_batch, num_seqs));
        /* dP^T = V dO^T */
        MOE_CUBLAS_TRY(cublasSgemmStridedBatched(gpu->blas, CUBLAS_OP_T, CUBLAS_OP_N, S, S, hd, &one,
                                                 v + kv_off(a, h), ldk, a.kv_batch, dout + q_off(a, h), ldq,
                                                 a.q_batch, &zero, ds + att_off(a, h), S, a.att_batch, num_seqs));
    }
    const size_t num_rows = (size_t)num_seqs * a.H * S;
    causal_softmax_backward<<<row_blocks(num_rows), kRowThreads, 0, gpu->stream>>>(att, ds, num_rows, S, a.scale);
    MOE_CUDA_LAUNCHED();
    for (int h = 0; h < a.H; h++) {
        /* dQ^T = K^T dS^T */
        MOE_CUBLAS_TRY(cublasSgemmStridedBatched(gpu->blas, CUBLAS_OP_N, CUBLAS_OP_N, hd, S, S, &one,
                                                 k + kv_off(a, h), ldk, a.kv_batch, ds + att_off(a, h), S,
                                                 a.att_batch, &zero, dq + q_off(a, h), ldq, a.q_batch, num_seqs));
        /* dK^T += Q^T dS */
        MOE_CUBLAS_TRY(cublasSgemmStridedBatched(gpu->blas, CUBLAS_OP_N, CUBLAS_OP_T, hd, S, S, &one,
                                                 q + q_off(a, h), ldq, a.q_batch, ds + att_off(a, h), S, a.att_batch,
                                                 &one, dk + kv_off(a, h), ldk, a.kv_batch, num_seqs));
    }
    return MOE_OK;
}
