/* expert_ffn.cu — the SwiGLU experts on the GPU (experts/expert_ffn.h): bf16 weights and activations, fp32
 * accumulation, fp32 weight gradients. Per local expert e with rows X_e = xp[offset[e] : offset[e+1]] (n_e):
 *   forward   H13_e = X_e W13_e^T [n_e, 2f]   act_e = silu(H1) * H3 [n_e, f]   Y_e = act_e W2_e^T [n_e, d]
 *   backward  dA_e = dY_e W2_e [n_e, f]   dH13_e = swiglu' (fused kernel)   dX_e = dH13_e W13_e [n_e, d]
 *             dW2_e += dY_e^T act_e   dW1_e += dH13_e[:, :f]^T X_e   dW3_e += dH13_e[:, f:]^T X_e
 *
 * cuBLAS is column-major: a row-major [r, c] matrix with row stride c is the column-major [c, r] matrix
 * with ld = c, its transpose. So a row GEMM C[n, m] = X[n, k] op(W) is computed as C^T = op'(W) X^T with
 * m x n_e x k, X^T as B (op N, ldb = k) and C^T as C (ldc = m); W is [m, k] (C = X W^T: op T, lda = k) or
 * [k, m] (C = X W: op N, lda = m). A weight gradient dW[o, i] += dY[n, o]^T X[n, i] is dW^T[i, o] = X^T dY:
 * m = i, n = o, k = n_e, A = X (op N, lda = its row stride), B = dY (op T, ldb = its row stride); the
 * halves of dH13 are the [f]-wide column blocks of rows of stride 2f (ldb = 2f, the second at + f).
 *
 * Segments (expert_ffn.h): with segments > 1 each weight gradient is one GEMM per segment into a scratch leaf
 * (beta = 0), the leaves added by moe_add_cuda in the steps of core/tree_schedule.h, the very schedule the CPU
 * follows: S GEMMs or memsets and S additions per expert and projection instead of one GEMM. An fp32 addition
 * is rounded once on either side, so given the same leaves the GPU's sum has the CPU's bits; the leaves
 * themselves are cuBLAS's.
 *
 * MOE_EXPERT_GEMM_GROUPED: one cublasGemmGroupedBatchedEx per row projection (H13, Y, dA, dX), one group of
 * one problem per expert with rows; m/n/k/ld/trans/alpha/beta/group_size are host arrays, the A/B/C
 * pointer arrays live in device memory (the context's scratch), as the cuBLAS documentation requires.
 * The grouped API's type table (cuBLAS 13.1, CUBLAS_COMPUTE_32F) has A/B/C all bf16, all fp16 or all fp32,
 * and no bf16 inputs with an fp32 output: the weight gradients (bf16 inputs, fp32 C) therefore run as
 * cublasGemmEx calls per expert, projection (and segment) in both modes.
 * Grouped mode falls back to per-expert calls for an op whose matrices are not all 16-byte aligned (widths
 * not multiples of 8): the grouped API's alignment rules for bf16 (see prepare) are stricter than GemmEx's.
 * MOE_EXPERT_GEMM_PER_EXPERT: one cublasGemmEx per expert and projection.
 * MOE_EXPERT_GEMM_ROW_BLOCKS (layout invariance): the row projections per expert in kernels/linear_gemms.h's fixed
 * blocks of MOE_GEMM_ROW_BLOCK rows, the last one padded through two bf16 buffers in the context's scratch, so every
 * call has one shape whatever the expert's rows (cuBLAS chooses its kernel, and so a row's sums, by shape: an expert
 * with 37 rows on one rank and 19 on another would get other bits); given the scratch, one segment's weight gradients
 * as a leaf (beta 0) added into the gradient too.
 * MOE_EXPERT_GEMM_LT (layout invariance in one call): C_e = X_e op(W_e) as the row-major product D[M, N] = A op_b(B)
 * of kernels/gemm_lt.h with M = n_e, A = X_e [n_e, k], B = W_e (op T: W_e [m, k], trans_b 1; op N: W_e [k, m],
 * trans_b 0), N = m, K = k, bf16 D: one cublasLtMatmul per expert with the context's pinned algorithm for the shape.
 * Rows of k and m values (multiples of 8) are 16-byte units, so every expert's operands start 16-byte aligned and
 * the rows need no padding; a projection whose widths are not, or whose shape has no pinned algorithm (or one needing
 * more than 16 bytes of alignment), runs in row blocks: decided by the shape, never by the rows.
 *
 * Math mode: the context's handle is CUBLAS_PEDANTIC_MATH (fp32 GEMMs stay fp32), which also keeps bf16
 * GEMMs off the tensor cores. The bf16 GEMMs here ask for them explicitly: for the duration of an op the
 * handle is switched to CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION (split-K
 * partial sums stay fp32 even when C is bf16) and restored before returning.
 *
 * Checked by tests/test_gpu_experts.cu (suite gpu) against moe_expert_ffn_forward_cpu / _backward_cpu. */
#include <stdlib.h>

#include <algorithm>

#include "core/gpu_cuda.h"

#include "kernels/cast_device.cuh"

extern "C" {
#include "experts/expert_ffn.h"
#include "core/tree_schedule.h"
#include "kernels/cast.h"
#include "kernels/elementwise.h"
#include "kernels/gemm_lt.h"
#include "kernels/gemm_rows.h"
#include "kernels/linear_gemms.h"
}

namespace {

using moe_cuda::load_bf16;
using moe_cuda::store_bf16;

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 65535;

/* ---- weights ---- */

/* w13[e] = [w1[e]; w3[e]] in bf16: E x [2f, d] from two [E, f, d]. */
__global__ void pack_w13_kernel(const float *w1, const float *w3, size_t half, size_t total, uint16_t *w13) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        size_t e = i / (2 * half), r = i - e * 2 * half;
        float v = r < half ? w1[e * half + r] : w3[e * half + (r - half)];
        w13[i] = moe_cuda::bf16_bits(v);
    }
}

/* ---- the fused SwiGLU (one block per row) ---- */

__device__ __forceinline__ float sigmoid(float h) { return 1.0f / (1.0f + expf(-h)); }

/* act[r] = silu(h1) * h3, h13[r] = [h1 | h3]; evaluated as (h1 * s) * h3, the order of the CPU. */
template <int V>
__global__ void swiglu_forward_kernel(const uint16_t *h13, int f, uint16_t *act) {
    const uint16_t *h = h13 + (size_t)blockIdx.x * 2 * f;
    uint16_t *a = act + (size_t)blockIdx.x * f;
    for (int c = threadIdx.x * V; c < f; c += blockDim.x * V) {
        float h1[V], h3[V], out[V];
        load_bf16<V>(h + c, h1);
        load_bf16<V>(h + f + c, h3);
        for (int i = 0; i < V; i++) out[i] = h1[i] * sigmoid(h1[i]) * h3[i];
        store_bf16<V>(a + c, out);
    }
}

/* dh13[r] = [dh1 | dh3]: dh3 = dA h1 s, dh1 = dA h3 s (1 + h1 (1 - s)), s = sigmoid(h1) (expert_ffn_cpu.c). */
template <int V>
__global__ void swiglu_backward_kernel(const uint16_t *h13, const uint16_t *dact, int f, uint16_t *dh13) {
    const uint16_t *h = h13 + (size_t)blockIdx.x * 2 * f, *da = dact + (size_t)blockIdx.x * f;
    uint16_t *dh = dh13 + (size_t)blockIdx.x * 2 * f;
    for (int c = threadIdx.x * V; c < f; c += blockDim.x * V) {
        float h1[V], h3[V], dA[V], dh1[V], dh3[V];
        load_bf16<V>(h + c, h1);
        load_bf16<V>(h + f + c, h3);
        load_bf16<V>(da + c, dA);
        for (int i = 0; i < V; i++) {
            float s = sigmoid(h1[i]);
            dh3[i] = dA[i] * h1[i] * s;
            dh1[i] = dA[i] * h3[i] * s * (1.0f + h1[i] * (1.0f - s));
        }
        store_bf16<V>(dh + c, dh1);
        store_bf16<V>(dh + f + c, dh3);
    }
}

/* ---- cuBLAS ---- */

const float kOne = 1.0f, kZero = 0.0f;

/* Runs body() with the handle in tensor-op math (why: the file comment), then restores the mode. */
template <typename Body>
moe_status with_bf16_math(moe_gpu *gpu, Body body) {
    cublasMath_t saved;
    MOE_CUBLAS_TRY(cublasGetMathMode(gpu->blas, &saved));
    MOE_CUBLAS_TRY(cublasSetMathMode(
        gpu->blas, (cublasMath_t)(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
    moe_status st = body();
    MOE_CUBLAS_TRY(cublasSetMathMode(gpu->blas, saved));
    return st;
}

/* One row projection over all experts: C_e[n_e, m] = X_e[n_e, k] op(W_e), bf16 in and out (file comment). */
struct row_gemm {
    cublasOperation_t trans_w; /* CUBLAS_OP_T: W_e is [m, k] (C = X W^T); CUBLAS_OP_N: W_e is [k, m] (C = X W) */
    int m, k;
    const uint16_t *w; /* expert e's matrix at w + e * m * k */
    const uint16_t *x; /* rows of width k */
    uint16_t *c;       /* rows of width m */
    int ldw() const { return trans_w == CUBLAS_OP_T ? k : m; }
};

/* The row projections of one op in either mode. In grouped mode, prepare() uploads the device pointer
 * arrays of all `count` projections in one copy into the context's scratch (valid for this op: nothing
 * else takes the scratch before the op's last GEMM is queued) and keeps the host arrays, one group of one
 * problem per expert with rows, until the op ends. Expert e's rows start at start[e * stride] (the expert
 * offsets, stride 1, or the first of its `stride` segments), and start[E * stride] is the end of the rows. */
class expert_gemms {
  public:
    expert_gemms(moe_gpu *gpu, moe_expert_gemm_mode mode, int num_experts, const int *start, int stride)
        : gpu_(gpu), mode_(mode), num_experts_(num_experts), start_(start), stride_(stride) {}
    ~expert_gemms() { free(host_); }
    expert_gemms(const expert_gemms &) = delete;
    expert_gemms &operator=(const expert_gemms &) = delete;

    moe_status prepare(const row_gemm *gemms, int count);
    moe_status run(int i);

  private:
    static constexpr int kMaxGemms = 2; /* an op's row projections */
    moe_status pin(const row_gemm *gemms, int count);
    moe_status run_blocks(const row_gemm &r, int e);
    const moe_gemm_lt *lt_[kMaxGemms] = {}; /* LT mode: projection i's pinned GEMM; NULL: its row blocks */
    uint16_t *pad_in_ = nullptr, *pad_out_ = nullptr; /* row blocks: [MOE_GEMM_ROW_BLOCK, widest] each */
    moe_gpu *gpu_;
    moe_expert_gemm_mode mode_;
    int num_experts_;
    const int *start_;
    int stride_;
    int offset(int e) const { return start_[(size_t)e * stride_]; }
    const row_gemm *gemms_ = nullptr;
    int groups_ = 0;
    void *host_ = nullptr;
    /* host, per group g: */
    int *expert_ = nullptr, *n_ = nullptr, *size_ = nullptr;
    float *alpha_ = nullptr, *beta_ = nullptr;
    cublasOperation_t *trans_n_ = nullptr;
    /* host, per projection i and group g at [i * groups + g] */
    cublasOperation_t *trans_w_ = nullptr;
    int *m_ = nullptr, *k_ = nullptr, *ldw_ = nullptr;
    /* device: [count][3][groups] pointers (A = W_e, B = X_e, C = C_e) */
    void **dev_ptrs_ = nullptr;
};

/* LT mode: each projection's pinned GEMM from the context's set, where its shape allows one (file comment). */
moe_status expert_gemms::pin(const row_gemm *gemms, int count) {
    moe_gemm_lt_set *set = nullptr;
    MOE_TRY(moe_gemm_lt_context_set(gpu_, &set));
    for (int i = 0; i < count; i++) {
        const row_gemm &r = gemms[i];
        if (r.m % 8 || r.k % 8) continue; /* rows that are not whole 16-byte units: row blocks */
        const moe_gemm_lt_shape shape = {0, r.trans_w == CUBLAS_OP_T, r.m, r.k, MOE_GEMM_LT_BF16, 1};
        const moe_gemm_lt *g = nullptr;
        MOE_TRY(moe_gemm_lt_set_get(gpu_, set, &shape, &g));
        if (!g || moe_gemm_lt_alignment(g) > 16) continue;
        /* the buffers are the runtime's allocations, rows of whole 16-byte units in: never misaligned but by a bug,
         * which must not change the bits quietly by running the blocks instead */
        if (!moe_cuda::aligned16(r.w) || !moe_cuda::aligned16(r.x) || !moe_cuda::aligned16(r.c))
            return moe_fail(MOE_ERR_INVALID_ARG, "experts: the rows or weights of a projection (%d x %d) are not "
                                                 "16-byte aligned (%p, %p, %p)", r.m, r.k, (const void *)r.x,
                            (const void *)r.w, (const void *)r.c);
        lt_[i] = g;
    }
    return MOE_OK;
}

moe_status expert_gemms::prepare(const row_gemm *gemms, int count) {
    gemms_ = gemms;
    if (count > kMaxGemms) return MOE_ERR_INVALID_ARG;
    if (moe_expert_gemm_rows_invariant(mode_)) { /* the padded block's two buffers in the context's scratch */
        int widest = 1;
        for (int i = 0; i < count; i++) widest = std::max(widest, std::max(gemms[i].m, gemms[i].k));
        const size_t pad = (size_t)MOE_GEMM_ROW_BLOCK * widest;
        void *scratch = nullptr;
        MOE_TRY(moe_gpu_scratch(gpu_, 2 * pad * sizeof(uint16_t), &scratch));
        pad_in_ = (uint16_t *)scratch, pad_out_ = pad_in_ + pad;
        return mode_ == MOE_EXPERT_GEMM_LT ? pin(gemms, count) : MOE_OK;
    }
    if (mode_ != MOE_EXPERT_GEMM_GROUPED) return MOE_OK;
    groups_ = 0;
    for (int e = 0; e < num_experts_; e++) groups_ += offset(e + 1) > offset(e);
    if (groups_ == 0) return MOE_OK;
    const size_t G = groups_, P = (size_t)count * 3 * G;
    size_t nbytes = G * (3 * sizeof(int) + 2 * sizeof(float) + sizeof(cublasOperation_t)) +
                    (size_t)count * G * (sizeof(cublasOperation_t) + 3 * sizeof(int)) + P * sizeof(void *);
    host_ = malloc(nbytes);
    if (!host_) return MOE_ERR_OUT_OF_MEMORY;
    /* pointers first (8-byte aligned), then the 4-byte arrays */
    void **ptrs = (void **)host_;
    char *p = (char *)(ptrs + P);
    expert_ = (int *)p, p += G * sizeof(int);
    n_ = (int *)p, p += G * sizeof(int);
    size_ = (int *)p, p += G * sizeof(int);
    alpha_ = (float *)p, p += G * sizeof(float);
    beta_ = (float *)p, p += G * sizeof(float);
    trans_n_ = (cublasOperation_t *)p, p += G * sizeof(cublasOperation_t);
    trans_w_ = (cublasOperation_t *)p, p += count * G * sizeof(cublasOperation_t);
    m_ = (int *)p, p += count * G * sizeof(int);
    k_ = (int *)p, p += count * G * sizeof(int);
    ldw_ = (int *)p;
    for (int e = 0, g = 0; e < num_experts_; e++) {
        if (offset(e + 1) == offset(e)) continue;
        expert_[g] = e, n_[g] = offset(e + 1) - offset(e), size_[g] = 1;
        alpha_[g] = 1.0f, beta_[g] = 0.0f, trans_n_[g] = CUBLAS_OP_N;
        g++;
    }
    for (int i = 0; i < count; i++) {
        const row_gemm &r = gemms[i];
        const size_t wcount = (size_t)r.m * r.k;
        void **a = ptrs + (size_t)i * 3 * G, **b = a + G, **c = b + G;
        for (size_t g = 0; g < G; g++) {
            const size_t e = expert_[g], row0 = offset((int)e);
            a[g] = (void *)(r.w + e * wcount);
            b[g] = (void *)(r.x + row0 * r.k);
            c[g] = (void *)(r.c + row0 * r.m);
            trans_w_[i * G + g] = r.trans_w, m_[i * G + g] = r.m, k_[i * G + g] = r.k, ldw_[i * G + g] = r.ldw();
        }
    }
    /* bf16 grouped GEMMs want 16-byte aligned matrices (cuBLAS docs: else misaligned-access faults unless
     * k-dependent rules hold); widths that break it (not multiples of 8) go one expert at a time instead */
    for (size_t i = 0; i < P; i++)
        if (!moe_cuda::aligned16(ptrs[i])) {
            mode_ = MOE_EXPERT_GEMM_PER_EXPERT;
            return MOE_OK;
        }
    void *scratch = nullptr;
    MOE_TRY(moe_gpu_scratch(gpu_, P * sizeof(void *), &scratch));
    dev_ptrs_ = (void **)scratch;
    /* from pageable memory: staged before the call returns (CUDA's API synchronisation behaviour); host_
     * stays allocated until the op returns in any case */
    MOE_CUDA_TRY(cudaMemcpyAsync(dev_ptrs_, ptrs, P * sizeof(void *), cudaMemcpyHostToDevice, gpu_->stream));
    return MOE_OK;
}

moe_status expert_gemms::run(int i) {
    const row_gemm &r = gemms_[i];
    if (mode_ == MOE_EXPERT_GEMM_GROUPED) {
        if (groups_ == 0) return MOE_OK;
        const size_t G = groups_;
        void **a = dev_ptrs_ + (size_t)i * 3 * G, **b = a + G, **c = b + G;
        /* per-projection arrays at [i * G]; ldb = k and ldc = m are the k and m arrays themselves */
        cublasOperation_t *tw = trans_w_ + i * G;
        int *m = m_ + i * G, *k = k_ + i * G, *ldw = ldw_ + i * G;
        MOE_CUBLAS_TRY(cublasGemmGroupedBatchedEx(gpu_->blas, tw, trans_n_, m, n_, k, alpha_, (const void *const *)a,
                                                  CUDA_R_16BF, ldw, (const void *const *)b, CUDA_R_16BF, k, beta_,
                                                  (void *const *)c, CUDA_R_16BF, m, groups_, size_,
                                                  CUBLAS_COMPUTE_32F));
        return MOE_OK;
    }
    const size_t wcount = (size_t)r.m * r.k;
    for (int e = 0; e < num_experts_; e++) {
        const int n = offset(e + 1) - offset(e);
        if (n == 0) continue;
        const size_t row0 = offset(e);
        if (mode_ == MOE_EXPERT_GEMM_LT && lt_[i]) {
            MOE_TRY(moe_gemm_lt_run(gpu_, lt_[i], n, r.x + row0 * r.k, r.w + e * wcount, 0, r.c + row0 * r.m));
            continue;
        }
        if (moe_expert_gemm_rows_invariant(mode_)) {
            MOE_TRY(run_blocks(r, e));
            continue;
        }
        MOE_CUBLAS_TRY(cublasGemmEx(gpu_->blas, r.trans_w, CUBLAS_OP_N, r.m, n, r.k, &kOne, r.w + e * wcount,
                                    CUDA_R_16BF, r.ldw(), r.x + row0 * r.k, CUDA_R_16BF, r.k, &kZero,
                                    r.c + row0 * r.m, CUDA_R_16BF, r.m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
    return MOE_OK;
}

/* Expert e's rows of projection r in kernels/linear_gemms.h's fixed row blocks, bf16: C = X W^T (W [m, k]) is the
 * linear's forward of in k, out m; C = X W (W [k, m]) its input gradient of in m, out k (beta 0). A padded block's
 * rows go through pad_in_ (zeros after them) and come back from pad_out_. */
moe_status expert_gemms::run_blocks(const row_gemm &r, int e) {
    const bool forward = r.trans_w == CUBLAS_OP_T;
    const moe__lin_product product = forward ? MOE__LIN_FORWARD : MOE__LIN_BACKWARD_INPUT;
    const int in = forward ? r.k : r.m, out = forward ? r.m : r.k, n = offset(e + 1) - offset(e);
    const size_t row0 = offset(e), elem = sizeof(uint16_t);
    uint16_t *arrays[MOE__LIN_ARRAYS] = {};
    arrays[MOE__LIN_W] = const_cast<uint16_t *>(r.w) + (size_t)e * r.m * r.k;
    arrays[forward ? MOE__LIN_X : MOE__LIN_DY] = const_cast<uint16_t *>(r.x) + row0 * r.k;
    arrays[forward ? MOE__LIN_Y : MOE__LIN_DX] = r.c + row0 * r.m;
    arrays[MOE__LIN_PAD_IN] = pad_in_, arrays[MOE__LIN_PAD_OUT] = pad_out_;
    for (int i = 0; i < moe__linear_gemm_count(product, n, 1); i++) {
        const moe__lin_gemm g = moe__linear_gemm(product, n, in, out, 1, 0, i);
        if (g.padded) {
            const uint16_t *from = arrays[g.token_in] + (size_t)g.first_row * g.ldb;
            MOE_CUDA_TRY(cudaMemcpyAsync(pad_in_, from, (size_t)g.rows * g.ldb * elem, cudaMemcpyDeviceToDevice,
                                         gpu_->stream));
            MOE_CUDA_TRY(cudaMemsetAsync(pad_in_ + (size_t)g.rows * g.ldb, 0, (size_t)(g.n - g.rows) * g.ldb * elem,
                                         gpu_->stream));
        }
        MOE_CUBLAS_TRY(cublasGemmEx(gpu_->blas, g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                                    g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, g.m, g.n, g.k, &kOne, arrays[g.a] + g.a_off,
                                    CUDA_R_16BF, g.lda, arrays[g.b] + g.b_off, CUDA_R_16BF, g.ldb, &kZero,
                                    arrays[g.c] + g.c_off, CUDA_R_16BF, g.ldc, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT));
        if (g.padded)
            MOE_CUDA_TRY(cudaMemcpyAsync(arrays[g.token_out] + (size_t)g.first_row * g.ldc, pad_out_,
                                         (size_t)g.rows * g.ldc * elem, cudaMemcpyDeviceToDevice, gpu_->stream));
    }
    return MOE_OK;
}

/* One weight gradient's product over rows [r, r + n) of one expert, dW^T [m, o] (op) = A^T B with A = rows of
 * width m (lda) and B = rows of width o (ldb), fp32 C [m, o] with ldc = m (file comment): into C with beta. */
struct wgrad_product {
    int m, o;           /* dW is [o, m] row-major */
    const uint16_t *a;  /* from the expert's first row */
    int lda;
    const uint16_t *b;  /* from the expert's first row */
    int ldb;
};

moe_status wgrad_gemm(moe_gpu *gpu, const wgrad_product &p, size_t row, int n, const float *beta, float *c) {
    MOE_CUBLAS_TRY(cublasGemmEx(gpu->blas, CUBLAS_OP_N, CUBLAS_OP_T, p.m, p.o, n, &kOne, p.a + row * p.lda,
                                CUDA_R_16BF, p.lda, p.b + row * p.ldb, CUDA_R_16BF, p.ldb, beta, c, CUDA_R_32F, p.m,
                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return MOE_OK;
}

/* dW += the sum over the expert's segments (seg[0..segments]) of their products, in tree_schedule.h's steps: a leaf
 * is one GEMM with beta 0 into its buffer (a zeroed buffer for an empty segment), an addition one moe_add_cuda,
 * all queued on the one stream in step order, so a buffer is reused only after the steps reading it. */
moe_status add_segment_products(moe_gpu *gpu, const wgrad_product &p, const int *seg, int segments, float *dW,
                                float *scratch) {
    const size_t count = (size_t)p.m * p.o, nbytes = count * sizeof(float);
    auto buffer = [&](int b) { return b == MOE_TREE_OUT ? dW : scratch + count * (size_t)(b - 1); };
    moe_tree_step steps[MOE_TREE_MAX_STEPS];
    for (int sg = 0; sg <= segments; sg++) {
        const int n = moe_tree_schedule_steps(segments, sg, steps);
        if (n < 0) return MOE_ERR_INVALID_ARG;
        for (int i = 0; i < n; i++) {
            const moe_tree_step &st = steps[i];
            float *y = buffer(st.dst);
            if (st.segment < 0) {
                MOE_TRY(moe_add_cuda(gpu, buffer(st.left), buffer(st.right), count, y));
                continue;
            }
            const int rows = seg[st.segment + 1] - seg[st.segment];
            if (rows) MOE_TRY(wgrad_gemm(gpu, p, (size_t)(seg[st.segment] - seg[0]), rows, &kZero, y));
            else MOE_CUDA_TRY(cudaMemsetAsync(y, 0, nbytes, gpu->stream));
        }
    }
    return MOE_OK;
}

/* dW2_e += dY_e^T act_e, dW1_e += dH1_e^T X_e, dW3_e += dH3_e^T X_e: fp32 C, per expert with rows; one product
 * over all its rows with beta = 1 (segments == 1, without leaves) or per segment in the tree (add_segment_products;
 * leaves: for one segment too, so that the GEMM is a beta-0 leaf whatever the number of segments). */
moe_status weight_grads(moe_gpu *gpu, int num_experts, int d, int f, const int *segment_start, int segments,
                        bool leaves, const uint16_t *xp, const uint16_t *act, const uint16_t *dy, const uint16_t *dh13,
                        moe_layer_weights *grads, float *scratch) {
    const size_t wcount = (size_t)f * d;
    for (int e = 0; e < num_experts; e++) {
        const int *seg = segment_start + (size_t)e * segments;
        const int n = seg[segments] - seg[0];
        if (n == 0) continue;
        const size_t r0 = seg[0];
        const uint16_t *X = xp + r0 * d, *A = act + r0 * f, *dY = dy + r0 * d, *dH = dh13 + r0 * 2 * f;
        /* dW2^T [f, d] = act^T [f, n] (dY^T [d, n])^T; dW1^T [d, f] = X^T [d, n] (dH1^T [f, n], ld 2f)^T, dW3 the
         * same from dH13 + f */
        const wgrad_product products[3] = {{f, d, A, f, dY, d}, {d, f, X, d, dH, 2 * f}, {d, f, X, d, dH + f, 2 * f}};
        float *dW[3] = {grads->w2 + e * wcount, grads->w1 + e * wcount, grads->w3 + e * wcount};
        for (int i = 0; i < 3; i++) {
            if (segments == 1 && !leaves) MOE_TRY(wgrad_gemm(gpu, products[i], 0, n, &kOne, dW[i]));
            else MOE_TRY(add_segment_products(gpu, products[i], seg, segments, dW[i], scratch));
        }
    }
    return MOE_OK;
}

/* offset: [E * stride + 1] row starts (expert offsets with stride 1, segment starts with stride = segments) */
moe_status check_layout(int num_experts, int d, int f, const int *offset, int stride = 1) {
    if (num_experts < 1 || d < 1 || f < 1 || stride < 1 || !offset || offset[0] < 0) return MOE_ERR_INVALID_ARG;
    for (size_t i = 0; i < (size_t)num_experts * stride; i++)
        if (offset[i + 1] < offset[i]) return MOE_ERR_INVALID_ARG;
    return MOE_OK;
}

bool swiglu_vector_ok(int f, const void *a, const void *b, const void *c = nullptr) {
    return f % 8 == 0 && moe_cuda::aligned16(a) && moe_cuda::aligned16(b) && (!c || moe_cuda::aligned16(c));
}

} // namespace

extern "C" moe_status moe_expert_weights_to_bf16_cuda(moe_gpu *gpu, const moe_layer_weights *w, int num_experts,
                                                      int d_model, int d_ff, moe_expert_weights_bf16 *out) {
    if (!w || !out || num_experts < 1 || d_model < 1 || d_ff < 1) return MOE_ERR_INVALID_ARG;
    const size_t half = (size_t)d_ff * d_model, total = (size_t)num_experts * 2 * half;
    size_t blocks = (total + kThreads - 1) / kThreads;
    pack_w13_kernel<<<blocks > (size_t)kMaxBlocks ? kMaxBlocks : (int)blocks, kThreads, 0, gpu->stream>>>(
        w->w1, w->w3, half, total, out->w13);
    MOE_CUDA_LAUNCHED();
    return moe_cast_f32_to_bf16_cuda(gpu, w->w2, (size_t)num_experts * half, out->w2);
}

extern "C" moe_status moe_swiglu_forward_cuda(moe_gpu *gpu, const moe_bf16 *h13, int rows, int d_ff, moe_bf16 *act) {
    if (rows < 0 || d_ff < 1) return MOE_ERR_INVALID_ARG;
    if (rows == 0) return MOE_OK;
    if (swiglu_vector_ok(d_ff, h13, act))
        swiglu_forward_kernel<8><<<rows, moe_cuda::row_block_threads(d_ff / 8), 0, gpu->stream>>>(h13, d_ff, act);
    else
        swiglu_forward_kernel<1><<<rows, moe_cuda::row_block_threads(d_ff), 0, gpu->stream>>>(h13, d_ff, act);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

extern "C" moe_status moe_swiglu_backward_cuda(moe_gpu *gpu, const moe_bf16 *h13, const moe_bf16 *dact, int rows,
                                               int d_ff, moe_bf16 *dh13) {
    if (rows < 0 || d_ff < 1) return MOE_ERR_INVALID_ARG;
    if (rows == 0) return MOE_OK;
    if (swiglu_vector_ok(d_ff, h13, dact, dh13))
        swiglu_backward_kernel<8><<<rows, moe_cuda::row_block_threads(d_ff / 8), 0, gpu->stream>>>(h13, dact, d_ff,
                                                                                                    dh13);
    else
        swiglu_backward_kernel<1><<<rows, moe_cuda::row_block_threads(d_ff), 0, gpu->stream>>>(h13, dact, d_ff, dh13);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

extern "C" moe_status moe_expert_ffn_forward_cuda(moe_gpu *gpu, moe_expert_gemm_mode mode,
                                                  const moe_expert_weights_bf16 *w, int num_experts, int d_model,
                                                  int d_ff, const int *expert_offset, const moe_bf16 *xp, moe_bf16 *h13,
                                                  moe_bf16 *act, moe_bf16 *y) {
    MOE_TRY(check_layout(num_experts, d_model, d_ff, expert_offset));
    const int r0 = expert_offset[0], rows = expert_offset[num_experts] - r0, f = d_ff;
    if (rows == 0) return MOE_OK;
    const row_gemm gemms[2] = {
        {CUBLAS_OP_T, 2 * f, d_model, w->w13, xp, h13}, /* H13 = X W13^T */
        {CUBLAS_OP_T, d_model, f, w->w2, act, y},        /* Y = act W2^T  */
    };
    expert_gemms run(gpu, mode, num_experts, expert_offset, 1);
    MOE_TRY(run.prepare(gemms, y ? 2 : 1)); /* y NULL: the intermediates only */
    return with_bf16_math(gpu, [&]() -> moe_status {
        MOE_TRY(run.run(0));
        MOE_TRY(moe_swiglu_forward_cuda(gpu, h13 + (size_t)r0 * 2 * f, rows, f, act + (size_t)r0 * f));
        return y ? run.run(1) : MOE_OK;
    });
}

extern "C" moe_status moe_expert_ffn_backward_cuda(moe_gpu *gpu, moe_expert_gemm_mode mode,
                                                   const moe_expert_weights_bf16 *w, moe_layer_weights *grads,
                                                   int num_experts, int d_model, int d_ff, const int *segment_start,
                                                   int segments, const moe_bf16 *xp, const moe_bf16 *h13,
                                                   const moe_bf16 *act, const moe_bf16 *dy, moe_bf16 *dh13,
                                                   moe_bf16 *dact, moe_bf16 *dxp, float *wgrad_scratch) {
    MOE_TRY(check_layout(num_experts, d_model, d_ff, segment_start, segments));
    if (segments > 1 && !wgrad_scratch) return MOE_ERR_INVALID_ARG;
    const bool leaves = moe_expert_gemm_rows_invariant(mode) && wgrad_scratch; /* one segment's too (expert_ffn.h) */
    const int r0 = segment_start[0], rows = segment_start[(size_t)num_experts * segments] - r0, f = d_ff;
    if (rows == 0) return MOE_OK;
    const row_gemm gemms[2] = {
        {CUBLAS_OP_N, f, d_model, w->w2, dy, dact},       /* dA = dY W2    (W2 is [d, f])  */
        {CUBLAS_OP_N, d_model, 2 * f, w->w13, dh13, dxp}, /* dX = dH13 W13 (W13 is [2f, d]) */
    };
    expert_gemms run(gpu, mode, num_experts, segment_start, segments);
    MOE_TRY(run.prepare(gemms, 2));
    return with_bf16_math(gpu, [&]() -> moe_status {
        MOE_TRY(run.run(0));
        MOE_TRY(moe_swiglu_backward_cuda(gpu, h13 + (size_t)r0 * 2 * f, dact + (size_t)r0 * f, rows, f,
                                         dh13 + (size_t)r0 * 2 * f));
        MOE_TRY(run.run(1));
        return weight_grads(gpu, num_experts, d_model, f, segment_start, segments, leaves, xp, act, dy, dh13, grads,
                            wgrad_scratch);
    });
}
