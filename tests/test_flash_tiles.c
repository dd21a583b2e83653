/* test_flash_tiles.c — the tensor-core flash attention's tile plan (kernels/flash_tiles.h; issue 50, items 1 and 6)
 * checked on the CPU, before any GPU runs it:
 *   - the mma.m16n8k16 fragment maps: A's 8 elements a lane cover the 16 x 16 tile exactly once over the 32 lanes,
 *     B's and C's 4 their 16 x 8 tiles; the kernels' ldmatrix addresses, run through the instruction's definition,
 *     deliver exactly those fragments (A; two B tiles from [n][k] and, transposed, from [k][n]), and two C tiles'
 *     accumulators are one A fragment where the kernels take them as one (P of P v, dS);
 *   - the causal schedule, for head_dim 32 to 256 and sequence lengths around the tiles' edges: the forward's (and
 *     dQ's) tiles by query tile and the dK/dV kernel's by key tile are the same tiles, every causal pair (key <= query
 *     < S) falls in exactly one of them, a skipped tile holds no causal pair, and a tile is marked masked exactly when
 *     it holds a pair with key > query;
 *   - the forward tile algorithm at the kernel's rounding points (Q, K, V and P in bf16, scores, the online softmax and
 *     the output accumulated in fp32; grouped-query heads), emulated over those tiles, against an fp64 attention of
 *     the same bf16 inputs: within 4e-3 of max|V| (P's bf16 rounding, 2^-9 relative, is the error; a tile skipped or
 *     masked wrongly is off by O(1): the check can fail).
 * Run: meson test -C build test_flash_tiles (suite unit). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cast.h"
#include "kernels/flash_tiles.h"
#include "tests/test_util.h"

static void fragment_maps(void) {
    int a[16][16] = {{0}}, b[16][8] = {{0}}, c[16][8] = {{0}};
    for (int lane = 0; lane < 32; lane++) {
        for (int e = 0; e < 8; e++) {
            int r, col;
            moe_flash_frag_a(lane, e, &r, &col);
            CHECK(r >= 0 && r < 16 && col >= 0 && col < 16, "A lane %d element %d at (%d, %d)", lane, e, r, col);
            if (r >= 0 && r < 16 && col >= 0 && col < 16) a[r][col]++;
        }
        for (int e = 0; e < 4; e++) {
            int k, n, r, col;
            moe_flash_frag_b(lane, e, &k, &n);
            moe_flash_frag_c(lane, e, &r, &col);
            if (k >= 0 && k < 16 && n >= 0 && n < 8) b[k][n]++;
            if (r >= 0 && r < 16 && col >= 0 && col < 8) c[r][col]++;
        }
    }
    int once = 1;
    for (int r = 0; r < 16; r++)
        for (int col = 0; col < 16; col++) once &= a[r][col] == 1 && (col >= 8 || (b[r][col] == 1 && c[r][col] == 1));
    CHECK(once, "a fragment map covers its tile other than once");
}

/* The tile position (row, col) that ldmatrix.x4 gives lane t in register m, half h (0: the low 16 bits), when each
 * lane points at `address(lane)` (PTX ISA: lanes 8 m .. 8 m + 7 address matrix m's rows; without .trans lane t gets
 * row t / 4, columns 2 (t % 4) + h; with .trans rows 2 (t % 4) + h, column t / 4). */
typedef void (*lane_address)(int lane, int *row, int *col);
static void ldmatrix_element(lane_address address, int trans, int t, int m, int h, int *row, int *col) {
    const int source = 8 * m + (trans ? 2 * (t % 4) + h : t / 4); /* the lane that gave the matrix row */
    address(source, row, col);
    *col += trans ? t / 4 : 2 * (t % 4) + h;
}

/* The kernel's ldmatrix addresses (flash_tiles.h) deliver the mma fragments of the maps above, and the accumulators
 * of two C tiles are an A fragment as moe_flash_c_*_of_a say. */
static void ldmatrix_maps(void) {
    int bad = 0;
    for (int t = 0; t < 32; t++)
        for (int m = 0; m < 4; m++)
            for (int h = 0; h < 2; h++) {
                int row, col, want_row, want_col, k, n;
                ldmatrix_element(moe_flash_ldmatrix_a, 0, t, m, h, &row, &col); /* A's element 2 m + h */
                moe_flash_frag_a(t, 2 * m + h, &want_row, &want_col);
                bad += row != want_row || col != want_col;
                /* B: registers 0, 1 the first n8 tile's elements 0-3, registers 2, 3 the second's (n + 8) */
                moe_flash_frag_b(t, 2 * (m % 2) + h, &k, &n);
                n += 8 * (m / 2);
                ldmatrix_element(moe_flash_ldmatrix_b_nk, 0, t, m, h, &row, &col); /* tile [n][k] */
                bad += row != n || col != k;
                ldmatrix_element(moe_flash_ldmatrix_b_kn, 1, t, m, h, &row, &col); /* tile [k][n], .trans */
                bad += row != k || col != n;
            }
    for (int t = 0; t < 32; t++)
        for (int e = 0; e < 8; e++) {
            int row, col, c_row, c_col;
            moe_flash_frag_a(t, e, &row, &col);
            moe_flash_frag_c(t, moe_flash_c_element_of_a(e), &c_row, &c_col);
            bad += row != c_row || col != c_col + 8 * moe_flash_c_tile_of_a(e);
        }
    CHECK(bad == 0, "%d ldmatrix or accumulator elements land off their fragment's place", bad);
}

/* every tile of the schedule for (head_dim, S), counted per pair */
static void schedule(int head_dim, int S) {
    const moe_flash_tiles t = moe_flash_tiles_for(head_dim);
    const int nq = moe_flash_tiles_over(S, t.block_m), nk = moe_flash_tiles_over(S, t.block_n);
    unsigned char *visits = calloc((size_t)S * S, 1), *forward = calloc((size_t)nq * nk, 1);
    int masked_right = 1, backward_same = 1, no_pair_skipped = 1;
    for (int i = 0; i < nq; i++) {
        const int tiles = moe_flash_key_tiles(t, S, i);
        CHECK(tiles >= 1 && tiles <= nk, "hd %d S %d: query tile %d has %d key tiles of %d", head_dim, S, i, tiles, nk);
        for (int j = 0; j < nk; j++) {
            int causal = 0, above = 0; /* pairs with key <= query, key > query, inside S */
            for (int q = i * t.block_m; q < (i + 1) * t.block_m && q < S; q++)
                for (int k = j * t.block_n; k < (j + 1) * t.block_n && k < S; k++) *(k <= q ? &causal : &above) += 1;
            if (j >= tiles) {
                no_pair_skipped &= causal == 0;
                continue;
            }
            forward[i * nk + j] = 1;
            /* masked exactly when the whole tile (rows and columns past S too, as the kernel's grid has them)
             * holds a pair with key > query; so every such pair inside S is masked */
            int spans_diagonal = 0;
            for (int q = i * t.block_m; q < (i + 1) * t.block_m && !spans_diagonal; q++)
                spans_diagonal = (j + 1) * t.block_n - 1 > q;
            masked_right &= moe_flash_tile_masked(t, i, j) == spans_diagonal && (!above || spans_diagonal);
            for (int q = i * t.block_m; q < (i + 1) * t.block_m && q < S; q++)
                for (int k = j * t.block_n; k < (j + 1) * t.block_n && k <= q; k++) visits[(size_t)q * S + k]++;
        }
    }
    for (int j = 0; j < nk; j++) /* dK/dV's tiles by key tile: query tiles first_query_tile(j) .. nq - 1 */
        for (int i = 0; i < nq; i++)
            backward_same &= forward[i * nk + j] == (i >= moe_flash_first_query_tile(t, j));
    int exactly_once = 1;
    for (int q = 0; q < S; q++)
        for (int k = 0; k < S; k++) exactly_once &= visits[(size_t)q * S + k] == (k <= q);
    CHECK(exactly_once, "hd %d S %d: a causal pair visited other than once, or another pair visited", head_dim, S);
    CHECK(no_pair_skipped, "hd %d S %d: a skipped tile holds a causal pair", head_dim, S);
    CHECK(masked_right, "hd %d S %d: a tile's mask flag is wrong", head_dim, S);
    CHECK(backward_same, "hd %d S %d: dK/dV's tiles are not the forward's", head_dim, S);
    free(visits), free(forward);
}

/* The forward kernel's arithmetic over the schedule for one sequence: O [S, H, hd], lse [H, S]; q [S, H, hd],
 * k and v [S, KV, hd] already bf16-rounded; P rounded to bf16 before P V, as the kernel's second mma takes it. */
static void emulate_forward(const float *q, const float *k, const float *v, int S, int H, int KV, int hd, float *o,
                            float *lse) {
    const moe_flash_tiles t = moe_flash_tiles_for(hd);
    const float scale = 1.0f / sqrtf((float)hd);
    const int nq = moe_flash_tiles_over(S, t.block_m), G = H / KV;
    float *acc = malloc(sizeof(float) * hd), *s = malloc(sizeof(float) * t.block_n);
    for (int h = 0; h < H; h++)
        for (int i = 0; i < nq; i++)
            for (int row = i * t.block_m; row < (i + 1) * t.block_m && row < S; row++) {
                float m = -INFINITY, l = 0;
                memset(acc, 0, sizeof(float) * hd);
                const float *qr = q + ((size_t)row * H + h) * hd;
                for (int j = 0; j < moe_flash_key_tiles(t, S, i); j++) {
                    float tile_max = -INFINITY;
                    for (int c = 0; c < t.block_n; c++) {
                        const int key = j * t.block_n + c;
                        s[c] = -INFINITY; /* the bounds mask, and the causal one on masked tiles */
                        if (key >= S || (moe_flash_tile_masked(t, i, j) && key > row)) continue;
                        const float *kr = k + ((size_t)key * KV + h / G) * hd;
                        float dot = 0;
                        for (int d = 0; d < hd; d++) dot += qr[d] * kr[d];
                        s[c] = dot * scale;
                        tile_max = fmaxf(tile_max, s[c]);
                    }
                    const float m_new = fmaxf(m, tile_max), correction = expf(m - m_new);
                    l *= correction;
                    for (int d = 0; d < hd; d++) acc[d] *= correction;
                    for (int c = 0; c < t.block_n; c++) {
                        if (s[c] == -INFINITY) continue;
                        const float p = expf(s[c] - m_new), pb = moe_bf16_round(p);
                        l += p;
                        const float *vr = v + ((size_t)(j * t.block_n + c) * KV + h / G) * hd;
                        for (int d = 0; d < hd; d++) acc[d] += pb * vr[d];
                    }
                    m = m_new;
                }
                for (int d = 0; d < hd; d++) o[((size_t)row * H + h) * hd + d] = acc[d] / l;
                lse[(size_t)h * S + row] = m + logf(l);
            }
    free(acc), free(s);
}

static void emulation(int S, int H, int KV, int hd, moe_rng *rng) {
    const size_t nq = (size_t)S * H * hd, nkv = (size_t)S * KV * hd;
    float *q = test_alloc_uniform(rng, nq, 2.0), *k = test_alloc_uniform(rng, nkv, 2.0);
    float *v = test_alloc_uniform(rng, nkv, 1.0), *o = malloc(nq * sizeof(float));
    float *lse = malloc((size_t)H * S * sizeof(float));
    for (size_t x = 0; x < nq; x++) q[x] = moe_bf16_round(q[x]);
    for (size_t x = 0; x < nkv; x++) k[x] = moe_bf16_round(k[x]), v[x] = moe_bf16_round(v[x]);
    emulate_forward(q, k, v, S, H, KV, hd, o, lse);
    double worst = 0, worst_lse = 0, vmax = 0;
    for (size_t x = 0; x < nkv; x++) vmax = fmax(vmax, fabs(v[x]));
    double *w = malloc((size_t)S * sizeof(double));
    for (int h = 0; h < H; h++)
        for (int row = 0; row < S; row++) { /* fp64 softmax attention of the same inputs */
            double m = -INFINITY, l = 0;
            for (int key = 0; key <= row; key++) {
                double dot = 0;
                for (int d = 0; d < hd; d++)
                    dot += (double)q[((size_t)row * H + h) * hd + d] * k[((size_t)key * KV + h / (H / KV)) * hd + d];
                w[key] = dot / sqrt((double)hd);
                m = fmax(m, w[key]);
            }
            for (int key = 0; key <= row; key++) l += exp(w[key] - m);
            worst_lse = fmax(worst_lse, fabs(lse[(size_t)h * S + row] - (m + log(l))));
            for (int d = 0; d < hd; d++) {
                double want = 0;
                for (int key = 0; key <= row; key++)
                    want += exp(w[key] - m) / l * v[((size_t)key * KV + h / (H / KV)) * hd + d];
                worst = fmax(worst, fabs(o[((size_t)row * H + h) * hd + d] - want));
            }
        }
    CHECK(worst <= 4e-3 * vmax && worst_lse <= 1e-4 * (1 + log((double)S)),
          "S %d, %d heads / %d kv, hd %d: the emulated kernel's output max|diff| %.3g (max|V| %.3g), lse %.3g", S, H,
          KV, hd, worst, vmax, worst_lse);
    printf("emulated forward S %4d, %d heads / %d kv, hd %3d (tiles %d x %d): max|O - fp64| %.2e of max|V| %.2f, "
           "max|lse - fp64| %.2e\n", S, H, KV, hd, moe_flash_tiles_for(hd).block_m, moe_flash_tiles_for(hd).block_n,
           worst, vmax, worst_lse);
    free(q), free(k), free(v), free(o), free(lse), free(w);
}

int main(void) {
    fragment_maps();
    ldmatrix_maps();
    const int dims[] = {32, 64, 96, 128, 192, 256}; /* 32, 64, 128: the kernels' (kernels/attention_flash.cu) */
    const int lengths[] = {1, 15, 16, 63, 64, 65, 127, 128, 129, 200, 257, 640, 1000};
    for (size_t d = 0; d < sizeof dims / sizeof *dims; d++)
        for (size_t s = 0; s < sizeof lengths / sizeof *lengths; s++) schedule(dims[d], lengths[s]);
    moe_rng rng = moe_rng_seeded(50);
    emulation(200, 4, 2, 64, &rng);  /* a length past two 128-query tiles, grouped-query heads */
    emulation(129, 2, 2, 128, &rng); /* one query row past a tile */
    emulation(70, 2, 1, 256, &rng);  /* the 64 x 64 tiles, one kv head */
    return test_finish("test_flash_tiles");
}
