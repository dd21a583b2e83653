/* attention_fused_cpu.c — fused causal GQA attention, forward and backward (kernels/attention.h): the materialized
 * attention's function computed in tiles of MOE_ATTENTION_TILE query rows against MOE_ATTENTION_TILE keys with an
 * online softmax (FlashAttention's tiling, Dao et al. 2022, written here from the formulas), so that no [S, S]
 * matrix exists: forward keeps each row's log-sum-exp of its scaled scores, lse [num_seqs, H, S]; backward
 * recomputes each tile's probabilities from q, k and lse. Key tiles after a query tile are skipped (the causal
 * mask makes them zero: about half the products at long sequences). Per row i of a head, with s_j = scale q_i.k_j:
 *   forward, over the key tiles in order:  m' = max(m, max_j s_j);  l = l e^(m - m') + sum_j e^(s_j - m');
 *                                          o = o e^(m - m') + sum_j e^(s_j - m') v_j;  then out_i = o / l,
 *                                          lse_i = m + log l
 *   backward: D_i = dout_i . out_i;  p_ij = e^(s_ij - lse_i);  dv_j += p_ij dout_i;
 *             ds_ij = p_ij (dout_i . v_j - D_i) scale;  dq_i += ds_ij k_j;  dk_j += ds_ij q_i
 * The products are the GEMM engine's (moe__gemm) on tiles. Deterministic: forward splits the (sequence, head)
 * pairs over threads, backward the (sequence, kv head) pairs (a kv head's query heads in order inside one); every
 * output has one writer and a fixed order of additions, whatever the thread count. It differs from the
 * materialized attention by rounding only (tolerance rows "attention fused", tests/test_tolerance.c).
 * bf16 (attention.h): each tile's rows of q, k, v (and dout) are rounded into the thread's scratch as the tile is
 * read, and the products read them there; P and dS are rounded in place before the products that take them.
 * Tested in tests/test_model_kernels.c: against the materialized attention, dq/dk/dv by central differences
 * (float64 build), causality, S not a multiple of the tile, GQA; under bf16 by tests/test_attention_fused.c. */
#include <math.h>
#include <string.h>

#include "core/real.h"
#include "core/threads.h"
#include "kernels/attention.h"
#include "kernels/cast.h"
#include "kernels/row_reduce.h"

typedef struct {
    int S, H, KV, hd, group, ldq, ldk; /* group = H / KV query heads per kv head */
    moe_real scale;                    /* 1 / sqrt(hd) */
    int bf16;                          /* the products' inputs rounded to bf16 (attention.h) */
} fused_dims;

enum { TILE = MOE_ATTENTION_TILE };

static fused_dims fused_dims_of(int S, int H, int KV, int hd, int bf16) {
    return (fused_dims){S, H, KV, hd, H / KV, H * hd, KV * hd, (moe_real)(1 / sqrt((double)hd)), bf16};
}

/* rows of sequence n, query head h (and its kv head) in the [tokens, heads, hd] arrays */
static size_t q_at(const fused_dims *a, int n, int h) { return (size_t)n * a->S * a->ldq + (size_t)h * a->hd; }
static size_t kv_at(const fused_dims *a, int n, int h) {
    return (size_t)n * a->S * a->ldk + (size_t)(h / a->group) * a->hd;
}

/* A thread's scratch: two [TILE, TILE] tiles (P, and dS or the forward's spare), the forward's accumulator
 * [TILE, hd] with its row maxima (or backward's D), then under bf16 the rounded rows of four operand tiles. */
enum { OPERAND_Q, OPERAND_K, OPERAND_V, OPERAND_DOUT, OPERANDS };
static size_t rounded_tiles_at(int hd) { return (size_t)TILE * (2 * TILE + hd + 4); }
size_t moe_attention_fused_scratch_count(int head_dim) {
    return rounded_tiles_at(head_dim) + (size_t)OPERANDS * TILE * head_dim;
}

/* n values rounded to bf16 (kernels/cast.h's rounding), dst may be src */
static void round_bf16(const moe_real *src, int n, moe_real *dst) {
    for (int x = 0; x < n; x++) dst[x] = (moe_real)moe_bf16_round_inline((float)src[x]);
}

/* rows [r0, r0 + rows) of a [tokens, heads, hd] operand as the products read them: in place (fp32), or under bf16
 * rounded into the scratch's tile for `operand` (then with row stride hd) */
typedef struct {
    const moe_real *rows;
    int ld;
} tile_rows;

static tile_rows operand_rows(const fused_dims *a, const moe_real *src, int ld, int r0, int rows, int operand,
                              moe_real *scratch) {
    if (!a->bf16) return (tile_rows){src + (size_t)r0 * ld, ld};
    moe_real *dst = scratch + rounded_tiles_at(a->hd) + (size_t)operand * TILE * a->hd;
    for (int r = 0; r < rows; r++) round_bf16(src + (size_t)(r0 + r) * ld, a->hd, dst + (size_t)r * a->hd);
    return (tile_rows){dst, a->hd};
}

/* scores[r][c] = scale q_r . k_c over a tile's rows of q and keys */
static void tile_scores(const fused_dims *a, tile_rows Q, tile_rows K, int rows, int cols, moe_real *scores) {
    moe__gemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, cols, a->hd, a->scale, Q.rows, Q.ld, K.rows, K.ld, 0,
              scores, TILE);
}

/* valid rounded up to whole lanes (row_reduce.h), at most cols: the elementwise loops run over whole vectors (each
 * element's bits do not depend on that: moe__exp is the same operations in a vector or alone), the elements past
 * valid are then zeroed, and moe_row_dot over the zeros adds +0 to lanes that are >= +0 (the same sum). */
static int whole_lanes(int valid, int cols) {
    const int wide = (valid + MOE_ROW_LANES - 1) / MOE_ROW_LANES * MOE_ROW_LANES;
    return wide < cols ? wide : cols;
}

/* One (sequence, head): out rows and lse, tile by tile. scratch: moe_attention_fused_scratch_count(hd). */
static void forward_head(const fused_dims *a, const moe_real *Q, const moe_real *K, const moe_real *V, moe_real *O,
                         moe_real *lse, moe_real *scratch) {
    moe_real *P = scratch, *acc = scratch + 2 * TILE * TILE, *m = acc + (size_t)TILE * a->hd;
    double l[TILE];
    for (int i0 = 0; i0 < a->S; i0 += TILE) {
        const int i1 = i0 + TILE < a->S ? i0 + TILE : a->S, rows = i1 - i0;
        const tile_rows q = operand_rows(a, Q, a->ldq, i0, rows, OPERAND_Q, scratch);
        memset(acc, 0, (size_t)rows * a->hd * sizeof *acc);
        for (int r = 0; r < rows; r++) m[r] = -INFINITY, l[r] = 0;
        for (int j0 = 0; j0 < i1; j0 += TILE) { /* keys after the query tile: masked, skipped */
            const int j1 = j0 + TILE < i1 ? j0 + TILE : i1, cols = j1 - j0;
            const tile_rows k = operand_rows(a, K, a->ldk, j0, cols, OPERAND_K, scratch);
            const tile_rows v = operand_rows(a, V, a->ldk, j0, cols, OPERAND_V, scratch);
            tile_scores(a, q, k, rows, cols, P);
            for (int r = 0; r < rows; r++) {
                moe_real *p = P + (size_t)r * TILE, new_m = m[r];
                const int valid = i0 + r - j0 + 1 < cols ? i0 + r - j0 + 1 : cols; /* keys j <= i */
                new_m = moe_row_max(p, valid, new_m);
                const moe_real rescale = m[r] == -INFINITY ? 0 : moe__exp(m[r] - new_m);
                const int wide = whole_lanes(valid, cols);
                for (int c = 0; c < wide; c++) p[c] = moe__exp(p[c] - new_m);
                for (int c = valid; c < cols; c++) p[c] = 0;
                l[r] = l[r] * rescale + moe_row_dot(p, NULL, wide), m[r] = new_m;
                if (a->bf16) round_bf16(p, cols, p); /* after its sum: P v takes P in bf16, l the unrounded P */
                moe_real *o = acc + (size_t)r * a->hd;
                for (int x = 0; x < a->hd; x++) o[x] *= rescale;
            }
            moe__gemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, a->hd, cols, 1, P, TILE, v.rows, v.ld, 1, acc,
                      a->hd);
        }
        for (int r = 0; r < rows; r++) {
            const moe_real inv = (moe_real)(1 / l[r]);
            moe_real *out = O + (size_t)(i0 + r) * a->ldq;
            for (int x = 0; x < a->hd; x++) out[x] = acc[(size_t)r * a->hd + x] * inv;
            lse[i0 + r] = m[r] + (moe_real)log(l[r]);
        }
    }
}

void moe_attention_fused_forward_cpu(const moe_real *q, const moe_real *k, const moe_real *v, int num_seqs, int seq_len,
                                     int num_heads, int num_kv_heads, int head_dim, int bf16, moe_real *lse,
                                     moe_real *out, moe_real *scratch) {
    const fused_dims a = fused_dims_of(seq_len, num_heads, num_kv_heads, head_dim, bf16);
    if (a.S == 0) return;
    const int pairs = num_seqs * a.H, blas = moe__blas_serial_begin();
    const size_t per_thread = moe_attention_fused_scratch_count(a.hd);
    MOE__PARALLEL_FOR(pairs > 1,
    for (int nh = 0; nh < pairs; nh++) {
        const int n = nh / a.H, h = nh % a.H;
        forward_head(&a, q + q_at(&a, n, h), k + kv_at(&a, n, h), v + kv_at(&a, n, h), out + q_at(&a, n, h),
                     lse + (size_t)nh * a.S, scratch + (size_t)moe__thread_id() * per_thread);
    });
    moe__blas_serial_end(blas);
}

/* One query head's part of the backward: dq of its rows (overwritten), added into dk and dv of its kv head. */
static void backward_head(const fused_dims *a, const moe_real *Q, const moe_real *K, const moe_real *V,
                          const moe_real *O, const moe_real *lse, const moe_real *dO, moe_real *dQ, moe_real *dK,
                          moe_real *dV, moe_real *scratch) {
    moe_real *P = scratch, *dS = scratch + TILE * TILE, *D = scratch + 2 * TILE * TILE;
    for (int i0 = 0; i0 < a->S; i0 += TILE) {
        const int i1 = i0 + TILE < a->S ? i0 + TILE : a->S, rows = i1 - i0;
        const tile_rows q = operand_rows(a, Q, a->ldq, i0, rows, OPERAND_Q, scratch);
        const tile_rows dout = operand_rows(a, dO, a->ldq, i0, rows, OPERAND_DOUT, scratch);
        for (int r = 0; r < rows; r++) { /* D_i = dout_i . out_i, dout as the products read it */
            D[r] = (moe_real)moe_row_dot(dout.rows + (size_t)r * dout.ld, O + (size_t)(i0 + r) * a->ldq, a->hd);
            memset(dQ + (size_t)(i0 + r) * a->ldq, 0, (size_t)a->hd * sizeof *dQ);
        }
        for (int j0 = 0; j0 < i1; j0 += TILE) {
            const int j1 = j0 + TILE < i1 ? j0 + TILE : i1, cols = j1 - j0;
            const tile_rows k = operand_rows(a, K, a->ldk, j0, cols, OPERAND_K, scratch);
            const tile_rows v = operand_rows(a, V, a->ldk, j0, cols, OPERAND_V, scratch);
            tile_scores(a, q, k, rows, cols, P);
            /* dP = dO_i V_j^T */
            moe__gemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, cols, a->hd, 1, dout.rows, dout.ld, v.rows, v.ld,
                      0, dS, TILE);
            for (int r = 0; r < rows; r++) {
                moe_real *p = P + (size_t)r * TILE, *ds = dS + (size_t)r * TILE;
                const int valid = i0 + r - j0 + 1 < cols ? i0 + r - j0 + 1 : cols;
                const int wide = whole_lanes(valid, cols);
                for (int c = 0; c < wide; c++) p[c] = moe__exp(p[c] - lse[i0 + r]);
                for (int c = 0; c < wide; c++) ds[c] = p[c] * (ds[c] - D[r]) * a->scale;
                for (int c = valid; c < cols; c++) p[c] = 0, ds[c] = 0;
                if (a->bf16) round_bf16(p, cols, p), round_bf16(ds, cols, ds); /* dS formed from the unrounded P */
            }
            /* dV_j += P^T dO_i;  dQ_i += dS K_j;  dK_j += dS^T Q_i */
            moe__gemm(CblasRowMajor, CblasTrans, CblasNoTrans, cols, a->hd, rows, 1, P, TILE, dout.rows, dout.ld, 1,
                      dV + (size_t)j0 * a->ldk, a->ldk);
            moe__gemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, a->hd, cols, 1, dS, TILE, k.rows, k.ld, 1,
                      dQ + (size_t)i0 * a->ldq, a->ldq);
            moe__gemm(CblasRowMajor, CblasTrans, CblasNoTrans, cols, a->hd, rows, 1, dS, TILE, q.rows, q.ld, 1,
                      dK + (size_t)j0 * a->ldk, a->ldk);
        }
    }
}

void moe_attention_fused_backward_cpu(const moe_real *q, const moe_real *k, const moe_real *v, const moe_real *out,
                                      const moe_real *lse, const moe_real *dout, int num_seqs, int seq_len,
                                      int num_heads, int num_kv_heads, int head_dim, int bf16, moe_real *dq,
                                      moe_real *dk, moe_real *dv, moe_real *scratch) {
    const fused_dims a = fused_dims_of(seq_len, num_heads, num_kv_heads, head_dim, bf16);
    const size_t kv_count = (size_t)num_seqs * a.S * a.ldk, per_thread = moe_attention_fused_scratch_count(a.hd);
    memset(dk, 0, kv_count * sizeof(moe_real));
    memset(dv, 0, kv_count * sizeof(moe_real));
    if (a.S == 0) return;
    const int pairs = num_seqs * a.KV, blas = moe__blas_serial_begin();
    MOE__PARALLEL_FOR(pairs > 1,
    for (int nk = 0; nk < pairs; nk++)
        for (int h = nk % a.KV * a.group; h < (nk % a.KV + 1) * a.group; h++) {
            const int n = nk / a.KV;
            const size_t qo = q_at(&a, n, h), ko = kv_at(&a, n, h);
            backward_head(&a, q + qo, k + ko, v + ko, out + qo, lse + ((size_t)n * a.H + h) * a.S, dout + qo, dq + qo,
                          dk + ko, dv + ko, scratch + (size_t)moe__thread_id() * per_thread);
        });
    moe__blas_serial_end(blas);
}
