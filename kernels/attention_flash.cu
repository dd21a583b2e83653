/* attention_flash.cu — the fused causal GQA attention on tensor cores under bf16 (FlashAttention-2's algorithm,
 * Dao 2023, written here from the paper and the PTX ISA): mma.sync.m16n8k16 with bf16 inputs and fp32 accumulation,
 * the online softmax in fp32, causal tiles skipped and the diagonal's masked. The tile plan, the causal schedule and
 * the fragment maps are kernels/flash_tiles.h's (tested on the CPU by tests/test_flash_tiles.c, whose emulation of
 * the forward rounds where this file rounds); the formulas those of kernels/attention_fused_cpu.c.
 *
 * Rounding points (attention.h): q, k, v and dout are rounded to bf16 once, into the copies the kernels read (the
 * CPU's rounding bit for bit, kernels/cast.h); P is rounded when it becomes the A operand of P v (the row sums l
 * keep the fp32 P), and of dV += P^T dout; dS = P (dP - D) scale when it becomes the operand of dQ += dS k and
 * dK += dS^T q. Scores, the row maxima and sums, lse, D and every accumulator are fp32.
 *
 * Kernels (one CTA per tile; tiles by head_dim alone, never by S or the batch, and no split of the keys: a row's
 * bits depend on its own sequence only, docs/DETERMINISM.md):
 *   forward  grid (query tiles, H, sequences), block_m / 16 warps of 16 query rows: Q's fragments kept in
 *            registers; per key tile, S = Q K^T, the online softmax on the accumulators (each lane holds two rows,
 *            its quad the rest of them: maxima by shuffles), O = O c + P V with P's accumulators reused as the A
 *            fragments (two n8 tiles of C are one k16 tile of A). Writes out and lse = m + log l.
 *   dQ       grid (query tiles, H, sequences): per key tile, S and dP = dO V^T, dS, dQ += dS K, in key order.
 *   dK/dV    grid (key tiles, KV, sequences), block_n / 16 warps of 16 keys: per query head of the kv head's group
 *            in increasing order, per query tile from the first that sees the key tile, in chunks of kQueryChunk
 *            queries: S^T = K Q^T, dP^T = V dO^T, dV += P^T dO, dK += dS^T Q. No atomics anywhere: every output
 *            element has one writer and a fixed order of additions.
 * Inputs: bf16 copies of q, k, v and dout (cast_inputs, once a call), copied into shared memory by cp.async, the next
 * key tile (forward, dQ) or (head, query tile) (dK/dV) loading into a second stage while the current one is used.
 * Shared memory rows are head_dim + kPad bf16 apart, so the 8 rows an ldmatrix phase reads fall in distinct banks.
 * Checked: tests/test_gpu_dense_table.c (against the CPU's fused attention under bf16, and a sequence's bits alone
 * and among others), the build's tests/test_flash_build.sh (no register spills, mma in the PTX), and without a GPU
 * tests/test_flash_emulated.cc: this file's kernels compiled for the host with -DMOE_SIMT_HOST, their lanes run by
 * kernels/simt_host.h (the instructions below to their definitions), against the CPU's fused attention. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef MOE_SIMT_HOST
#include "kernels/simt_host.h"
#else
#include "core/gpu_cuda.h"
#include "kernels/attention_flash.cuh"
#include "kernels/cast_device.cuh"

extern "C" {
#include "kernels/attention.h"
#include "kernels/cast.h"
#include "kernels/flash_tiles.h"
}
#endif

namespace {

constexpr int kPad = 8;         /* bf16 elements after each shared row: 16 bytes, a bank group */
constexpr int kQueryChunk = 32; /* the dK/dV kernel's queries per step of a warp (bounds its registers) */
constexpr unsigned kFull = 0xffffffffu;

template <int HD>
struct Plan {
    static constexpr int BM = MOE_FLASH_BLOCK_M(HD), BN = MOE_FLASH_BLOCK_N(HD);
    static constexpr int LD = HD + kPad; /* a shared row, bf16 elements */
    static constexpr int KC = HD / 16;   /* k16 chunks of a head's row */
    static_assert(HD % 16 == 0 && BM % kQueryChunk == 0, "tiles");
};

struct FlashDims {
    int S, H, group, ldq, ldk;
    float scale; /* 1 / sqrt(hd), rounded as on the CPU */
};

/* ---- the instructions (on the host: kernels/simt_host.h's models of them) ---- */

#ifdef MOE_SIMT_HOST
inline void ldmatrix_x4(uint32_t r[4], const uint16_t *p) { moe_simt::ldmatrix_x4(r, p, false); }
inline void ldmatrix_x4_trans(uint32_t r[4], const uint16_t *p) { moe_simt::ldmatrix_x4(r, p, true); }
inline void mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) { moe_simt::mma_bf16(c, a, b0, b1); }
inline uint16_t *shared_tiles() { return moe_simt::shared_memory<uint16_t>(); }
inline void cp_async16(void *dst, const void *src, bool valid) { moe_simt::cp_async16(dst, src, valid); }
inline void cp_async_commit() { moe_simt::cp_async_commit(); }
template <int N>
inline void cp_async_wait() { moe_simt::cp_async_wait(N); }
#else
/* the block's dynamic shared memory */
__device__ __forceinline__ uint16_t *shared_tiles() {
    extern __shared__ __align__(16) uint16_t flash_shared[];
    return flash_shared;
}

__device__ __forceinline__ uint32_t shared_address(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* four 8 x 8 b16 matrices: lanes 8m .. 8m + 7 give matrix m's row addresses; register m gets thread t's elements
 * (row t / 4, columns 2 (t % 4) and + 1), or with .trans (rows 2 (t % 4) and + 1, column t / 4) */
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const uint16_t *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_address(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const uint16_t *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_address(p)));
}

/* c += a b: a 16 x 16 (row), b 16 x 8 (col), bf16; c 16 x 8 fp32 (fragments: flash_tiles.h) */
__device__ __forceinline__ void mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* 16 bytes from global to shared memory without passing through registers, in the background: they land by the
 * cp_async_wait that covers their commit group. valid false: 16 zero bytes (src-size 0; nothing is read). */
__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst)), "l"(src),
                 "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
/* wait until at most N of this thread's commit groups are still in flight */
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
#endif

/* ---- fragments from a shared tile T (row stride LD), at the lanes' addresses of flash_tiles.h ----
 * A of rows [r0, r0 + 16) x columns [c0, c0 + 16) */
template <int LD>
__device__ __forceinline__ void load_a(uint32_t a[4], const uint16_t *T, int r0, int c0, int lane) {
    int row, col;
    moe_flash_ldmatrix_a(lane, &row, &col);
    ldmatrix_x4(a, T + (r0 + row) * LD + c0 + col);
}
/* B of two n8 tiles, T stored [n][k] (a row of T is a column of B: K for q k^T): n rows [n0, n0 + 16), k columns
 * [k0, k0 + 16); b[0], b[1] the tile n0 .. n0 + 7, b[2], b[3] the tile n0 + 8 .. n0 + 15 */
template <int LD>
__device__ __forceinline__ void load_b_rows_n(uint32_t b[4], const uint16_t *T, int n0, int k0, int lane) {
    int row, col;
    moe_flash_ldmatrix_b_nk(lane, &row, &col);
    ldmatrix_x4(b, T + (n0 + row) * LD + k0 + col);
}
/* B of two n8 tiles, T stored [k][n] (V for P v): k rows [k0, k0 + 16), n columns [n0, n0 + 16), transposed by
 * ldmatrix; the same registers as load_b_rows_n */
template <int LD>
__device__ __forceinline__ void load_b_rows_k(uint32_t b[4], const uint16_t *T, int k0, int n0, int lane) {
    int row, col;
    moe_flash_ldmatrix_b_kn(lane, &row, &col);
    ldmatrix_x4_trans(b, T + (k0 + row) * LD + n0 + col);
}

/* The A fragment of k16 chunk kc from accumulators c (n8 tiles 2 kc and 2 kc + 1 of a 16-row C), rounded to bf16:
 * A's element 4 t + e is element e of C tile 2 kc + t (flash_tiles.h), two elements a register, the lower one in
 * the low half. */
__device__ __forceinline__ void c_to_a(uint32_t a[4], const float (*c)[4], int kc) {
#pragma unroll
    for (int r = 0; r < 4; r++) {
        const int lo = 2 * r, hi = 2 * r + 1;
        a[r] = moe_cuda::bf16_pack2(c[2 * kc + moe_flash_c_tile_of_a(lo)][moe_flash_c_element_of_a(lo)],
                                    c[2 * kc + moe_flash_c_tile_of_a(hi)][moe_flash_c_element_of_a(hi)]);
    }
}

/* ---- staging ---- */

/* rows [r0, r0 + ROWS) of a bf16 [tokens, heads, hd] array (row stride ld elements, at base) into T, asynchronously,
 * 16 bytes a copy (base and ld aligned: the dispatch checks); rows at or past S are zeros. The caller commits and
 * waits (cp_async_commit, cp_async_wait) and then synchronises the block before anyone reads T. */
template <int ROWS, int HD>
__device__ __forceinline__ void stage_rows(uint16_t *T, const uint16_t *base, int r0, int S, int ld) {
    constexpr int LD = Plan<HD>::LD, STEPS = HD / 8;
    for (int x = threadIdx.x; x < ROWS * STEPS; x += blockDim.x) {
        const int r = x / STEPS, c = x % STEPS * 8;
        const bool valid = r0 + r < S;
        cp_async16(T + r * LD + c, valid ? base + (size_t)(r0 + r) * ld + c : base, valid);
    }
}

/* key tile j of K and V into a stage: K's rows, then V's */
template <int HD>
__device__ __forceinline__ void stage_kv(uint16_t *stage, const uint16_t *kb, const uint16_t *vb, int j,
                                         const FlashDims &a) {
    using P = Plan<HD>;
    stage_rows<P::BN, HD>(stage, kb, j * P::BN, a.S, a.ldk);
    stage_rows<P::BN, HD>(stage + P::BN * P::LD, vb, j * P::BN, a.S, a.ldk);
}

/* the maximum or the sum over a quad of lanes (the four that hold a C row) */
__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(kFull, x, 1));
    return fmaxf(x, __shfl_xor_sync(kFull, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(kFull, x, 1);
    return x + __shfl_xor_sync(kFull, x, 2);
}

/* s = A B^T over a head's row for a warp's 16 rows of A (rows r0.. of As) against N rows of Bs (from n0): N / 8
 * accumulators, zeroed first */
template <int HD, int N>
__device__ __forceinline__ void scores(float (*s)[4], const uint16_t *As, int r0, const uint16_t *Bs, int n0,
                                       int lane) {
    constexpr int LD = Plan<HD>::LD;
#pragma unroll
    for (int t = 0; t < N / 8; t++) s[t][0] = s[t][1] = s[t][2] = s[t][3] = 0.f;
#pragma unroll
    for (int kc = 0; kc < Plan<HD>::KC; kc++) {
        uint32_t a[4];
        load_a<LD>(a, As, r0, kc * 16, lane);
#pragma unroll
        for (int np = 0; np < N / 16; np++) {
            uint32_t b[4];
            load_b_rows_n<LD>(b, Bs, n0 + np * 16, kc * 16, lane);
            mma(s[2 * np], a, b[0], b[1]);
            mma(s[2 * np + 1], a, b[2], b[3]);
        }
    }
}

/* acc (16 x HD) += P Bs, P the warp's 16 x K accumulators p (rounded to bf16 here), Bs rows k0 .. k0 + K - 1 */
template <int HD, int K>
__device__ __forceinline__ void accumulate(float (*acc)[4], const float (*p)[4], const uint16_t *Bs, int k0,
                                           int lane) {
    constexpr int LD = Plan<HD>::LD;
#pragma unroll
    for (int kc = 0; kc < K / 16; kc++) {
        uint32_t a[4];
        c_to_a(a, p, kc);
#pragma unroll
        for (int np = 0; np < HD / 16; np++) {
            uint32_t b[4];
            load_b_rows_k<LD>(b, Bs, k0 + kc * 16, np * 16, lane);
            mma(acc[2 * np], a, b[0], b[1]);
            mma(acc[2 * np + 1], a, b[2], b[3]);
        }
    }
}

/* a warp's 16 x HD accumulators into rows of a [tokens, heads, hd] array (rows at or past S skipped), times scale */
template <int HD>
__device__ __forceinline__ void store_rows(float *base, const float (*acc)[4], int row0, int S, int ld,
                                           const float *scale, int lane) {
    const int group = lane / 4, pair = lane % 4;
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int row = row0 + group + 8 * half;
        if (row >= S) continue;
        float *dst = base + (size_t)row * ld + 2 * pair;
#pragma unroll
        for (int t = 0; t < HD / 8; t++)
            *reinterpret_cast<float2 *>(dst + 8 * t) =
                make_float2(acc[t][2 * half] * scale[half], acc[t][2 * half + 1] * scale[half]);
    }
}

/* ---- the kernels ---- */

template <int HD>
__global__ void __launch_bounds__(Plan<HD>::BM / 16 * 32)
    flash_forward(FlashDims a, const uint16_t *q, const uint16_t *k, const uint16_t *v, float *lse, float *out) {
    using P = Plan<HD>;
    uint16_t *smem = shared_tiles();
    uint16_t *Qs = smem, *KV = Qs + P::BM * P::LD; /* Q, then two stages of [K; V] */
    const moe_flash_tiles tiles = moe_flash_tiles_for(HD);
    const int i = gridDim.x - 1 - blockIdx.x; /* the longest query tiles first */
    const int h = blockIdx.y, n = blockIdx.z, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int group = lane / 4, pair = lane % 4, r0 = 16 * warp, row0 = i * P::BM + r0;
    const uint16_t *qb = q + (size_t)n * a.S * a.ldq + (size_t)h * HD;
    const size_t kv_at = (size_t)n * a.S * a.ldk + (size_t)(h / a.group) * HD;
    stage_rows<P::BM, HD>(Qs, qb, i * P::BM, a.S, a.ldq);
    stage_kv<HD>(KV, k + kv_at, v + kv_at, 0, a);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    uint32_t qf[P::KC][4];
#pragma unroll
    for (int kc = 0; kc < P::KC; kc++) load_a<P::LD>(qf[kc], Qs, r0, kc * 16, lane);
    float o[HD / 8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
#pragma unroll
    for (int t = 0; t < HD / 8; t++) o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.f;
    const int key_tiles = moe_flash_key_tiles(tiles, a.S, i);
    for (int j = 0; j < key_tiles; j++) {
        /* the next key tile loads into the other stage while this one is used (its readers, at j - 1, are done) */
        if (j + 1 < key_tiles) stage_kv<HD>(KV + ((j + 1) & 1) * 2 * P::BN * P::LD, k + kv_at, v + kv_at, j + 1, a);
        cp_async_commit();
        const uint16_t *Ks = KV + (j & 1) * 2 * P::BN * P::LD, *Vs = Ks + P::BN * P::LD;
        float s[P::BN / 8][4];
#pragma unroll
        for (int t = 0; t < P::BN / 8; t++) s[t][0] = s[t][1] = s[t][2] = s[t][3] = 0.f;
#pragma unroll
        for (int kc = 0; kc < P::KC; kc++)
#pragma unroll
            for (int np = 0; np < P::BN / 16; np++) {
                uint32_t b[4];
                load_b_rows_n<P::LD>(b, Ks, np * 16, kc * 16, lane);
                mma(s[2 * np], qf[kc], b[0], b[1]);
                mma(s[2 * np + 1], qf[kc], b[2], b[3]);
            }
        const bool masked = moe_flash_tile_masked(tiles, i, j);
        float top[2] = {m[0], m[1]};
#pragma unroll
        for (int t = 0; t < P::BN / 8; t++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int row = row0 + group + 8 * (e / 2), key = j * P::BN + 8 * t + 2 * pair + e % 2;
                const float x = masked && key > row ? -INFINITY : s[t][e] * a.scale;
                s[t][e] = x, top[e / 2] = fmaxf(top[e / 2], x);
            }
        float rescale[2];
#pragma unroll
        for (int half = 0; half < 2; half++) {
            top[half] = quad_max(top[half]);
            rescale[half] = m[half] == -INFINITY ? 0.f : __expf(m[half] - top[half]);
            m[half] = top[half];
        }
        float sum[2] = {0.f, 0.f}; /* this lane's columns; the quad's are added at the end */
#pragma unroll
        for (int t = 0; t < P::BN / 8; t++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float base = m[e / 2] == -INFINITY ? 0.f : m[e / 2];
                s[t][e] = __expf(s[t][e] - base), sum[e / 2] += s[t][e];
            }
#pragma unroll
        for (int half = 0; half < 2; half++) l[half] = l[half] * rescale[half] + sum[half];
#pragma unroll
        for (int t = 0; t < HD / 8; t++)
#pragma unroll
            for (int e = 0; e < 4; e++) o[t][e] *= rescale[e / 2];
        accumulate<HD, P::BN>(o, s, Vs, 0, lane);
        cp_async_wait<0>();
        __syncthreads(); /* the next stage landed for every thread, and every warp is done with this one */
    }
    float inv[2];
#pragma unroll
    for (int half = 0; half < 2; half++) {
        l[half] = quad_sum(l[half]), inv[half] = 1.f / l[half];
        const int row = row0 + group + 8 * half;
        if (pair == 0 && row < a.S) lse[((size_t)n * a.H + h) * a.S + row] = m[half] + logf(l[half]);
    }
    store_rows<HD>(out + (size_t)n * a.S * a.ldq + (size_t)h * HD, o, row0, a.S, a.ldq, inv, lane);
}

/* P and dS of a C tile from scores s and dP (in place: s becomes P, dp becomes dS); row r of the tile at query
 * `query_of(t, e)` and key `key_of(t, e)`, its lse and D from lse_of / D_of. P is 0 past the causal mask and for
 * queries at or past S (whose lse and D are not there). */
template <int TILES, typename Query, typename Key, typename Lse, typename Delta>
__device__ __forceinline__ void probabilities(float (*s)[4], float (*dp)[4], bool masked, int S, float scale,
                                              Query query_of, Key key_of, Lse lse_of, Delta D_of) {
#pragma unroll
    for (int t = 0; t < TILES; t++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int query = query_of(t, e), key = key_of(t, e);
            const bool off = query >= S || (masked && key > query);
            const float p = off ? 0.f : __expf(s[t][e] * scale - lse_of(t, e));
            s[t][e] = p, dp[t][e] = p * (dp[t][e] - D_of(t, e)) * scale;
        }
}

template <int HD>
__global__ void __launch_bounds__(Plan<HD>::BM / 16 * 32)
    flash_backward_dq(FlashDims a, const uint16_t *q, const uint16_t *k, const uint16_t *v, const float *lse,
                      const float *D, const uint16_t *dout, float *dq) {
    using P = Plan<HD>;
    uint16_t *smem = shared_tiles();
    uint16_t *Qs = smem, *dOs = Qs + P::BM * P::LD, *KV = dOs + P::BM * P::LD; /* two stages of [K; V] */
    const moe_flash_tiles tiles = moe_flash_tiles_for(HD);
    const int i = gridDim.x - 1 - blockIdx.x;
    const int h = blockIdx.y, n = blockIdx.z, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int group = lane / 4, pair = lane % 4, r0 = 16 * warp, row0 = i * P::BM + r0;
    const size_t q_at = (size_t)n * a.S * a.ldq + (size_t)h * HD, stat_at = ((size_t)n * a.H + h) * a.S;
    const size_t kv_at = (size_t)n * a.S * a.ldk + (size_t)(h / a.group) * HD;
    stage_rows<P::BM, HD>(Qs, q + q_at, i * P::BM, a.S, a.ldq);
    stage_rows<P::BM, HD>(dOs, dout + q_at, i * P::BM, a.S, a.ldq);
    stage_kv<HD>(KV, k + kv_at, v + kv_at, 0, a);
    cp_async_commit();
    float row_lse[2], row_D[2];
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int row = row0 + group + 8 * half;
        row_lse[half] = row < a.S ? lse[stat_at + row] : 0.f, row_D[half] = row < a.S ? D[stat_at + row] : 0.f;
    }
    float acc[HD / 8][4];
#pragma unroll
    for (int t = 0; t < HD / 8; t++) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.f;
    const int key_tiles = moe_flash_key_tiles(tiles, a.S, i);
    cp_async_wait<0>();
    __syncthreads();
    for (int j = 0; j < key_tiles; j++) {
        if (j + 1 < key_tiles) stage_kv<HD>(KV + ((j + 1) & 1) * 2 * P::BN * P::LD, k + kv_at, v + kv_at, j + 1, a);
        cp_async_commit();
        const uint16_t *Ks = KV + (j & 1) * 2 * P::BN * P::LD, *Vs = Ks + P::BN * P::LD;
        float s[P::BN / 8][4], dp[P::BN / 8][4];
        scores<HD, P::BN>(s, Qs, r0, Ks, 0, lane);
        scores<HD, P::BN>(dp, dOs, r0, Vs, 0, lane);
        probabilities<P::BN / 8>(
            s, dp, moe_flash_tile_masked(tiles, i, j), a.S, a.scale,
            [&](int, int e) { return row0 + group + 8 * (e / 2); },
            [&](int t, int e) { return j * P::BN + 8 * t + 2 * pair + e % 2; },
            [&](int, int e) { return row_lse[e / 2]; }, [&](int, int e) { return row_D[e / 2]; });
        accumulate<HD, P::BN>(acc, dp, Ks, 0, lane); /* dQ += dS K */
        cp_async_wait<0>();
        __syncthreads();
    }
    const float one[2] = {1.f, 1.f};
    store_rows<HD>(dq + q_at, acc, row0, a.S, a.ldq, one, lane);
}

/* The dK/dV kernel's shared memory: K and V, then STAGES stages of [Q; dO; lse; D] of a query tile. */
template <int HD, int STAGES>
struct DkvLayout {
    using P = Plan<HD>;
    static constexpr size_t kTiles = 2 * (size_t)P::BN * P::LD;                       /* bf16 elements */
    static constexpr size_t kStage = 2 * (size_t)P::BM * P::LD + 2 * P::BM * 2;       /* bf16 elements */
    static constexpr size_t kBytes = (kTiles + STAGES * kStage) * sizeof(uint16_t);
};

/* STAGES 2: the next (head, query tile)'s Q, dO and statistics load while this one's are used; 1 where two stages do
 * not fit a block's shared memory (head_dim 128 on sm_80: 174 KB) */
template <int HD, int STAGES>
__global__ void __launch_bounds__(Plan<HD>::BN / 16 * 32)
    flash_backward_dkv(FlashDims a, const uint16_t *q, const uint16_t *k, const uint16_t *v, const float *lse,
                       const float *D, const uint16_t *dout, float *dk, float *dv) {
    using P = Plan<HD>;
    using L = DkvLayout<HD, STAGES>;
    uint16_t *smem = shared_tiles();
    uint16_t *Ks = smem, *Vs = Ks + P::BN * P::LD;
    const moe_flash_tiles tiles = moe_flash_tiles_for(HD);
    const int j = blockIdx.x, g = blockIdx.y, n = blockIdx.z, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int group = lane / 4, pair = lane % 4, c0 = 16 * warp, key0 = j * P::BN + c0;
    const size_t kv_at = (size_t)n * a.S * a.ldk + (size_t)g * HD;
    const int query_tiles = moe_flash_tiles_over(a.S, P::BM), first = moe_flash_first_query_tile(tiles, j);
    const int per_head = query_tiles - first, steps = a.group * per_head; /* (query head, query tile) in order */
    /* step t's (head, query tile) into stage t % STAGES: Q and dO asynchronously, lse and D by plain loads */
    auto stage_queries = [&](int t) {
        uint16_t *Qs = smem + L::kTiles + (t % STAGES) * L::kStage, *dOs = Qs + P::BM * P::LD;
        float *Ls = reinterpret_cast<float *>(dOs + P::BM * P::LD), *Ds = Ls + P::BM;
        const int h = g * a.group + t / per_head, i = first + t % per_head;
        const size_t q_at = (size_t)n * a.S * a.ldq + (size_t)h * HD, stat_at = ((size_t)n * a.H + h) * a.S;
        stage_rows<P::BM, HD>(Qs, q + q_at, i * P::BM, a.S, a.ldq);
        stage_rows<P::BM, HD>(dOs, dout + q_at, i * P::BM, a.S, a.ldq);
        for (int x = threadIdx.x; x < P::BM; x += blockDim.x) {
            const int query = i * P::BM + x;
            Ls[x] = query < a.S ? lse[stat_at + query] : 0.f, Ds[x] = query < a.S ? D[stat_at + query] : 0.f;
        }
    };
    stage_rows<P::BN, HD>(Ks, k + kv_at, j * P::BN, a.S, a.ldk);
    stage_rows<P::BN, HD>(Vs, v + kv_at, j * P::BN, a.S, a.ldk);
    stage_queries(0);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    float dk_acc[HD / 8][4], dv_acc[HD / 8][4];
#pragma unroll
    for (int t = 0; t < HD / 8; t++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk_acc[t][e] = dv_acc[t][e] = 0.f;
    for (int t = 0; t < steps; t++) {
        if (STAGES == 2 && t + 1 < steps) stage_queries(t + 1); /* its stage's readers (step t - 1) are done */
        cp_async_commit();
        const uint16_t *Qs = smem + L::kTiles + (t % STAGES) * L::kStage, *dOs = Qs + P::BM * P::LD;
        const float *Ls = reinterpret_cast<const float *>(dOs + P::BM * P::LD), *Ds = Ls + P::BM;
        const int i = first + t % per_head;
        const bool masked = moe_flash_tile_masked(tiles, i, j);
        for (int chunk = 0; chunk < P::BM; chunk += kQueryChunk) {
            /* transposed tiles: rows are the warp's 16 keys, columns the chunk's queries */
            float s[kQueryChunk / 8][4], dp[kQueryChunk / 8][4];
            scores<HD, kQueryChunk>(s, Ks, c0, Qs, chunk, lane);
            scores<HD, kQueryChunk>(dp, Vs, c0, dOs, chunk, lane);
            const int q0 = i * P::BM + chunk;
            probabilities<kQueryChunk / 8>(
                s, dp, masked, a.S, a.scale, [&](int tt, int e) { return q0 + 8 * tt + 2 * pair + e % 2; },
                [&](int, int e) { return key0 + group + 8 * (e / 2); },
                [&](int tt, int e) { return Ls[chunk + 8 * tt + 2 * pair + e % 2]; },
                [&](int tt, int e) { return Ds[chunk + 8 * tt + 2 * pair + e % 2]; });
            accumulate<HD, kQueryChunk>(dv_acc, s, dOs, chunk, lane); /* dV += P^T dO */
            accumulate<HD, kQueryChunk>(dk_acc, dp, Qs, chunk, lane); /* dK += dS^T Q */
        }
        if (STAGES == 1 && t + 1 < steps) {
            __syncthreads(); /* every warp is done with the one stage */
            stage_queries(t + 1);
            cp_async_commit();
        }
        cp_async_wait<0>();
        __syncthreads(); /* the next stage landed for every thread (and, with two, every warp is done with this one) */
    }
    const float one[2] = {1.f, 1.f};
    store_rows<HD>(dk + kv_at, dk_acc, key0, a.S, a.ldk, one, lane);
    store_rows<HD>(dv + kv_at, dv_acc, key0, a.S, a.ldk, one, lane);
}

FlashDims flash_dims(int S, int H, int KV, int hd) {
    FlashDims a;
    a.S = S, a.H = H, a.group = H / KV, a.ldq = H * hd, a.ldk = KV * hd;
    a.scale = (float)(1 / sqrt((double)hd));
    return a;
}

#ifndef MOE_SIMT_HOST
FlashDims dims_of(const moe_flash_problem &p) { return flash_dims(p.S, p.H, p.KV, p.hd); }

/* A kernel's dynamic shared memory above the default 48 KiB needs the function's consent first. */
template <typename Kernel>
moe_status allow_shared(Kernel kernel, size_t bytes) {
    MOE_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    return MOE_OK;
}

/* The inputs as the kernels read them: bf16 copies, cast in scratch (kernels/cast.h's rounding: the CPU's, bit for
 * bit, so the results are those of rounding as the tiles are staged), each 16-byte aligned. Reading bf16 halves the
 * bytes of every re-read of K and V (once per query tile) and lets cp.async copy rows into shared memory as they are. */
struct Inputs {
    const uint16_t *q, *k, *v, *dout;
};

size_t aligned_bytes(size_t values) { return (values * sizeof(uint16_t) + 15) / 16 * 16; }

/* the values of q, k, v and dout, in cast_inputs's order */
void input_counts(const moe_flash_problem &p, size_t count[4]) {
    const size_t nq = (size_t)p.num_seqs * p.S * p.H * p.hd, nkv = (size_t)p.num_seqs * p.S * p.KV * p.hd;
    count[0] = nq, count[1] = nkv, count[2] = nkv, count[3] = nq;
}

size_t inputs_bytes(const moe_flash_problem &p, bool with_dout) {
    size_t count[4], bytes = 0;
    input_counts(p, count);
    for (int i = 0; i < (with_dout ? 4 : 3); i++) bytes += aligned_bytes(count[i]);
    return bytes;
}

moe_status cast_inputs(moe_gpu *gpu, const moe_flash_problem &p, const float *dout, void *scratch, Inputs *in) {
    size_t count[4];
    input_counts(p, count);
    uint8_t *at = (uint8_t *)scratch;
    const float *src[4] = {p.q, p.k, p.v, dout};
    const uint16_t **dst[4] = {&in->q, &in->k, &in->v, &in->dout};
    in->dout = NULL;
    for (int i = 0; i < (dout ? 4 : 3); i++) {
        MOE_TRY(moe_cast_f32_to_bf16_cuda(gpu, src[i], count[i], (moe_bf16 *)at));
        *dst[i] = (const uint16_t *)at, at += aligned_bytes(count[i]);
    }
    return MOE_OK;
}

template <int HD>
moe_status forward(moe_gpu *gpu, const moe_flash_problem &p, float *lse, float *out) {
    using P = Plan<HD>;
    void *scratch = NULL;
    Inputs in;
    MOE_TRY(moe_gpu_scratch(gpu, inputs_bytes(p, false), &scratch));
    MOE_TRY(cast_inputs(gpu, p, NULL, scratch, &in));
    const size_t bytes = (size_t)(P::BM + 4 * P::BN) * P::LD * sizeof(uint16_t); /* Q, two stages of K and V */
    MOE_TRY(allow_shared(flash_forward<HD>, bytes));
    const dim3 grid((unsigned)moe_flash_tiles_over(p.S, P::BM), (unsigned)p.H, (unsigned)p.num_seqs);
    flash_forward<HD><<<grid, P::BM / 16 * 32, bytes, gpu->stream>>>(dims_of(p), in.q, in.k, in.v, lse, out);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

template <int HD, int STAGES>
moe_status launch_dkv(moe_gpu *gpu, const moe_flash_problem &p, const Inputs &in, const float *lse, const float *D,
                      float *dk, float *dv) {
    using P = Plan<HD>;
    const size_t bytes = DkvLayout<HD, STAGES>::kBytes;
    MOE_TRY(allow_shared(flash_backward_dkv<HD, STAGES>, bytes));
    const dim3 grid((unsigned)moe_flash_tiles_over(p.S, P::BN), (unsigned)p.KV, (unsigned)p.num_seqs);
    flash_backward_dkv<HD, STAGES><<<grid, P::BN / 16 * 32, bytes, gpu->stream>>>(dims_of(p), in.q, in.k, in.v, lse, D,
                                                                                  in.dout, dk, dv);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

template <int HD>
moe_status backward(moe_gpu *gpu, const moe_flash_problem &p, const float *lse, const float *D, const float *dout,
                    float *dq, float *dk, float *dv, void *scratch) {
    using P = Plan<HD>;
    Inputs in;
    MOE_TRY(cast_inputs(gpu, p, dout, scratch, &in));
    const size_t dq_bytes = (size_t)(2 * P::BM + 4 * P::BN) * P::LD * sizeof(uint16_t); /* Q, dO, two K/V stages */
    MOE_TRY(allow_shared(flash_backward_dq<HD>, dq_bytes));
    const dim3 dq_grid((unsigned)moe_flash_tiles_over(p.S, P::BM), (unsigned)p.H, (unsigned)p.num_seqs);
    flash_backward_dq<HD><<<dq_grid, P::BM / 16 * 32, dq_bytes, gpu->stream>>>(dims_of(p), in.q, in.k, in.v, lse, D,
                                                                              in.dout, dq);
    MOE_CUDA_LAUNCHED();
    /* two stages where they fit this GPU's shared memory per block (the arithmetic is the same either way);
     * MOE_FLASH_DKV_STAGES=1 forces one, a timing experiment: at head_dim 128 two stages take 172 KB, one block of 4
     * warps per SM, one stage 105 KB, two blocks (gpu_check.sh --more, attention_dkv1) */
    int most = 0;
    MOE_CUDA_TRY(cudaDeviceGetAttribute(&most, cudaDevAttrMaxSharedMemoryPerBlockOptin, gpu->device));
    const char *stages = getenv("MOE_FLASH_DKV_STAGES");
    if (DkvLayout<HD, 2>::kBytes <= (size_t)most && !(stages && !strcmp(stages, "1")))
        return launch_dkv<HD, 2>(gpu, p, in, lse, D, dk, dv);
    return launch_dkv<HD, 1>(gpu, p, in, lse, D, dk, dv);
}

#endif

} // namespace

#ifndef MOE_SIMT_HOST

extern "C" int moe_attention_flash_applies(int head_dim) {
    const char *off = getenv("MOE_FLASH_ATTENTION"); /* "0": the plain kernels (a diagnosis, docs/GPU.md) */
    if (off && !strcmp(off, "0")) return 0;
    return head_dim == 32 || head_dim == 64 || head_dim == 128;
}

extern "C" moe_status moe__attention_flash_aligned(const void *const *pointers, int count, int head_dim) {
    for (int i = 0; i < count; i++)
        if (!moe_cuda::aligned16(pointers[i]))
            return moe_fail(MOE_ERR_INVALID_ARG, "the flash attention (head_dim %d) needs its buffers 16-byte aligned; "
                            "buffer %d of %d is at %p", head_dim, i + 1, count, pointers[i]);
    return MOE_OK;
}

extern "C" moe_status moe__attention_flash_forward(moe_gpu *gpu, const moe_flash_problem *p, float *lse, float *out) {
    switch (p->hd) {
    case 32: return forward<32>(gpu, *p, lse, out);
    case 64: return forward<64>(gpu, *p, lse, out);
    case 128: return forward<128>(gpu, *p, lse, out);
    default: return moe_fail(MOE_ERR_INVALID_ARG, "flash attention: head_dim %d has no tile plan here", p->hd);
    }
}

extern "C" size_t moe__attention_flash_backward_scratch(const moe_flash_problem *p) { return inputs_bytes(*p, true); }

extern "C" moe_status moe__attention_flash_backward(moe_gpu *gpu, const moe_flash_problem *p, const float *lse,
                                                    const float *D, const float *dout, float *dq, float *dk,
                                                    float *dv, void *scratch) {
    switch (p->hd) {
    case 32: return backward<32>(gpu, *p, lse, D, dout, dq, dk, dv, scratch);
    case 64: return backward<64>(gpu, *p, lse, D, dout, dq, dk, dv, scratch);
    case 128: return backward<128>(gpu, *p, lse, D, dout, dq, dk, dv, scratch);
    default: return moe_fail(MOE_ERR_INVALID_ARG, "flash attention: head_dim %d has no tile plan here", p->hd);
    }
}
#endif
