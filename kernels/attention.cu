/* attention.cu — causal GQA self-attention on the GPU (shapes: attention.h; the CPU twin: attention_cpu.c).
 * Products are cuBLAS strided-batched GEMMs (fp32, the context's pedantic math mode: no TF32), one call per
 * query head h, batched over the sequences; the list of calls, with every transpose, leading dimension and stride,
 * is kernels/attention_gemms.c's (tests/test_attention_gemms.c runs the same list on the CPU). dK and dV of a kv
 * head accumulate its query heads' products by beta = 1 in increasing h, one call after another on the stream: a
 * fixed order, no atomics, as the CPU's loop. The causal softmax and its backward are kernels, one warp per row;
 * entries of P above the diagonal are written 0, so full-length products equal the causal ones.
 * Checked by tests/test_gpu_dense_ops_b.cu (build: ninja -C build; run: meson test -C build --suite gpu). */
#include <math.h>

#include "core/gpu_cuda.h"

#include "kernels/warp_reduce.cuh"

#include <vector>

extern "C" {
#include "kernels/attention.h"
#include "kernels/attention_gemms.h"
}

namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kRowThreads = kWarpsPerBlock * kWarpSize;

struct Dims {
    int S, H, KV, hd;
    long long kv_batch, att_batch; /* floats from one sequence to the next */
    float scale;                   /* 1 / sqrt(hd), rounded as on the CPU */
};

Dims dims_of(int seq_len, int num_heads, int num_kv_heads, int head_dim) {
    Dims a;
    a.S = seq_len, a.H = num_heads, a.KV = num_kv_heads, a.hd = head_dim;
    a.kv_batch = (long long)seq_len * num_kv_heads * head_dim;
    a.att_batch = (long long)num_heads * seq_len * seq_len;
    a.scale = (float)(1 / sqrt((double)head_dim));
    return a;
}

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


/* The products of a phase on cuBLAS; arrays: each moe__att_array's device pointer (only the C operands are written).
 * One call per sequence (batchCount 1), not one batched over the rank's sequences: cuBLAS picks its kernel by the
 * whole call, batchCount included, and the sequences a rank holds change with the layout (world size, micro-batches),
 * so a batched call could give a sequence other bits at another layout (issue 50, item 7). */
moe_status run_gemms(moe_gpu *gpu, moe__att_phase phase, const Dims &a, float *const *arrays, int num_seqs) {
    std::vector<moe__att_gemm> gemms((size_t)2 * a.H);
    const int count = moe__attention_gemms(phase, a.S, a.H, a.KV, a.hd, gemms.data());
    for (int n = 0; n < num_seqs; n++)
        for (int i = 0; i < count; i++) {
            const moe__att_gemm &g = gemms[i];
            MOE_CUBLAS_TRY(cublasSgemmStridedBatched(
                gpu->blas, g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, g.m, g.n, g.k,
                &g.alpha, arrays[g.a] + g.a_off + n * g.stride_a, g.lda, g.stride_a,
                arrays[g.b] + g.b_off + n * g.stride_b, g.ldb, g.stride_b, &g.beta,
                arrays[g.c] + g.c_off + n * g.stride_c, g.ldc, g.stride_c, 1));
        }
    return MOE_OK;
}

} // namespace

extern "C" moe_status moe_attention_forward_cuda(moe_gpu *gpu, const float *q, const float *k, const float *v,
                                                 int num_seqs, int seq_len, int num_heads, int num_kv_heads,
                                                 int head_dim, float *att, float *out) {
    if (bad_dims(num_seqs, seq_len, num_heads, num_kv_heads, head_dim) || !q || !k || !v || !att || !out)
        return MOE_ERR_INVALID_ARG;
    if (num_seqs == 0 || seq_len == 0) return MOE_OK;
    const Dims a = dims_of(seq_len, num_heads, num_kv_heads, head_dim);
    float *arrays[MOE__ATT_ARRAYS] = {};
    arrays[MOE__ATT_Q] = const_cast<float *>(q), arrays[MOE__ATT_K] = const_cast<float *>(k);
    arrays[MOE__ATT_V] = const_cast<float *>(v), arrays[MOE__ATT_P] = att, arrays[MOE__ATT_OUT] = out;
    MOE_TRY(run_gemms(gpu, MOE__ATT_SCORES, a, arrays, num_seqs));
    const size_t num_rows = (size_t)num_seqs * a.H * a.S;
    causal_softmax<<<row_blocks(num_rows), kRowThreads, 0, gpu->stream>>>(att, num_rows, a.S);
    MOE_CUDA_LAUNCHED();
    return run_gemms(gpu, MOE__ATT_OUTPUT, a, arrays, num_seqs);
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
    const size_t kv_nbytes = (size_t)num_seqs * a.kv_batch * sizeof(float);
    MOE_CUDA_TRY(cudaMemsetAsync(dk, 0, kv_nbytes, gpu->stream));
    MOE_CUDA_TRY(cudaMemsetAsync(dv, 0, kv_nbytes, gpu->stream));
    void *scratch = NULL; /* dS: [num_seqs, H, S, S], the layout of att */
    MOE_TRY(moe_gpu_scratch(gpu, (size_t)num_seqs * a.att_batch * sizeof(float), &scratch));
    float *ds = (float *)scratch;
    float *arrays[MOE__ATT_ARRAYS] = {};
    arrays[MOE__ATT_Q] = const_cast<float *>(q), arrays[MOE__ATT_K] = const_cast<float *>(k);
    arrays[MOE__ATT_V] = const_cast<float *>(v), arrays[MOE__ATT_P] = const_cast<float *>(att);
    arrays[MOE__ATT_DOUT] = const_cast<float *>(dout), arrays[MOE__ATT_DS] = ds;
    arrays[MOE__ATT_DQ] = dq, arrays[MOE__ATT_DK] = dk, arrays[MOE__ATT_DV] = dv;
    MOE_TRY(run_gemms(gpu, MOE__ATT_DV_DP, a, arrays, num_seqs));
    const size_t num_rows = (size_t)num_seqs * a.H * a.S;
    causal_softmax_backward<<<row_blocks(num_rows), kRowThreads, 0, gpu->stream>>>(att, ds, num_rows, a.S, a.scale);
    MOE_CUDA_LAUNCHED();
    return run_gemms(gpu, MOE__ATT_DQ_DK, a, arrays, num_seqs);
}
