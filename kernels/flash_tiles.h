/* flash_tiles.h — the tile plan of the tensor-core flash attention (issue 50, item 1; FlashAttention-2's algorithm),
 * shared by the CUDA kernels and the CPU tests (tests/test_flash_tiles.c): one header, so the kernels and their CPU
 * checks cannot drift apart.
 *
 * Tiles: a block of block_m query rows against successive blocks of block_n keys, chosen by head_dim alone (never by
 * the sequence length or the batch: a sequence's bits never depend on its neighbours, docs/DETERMINISM.md).
 * Causal schedule, for a sequence of S tokens (nq = ceil(S / block_m) query tiles, nk = ceil(S / block_n) key tiles):
 *   forward and dQ (over query tiles i): key tiles 0 .. moe_flash_key_tiles(i) - 1, those past the diagonal skipped;
 *   dK/dV (over key tiles j): query tiles moe_flash_first_query_tile(j) .. nq - 1;
 * a tile needs the causal mask when some of its pairs has key > query (moe_flash_tile_masked), and the bounds mask
 * when it runs past S. Every causal pair (query q, key k <= q) falls in exactly one visited tile, the same tiles both
 * ways (tested). Each dK/dV and each dQ is accumulated over its tiles in this order, with no atomics.
 *
 * Fragments of mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (PTX ISA, "Matrix fragments for mma.m16n8k16"):
 * lane = threadIdx % 32, group = lane / 4, pair = lane % 4.
 *   A (16 x 16, row-major), 8 bf16 a lane: element e -> row group + 8 ((e / 2) % 2), column 2 pair + e % 2 + 8 (e / 4)
 *   B (16 x 8, k x n), 4 bf16 a lane: element e -> k 2 pair + e % 2 + 8 (e / 2), n group
 *   C, D (16 x 8 fp32), 4 a lane: element e -> row group + 8 (e / 2), column 2 pair + e % 2
 * Each map covers its tile exactly once over the 32 lanes (tested). */
#ifndef MOE_KERNELS_FLASH_TILES_H
#define MOE_KERNELS_FLASH_TILES_H

#ifdef __CUDACC__
#define MOE_FLASH_FN __host__ __device__ static inline
#else
#define MOE_FLASH_FN static inline
#endif

typedef struct {
    int block_m; /* query rows of a tile */
    int block_n; /* keys of a tile */
    int warps;   /* a block's warps: block_m / 16 rows of mma tiles each (16 query rows a warp) */
} moe_flash_tiles;

/* The tiles for head_dim (a multiple of 16 up to 256): FlashAttention-2's on an H100 — 128 x 128 up to 64, 128 x 64
 * up to 128 (its shared memory then holds Q, two K/V blocks), 64 x 64 beyond. As macros too, for the kernels'
 * compile-time shapes (kernels/attention_flash.cu): one rule. */
#define MOE_FLASH_BLOCK_M(head_dim) ((head_dim) <= 128 ? 128 : 64)
#define MOE_FLASH_BLOCK_N(head_dim) ((head_dim) <= 64 ? 128 : 64)
MOE_FLASH_FN moe_flash_tiles moe_flash_tiles_for(int head_dim) {
    moe_flash_tiles t;
    t.block_m = MOE_FLASH_BLOCK_M(head_dim);
    t.block_n = MOE_FLASH_BLOCK_N(head_dim);
    t.warps = t.block_m / 16;
    return t;
}

MOE_FLASH_FN int moe_flash_tiles_over(int S, int block) { return (S + block - 1) / block; }

/* Query tile i's key tiles under the causal mask: those whose first key is <= its last query row (at most nk). */
MOE_FLASH_FN int moe_flash_key_tiles(moe_flash_tiles t, int S, int i) {
    const int last_query = (i + 1) * t.block_m - 1 < S - 1 ? (i + 1) * t.block_m - 1 : S - 1;
    return last_query / t.block_n + 1;
}

/* Key tile j's first query tile: the one holding its first key's own query row. */
MOE_FLASH_FN int moe_flash_first_query_tile(moe_flash_tiles t, int j) { return j * t.block_n / t.block_m; }

/* Whether tile (i, j) holds a pair with key > query (the diagonal's tiles): its last key past its first query. */
MOE_FLASH_FN int moe_flash_tile_masked(moe_flash_tiles t, int i, int j) {
    return (j + 1) * t.block_n - 1 > i * t.block_m;
}

/* The (row, column) of element e (0..7) of lane's A fragment, e (0..3) of its B fragment (k, n) and of its C/D. */
MOE_FLASH_FN void moe_flash_frag_a(int lane, int e, int *row, int *col) {
    *row = lane / 4 + 8 * ((e / 2) % 2);
    *col = 2 * (lane % 4) + e % 2 + 8 * (e / 4);
}
MOE_FLASH_FN void moe_flash_frag_b(int lane, int e, int *k, int *n) {
    *k = 2 * (lane % 4) + e % 2 + 8 * (e / 2);
    *n = lane / 4;
}
MOE_FLASH_FN void moe_flash_frag_c(int lane, int e, int *row, int *col) {
    *row = lane / 4 + 8 * (e / 2);
    *col = 2 * (lane % 4) + e % 2;
}

/* ldmatrix.sync.aligned.m8n8.x4 (PTX ISA): lanes 8 m .. 8 m + 7 give the addresses of matrix m's 8 rows (8 b16
 * each); register m of lane t receives matrix m's row t / 4, columns 2 (t % 4) and + 1, or with .trans its rows
 * 2 (t % 4) and + 1 at column t / 4. The row and column of a shared tile that `lane` points at, to load:
 *   a: an A fragment (16 x 16, the tile row-major): registers 0-3 are A's elements 0-1, 2-3, 4-5, 6-7;
 *   b_nk: two B fragments (16 x 8 each, k x n) from a tile stored [n][k] (rows n): registers 0, 1 the first's
 *         elements 0-1, 2-3, registers 2, 3 the second's (n + 8);
 *   b_kn: the same from a tile stored [k][n], with .trans.
 * tests/test_flash_tiles.c runs these through the instruction's definition against the fragment maps above. */
MOE_FLASH_FN void moe_flash_ldmatrix_a(int lane, int *row, int *col) {
    *row = lane % 16;
    *col = 8 * (lane / 16);
}
MOE_FLASH_FN void moe_flash_ldmatrix_b_nk(int lane, int *row, int *col) {
    *row = lane % 8 + 8 * (lane / 16);
    *col = 8 * ((lane / 8) % 2);
}
MOE_FLASH_FN void moe_flash_ldmatrix_b_kn(int lane, int *row, int *col) {
    *row = lane % 8 + 8 * ((lane / 8) % 2);
    *col = 8 * (lane / 16);
}
/* The accumulators of two n8 tiles of C (16 x 16 together) as the A fragment of a k16 step (P of P v): A's element
 * 4 t + e is element e of C tile t. */
MOE_FLASH_FN int moe_flash_c_tile_of_a(int e) { return e / 4; }
MOE_FLASH_FN int moe_flash_c_element_of_a(int e) { return e % 4; }

#endif
