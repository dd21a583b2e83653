/* attention_fused.cu — fused causal GQA attention on the GPU (shapes and contract: attention.h; the CPU twin:
 * attention_fused_cpu.c, whose comment has the formulas). The plain kernels, written to be right: fp32 FMA on the
 * CUDA cores (the tensor-core ones are attention_flash.cu's, which the entry points below take under bf16 where they
 * apply, and moe-train says when they do not: train/device_cuda.c), one thread per row, keys (or queries) streamed
 * through shared memory in tiles of kTile rows; no [S, S] matrix, no atomics, every output written by one thread in a
 * fixed order:
 *   forward   thread = query row i of (sequence, head): for j <= i in order, the online softmax
 *             m' = max(m, s_j), c = e^(m - m'), l = l c + e^(s_j - m'), o = o c + e^(s_j - m') v_j;
 *             out_i = o / l, lse_i = m + log l
 *   backward  D_i = dout_i . out_i (a kernel of its own, into the context's scratch); then
 *             dq: thread = query row i: dq_i = sum_{j <= i} ds_ij k_j, in order of j
 *             dkv: thread = key row j of (sequence, kv head): over the group's query heads in increasing order, then
 *             i >= j in order: dv_j += p_ij dout_i, dk_j += ds_ij q_i
 *             with p_ij = e^(s_ij - lse_i), ds_ij = p_ij (dout_i . v_j - D_i) scale
 * Head dimensions up to kMaxHeadDim (MOE_ERR_INVALID_ARG above). Rounding differs from the CPU's tiles (its GEMMs
 * add in another order): compared within the tolerance rows "attention fused" by tests/test_gpu_dense_table.c.
 * bf16 (attention.h): the tensor-core kernels of attention_flash.cu run where moe_attention_flash_applies; these
 * kernels run the rest, rounding at the same points (q, k, v, dout as read; p before o and dv; ds before dq and dk).
 * Build: ninja -C build; check: meson test -C build --suite gpu. */
#include <math.h>

#include "core/gpu_cuda.h"
#include "kernels/attention_flash.cuh"
#include "kernels/cast_device.cuh"

extern "C" {
#include "kernels/attention.h"
}

namespace {

constexpr int kRows = 64;        /* threads per block: one row each */
constexpr int kTile = 16;        /* rows of K and V (or Q and dout) staged in shared memory at a time */
constexpr int kMaxHeadDim = 256; /* the per-thread arrays */

struct FusedDims {
    int S, H, KV, hd, group, ldq, ldk;
    float scale; /* 1 / sqrt(hd), rounded as on the CPU */
    int bf16;    /* the products' inputs rounded to bf16 (attention.h) */
};

FusedDims fused_dims(int S, int H, int KV, int hd, int bf16) {
    FusedDims a;
    a.S = S, a.H = H, a.KV = KV, a.hd = hd, a.group = H / KV, a.ldq = H * hd, a.ldk = KV * hd;
    a.scale = (float)(1 / sqrt((double)hd)), a.bf16 = bf16;
    return a;
}

/* x as a product reads it: itself, or under bf16 rounded (cast_device.cuh: the CPU's rounding, bit for bit) */
__device__ __forceinline__ float operand(const FusedDims &a, float x) {
    return a.bf16 ? moe_cuda::bf16_value(moe_cuda::bf16_bits(x)) : x;
}

/* rows [r0, r0 + kTile) of a [tokens, heads, hd] array (stride ld, starting at base) into tile[kTile][hd] */
__device__ void stage(float *tile, const float *base, int r0, const FusedDims &a, int ld) {
    for (int x = threadIdx.x; x < kTile * a.hd; x += blockDim.x) {
        const int r = x / a.hd, c = x % a.hd;
        tile[x] = r0 + r < a.S ? operand(a, base[(size_t)(r0 + r) * ld + c]) : 0.f;
    }
}

/* The key tile at j0 of K and V into shared memory, once every thread is done with the previous one. */
__device__ void stage_kv(float *K, float *V, const float *kb, const float *vb, int j0, const FusedDims &a) {
    __syncthreads();
    stage(K, kb, j0, a, a.ldk);
    stage(V, vb, j0, a, a.ldk);
    __syncthreads();
}

__device__ float dot_row(const float *a, const float *b, int hd) {
    float s = 0.f;
    for (int x = 0; x < hd; x++) s = fmaf(a[x], b[x], s);
    return s;
}

/* grid (row blocks, H, num_seqs) */
__global__ void fused_forward(FusedDims a, const float *q, const float *k, const float *v, float *lse, float *out) {
    extern __shared__ float smem[];
    float *K = smem, *V = smem + kTile * a.hd;
    const int n = blockIdx.z, h = blockIdx.y, i = blockIdx.x * kRows + threadIdx.x, kvh = h / a.group;
    const float *kb = k + (size_t)n * a.S * a.ldk + (size_t)kvh * a.hd, *vb = v + (size_t)n * a.S * a.ldk + (size_t)kvh * a.hd;
    float qi[kMaxHeadDim], o[kMaxHeadDim];
    const bool row = i < a.S;
    if (row)
        for (int x = 0; x < a.hd; x++)
            qi[x] = operand(a, q[((size_t)n * a.S + i) * a.ldq + (size_t)h * a.hd + x]), o[x] = 0.f;
    float m = -INFINITY, l = 0.f;
    const int last = min(a.S, (blockIdx.x + 1) * kRows); /* keys up to the block's last row */
    for (int j0 = 0; j0 < last; j0 += kTile) {
        stage_kv(K, V, kb, vb, j0, a);
        for (int c = 0; row && c < kTile && j0 + c <= i; c++) {
            const float s = dot_row(qi, K + c * a.hd, a.hd) * a.scale, m_new = fmaxf(m, s);
            const float rescale = m == -INFINITY ? 0.f : expf(m - m_new), p = expf(s - m_new), pv = operand(a, p);
            l = l * rescale + p;
            for (int x = 0; x < a.hd; x++) o[x] = fmaf(pv, V[c * a.hd + x], o[x] * rescale);
            m = m_new;
        }
    }
    if (!row) return;
    const float inv = 1.f / l;
    for (int x = 0; x < a.hd; x++) out[((size_t)n * a.S + i) * a.ldq + (size_t)h * a.hd + x] = o[x] * inv;
    lse[((size_t)n * a.H + h) * a.S + i] = m + logf(l);
}

/* D_i = dout_i . out_i, dout as the products read it (the flash kernels' too); grid (row blocks, H, num_seqs) */
__global__ void fused_row_dots(FusedDims a, const float *out, const float *dout, float *D) {
    const int n = blockIdx.z, h = blockIdx.y, i = blockIdx.x * kRows + threadIdx.x;
    if (i >= a.S) return;
    const size_t at = ((size_t)n * a.S + i) * a.ldq + (size_t)h * a.hd;
    float s = 0.f;
    for (int x = 0; x < a.hd; x++) s = fmaf(out[at + x], operand(a, dout[at + x]), s);
    D[((size_t)n * a.H + h) * a.S + i] = s;
}

/* dq rows; grid (row blocks, H, num_seqs) */
__global__ void fused_backward_dq(FusedDims a, const float *q, const float *k, const float *v, const float *lse,
                                  const float *D, const float *dout, float *dq) {
    extern __shared__ float smem[];
    float *K = smem, *V = smem + kTile * a.hd;
    const int n = blockIdx.z, h = blockIdx.y, i = blockIdx.x * kRows + threadIdx.x, kvh = h / a.group;
    const float *kb = k + (size_t)n * a.S * a.ldk + (size_t)kvh * a.hd, *vb = v + (size_t)n * a.S * a.ldk + (size_t)kvh * a.hd;
    float qi[kMaxHeadDim], doi[kMaxHeadDim], dqi[kMaxHeadDim];
    const bool row = i < a.S;
    const size_t at = ((size_t)n * a.S + (row ? i : 0)) * a.ldq + (size_t)h * a.hd, stat = ((size_t)n * a.H + h) * a.S + i;
    const float lse_i = row ? lse[stat] : 0.f, D_i = row ? D[stat] : 0.f;
    if (row)
        for (int x = 0; x < a.hd; x++) qi[x] = operand(a, q[at + x]), doi[x] = operand(a, dout[at + x]), dqi[x] = 0.f;
    const int last = min(a.S, (blockIdx.x + 1) * kRows);
    for (int j0 = 0; j0 < last; j0 += kTile) {
        stage_kv(K, V, kb, vb, j0, a);
        for (int c = 0; row && c < kTile && j0 + c <= i; c++) {
            const float p = expf(dot_row(qi, K + c * a.hd, a.hd) * a.scale - lse_i);
            const float ds = operand(a, p * (dot_row(doi, V + c * a.hd, a.hd) - D_i) * a.scale);
            for (int x = 0; x < a.hd; x++) dqi[x] = fmaf(ds, K[c * a.hd + x], dqi[x]);
        }
    }
    if (row)
        for (int x = 0; x < a.hd; x++) dq[at + x] = dqi[x];
}

/* dk and dv rows of a kv head; grid (row blocks, KV, num_seqs) */
__global__ void fused_backward_dkv(FusedDims a, const float *q, const float *k, const float *v, const float *lse,
                                   const float *D, const float *dout, float *dk, float *dv) {
    extern __shared__ float smem[];
    float *Q = smem, *dO = smem + kTile * a.hd, *L = dO + kTile * a.hd, *Dt = L + kTile;
    const int n = blockIdx.z, g = blockIdx.y, j = blockIdx.x * kRows + threadIdx.x;
    float kj[kMaxHeadDim], vj[kMaxHeadDim], dkj[kMaxHeadDim], dvj[kMaxHeadDim];
    const bool row = j < a.S;
    const size_t at = ((size_t)n * a.S + (row ? j : 0)) * a.ldk + (size_t)g * a.hd;
    if (row)
        for (int x = 0; x < a.hd; x++)
            kj[x] = operand(a, k[at + x]), vj[x] = operand(a, v[at + x]), dkj[x] = 0.f, dvj[x] = 0.f;
    const int first = blockIdx.x * kRows; /* queries before the block's first key see none of its keys */
    for (int h = g * a.group; h < (g + 1) * a.group; h++) {
        const float *qb = q + (size_t)n * a.S * a.ldq + (size_t)h * a.hd, *db = dout + (size_t)n * a.S * a.ldq + (size_t)h * a.hd;
        const float *lb = lse + ((size_t)n * a.H + h) * a.S, *Db = D + ((size_t)n * a.H + h) * a.S;
        for (int i0 = first / kTile * kTile; i0 < a.S; i0 += kTile) {
            __syncthreads();
            stage(Q, qb, i0, a, a.ldq);
            stage(dO, db, i0, a, a.ldq);
            for (int x = threadIdx.x; x < kTile; x += blockDim.x)
                L[x] = i0 + x < a.S ? lb[i0 + x] : 0.f, Dt[x] = i0 + x < a.S ? Db[i0 + x] : 0.f;
            __syncthreads();
            for (int r = 0; row && r < kTile && i0 + r < a.S; r++) {
                if (i0 + r < j) continue; /* causal: query i sees key j only when j <= i */
                const float p = expf(dot_row(Q + r * a.hd, kj, a.hd) * a.scale - L[r]);
                const float ds = operand(a, p * (dot_row(dO + r * a.hd, vj, a.hd) - Dt[r]) * a.scale), pv = operand(a, p);
                for (int x = 0; x < a.hd; x++) {
                    dvj[x] = fmaf(pv, dO[r * a.hd + x], dvj[x]);
                    dkj[x] = fmaf(ds, Q[r * a.hd + x], dkj[x]);
                }
            }
        }
    }
    if (row)
        for (int x = 0; x < a.hd; x++) dk[at + x] = dkj[x], dv[at + x] = dvj[x];
}

bool bad_fused_dims(int num_seqs, int S, int H, int KV, int hd) {
    return num_seqs < 0 || S < 0 || H < 1 || KV < 1 || hd < 1 || hd > kMaxHeadDim || H % KV != 0 || num_seqs > 65535 ||
           H > 65535;
}

dim3 grid_of(int S, int heads, int num_seqs) { return dim3((unsigned)((S + kRows - 1) / kRows), (unsigned)heads, (unsigned)num_seqs); }

} // namespace

extern "C" moe_status moe_attention_fused_forward_cuda(moe_gpu *gpu, const float *q, const float *k, const float *v,
                                                       int num_seqs, int seq_len, int num_heads, int num_kv_heads,
                                                       int head_dim, int bf16, float *lse, float *out) {
    if (bad_fused_dims(num_seqs, seq_len, num_heads, num_kv_heads, head_dim) || !q || !k || !v || !lse || !out)
        return MOE_ERR_INVALID_ARG;
    if (num_seqs == 0 || seq_len == 0) return MOE_OK;
    const void *const buffers[] = {q, k, v, out};
    const moe_flash_problem problem = {q, k, v, num_seqs, seq_len, num_heads, num_kv_heads, head_dim};
    if (bf16 && moe_attention_flash_applies(head_dim)) {
        MOE_TRY(moe__attention_flash_aligned(buffers, 4, head_dim));
        return moe__attention_flash_forward(gpu, &problem, lse, out);
    }
    const FusedDims a = fused_dims(seq_len, num_heads, num_kv_heads, head_dim, bf16);
    const size_t smem = 2 * (size_t)kTile * a.hd * sizeof(float);
    fused_forward<<<grid_of(a.S, a.H, num_seqs), kRows, smem, gpu->stream>>>(a, q, k, v, lse, out);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

extern "C" moe_status moe_attention_fused_backward_cuda(moe_gpu *gpu, const float *q, const float *k, const float *v,
                                                        const float *out, const float *lse, const float *dout,
                                                        int num_seqs, int seq_len, int num_heads, int num_kv_heads,
                                                        int head_dim, int bf16, float *dq, float *dk, float *dv) {
    if (bad_fused_dims(num_seqs, seq_len, num_heads, num_kv_heads, head_dim) || !q || !k || !v || !out || !lse ||
        !dout || !dq || !dk || !dv)
        return MOE_ERR_INVALID_ARG;
    if (num_seqs == 0 || seq_len == 0) return MOE_OK;
    const FusedDims a = fused_dims(seq_len, num_heads, num_kv_heads, head_dim, bf16);
    const void *const buffers[] = {q, k, v, dout, dq, dk, dv};
    const moe_flash_problem problem = {q, k, v, num_seqs, seq_len, num_heads, num_kv_heads, head_dim};
    const bool flash = bf16 && moe_attention_flash_applies(head_dim);
    if (flash) MOE_TRY(moe__attention_flash_aligned(buffers, 7, head_dim));
    /* scratch: D [num_seqs, H, S], then the flash kernels' bf16 inputs */
    const size_t d_bytes = ((size_t)num_seqs * a.H * a.S * sizeof(float) + 15) / 16 * 16;
    void *scratch = NULL;
    MOE_TRY(moe_gpu_scratch(gpu, d_bytes + (flash ? moe__attention_flash_backward_scratch(&problem) : 0), &scratch));
    float *D = (float *)scratch;
    fused_row_dots<<<grid_of(a.S, a.H, num_seqs), kRows, 0, gpu->stream>>>(a, out, dout, D);
    MOE_CUDA_LAUNCHED();
    if (flash)
        return moe__attention_flash_backward(gpu, &problem, lse, D, dout, dq, dk, dv, (uint8_t *)scratch + d_bytes);
    const size_t smem = 2 * (size_t)kTile * a.hd * sizeof(float);
    fused_backward_dq<<<grid_of(a.S, a.H, num_seqs), kRows, smem, gpu->stream>>>(a, q, k, v, lse, D, dout, dq);
    MOE_CUDA_LAUNCHED();
    fused_backward_dkv<<<grid_of(a.S, a.KV, num_seqs), kRows, smem + 2 * kTile * sizeof(float), gpu->stream>>>(
        a, q, k, v, lse, D, dout, dk, dv);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}
