/* gemm_lt.h — one batch-invariant GEMM per product on cuBLASLt: an algorithm pinned per shape at plan time and reused
 * for every number of rows, so that a row's result depends on its own inputs only (DESIGN.md, "Determinism": one GEMM
 * call per product, no split-K; issue 50, item 2).
 *
 * The product, row-major, M the rows that vary from call to call:
 *   D[M, N] = op_a(A) op_b(B) + beta D     op_a(A) = A (A [M, K], trans_a 0) or A^T (A [K, M], trans_a 1)
 *                                          op_b(B) = B^T (B [N, K], trans_b 1) or B (B [K, N], trans_b 0)
 * The dense linear's three (kernels/linear.h, W [out, in], T token rows):
 *   forward          y = x W^T     trans (0, 1)   M = T,   N = out, K = in
 *   backward input   dx = dy W     trans (0, 0)   M = T,   N = in,  K = out
 *   weight gradient  dW = dy^T x   trans (1, 0)   M = out, N = in,  K = T    (its rows are the weight's rows)
 * Inputs bf16 (MOE_GEMM_LT_BF16: CUBLAS_COMPUTE_32F on bf16 A and B; products of bf16 values are exact in fp32 and
 * are summed in fp32) or fp32 (MOE_GEMM_LT_FP32, the router's: CUBLAS_COMPUTE_32F_PEDANTIC, no TF32, no reduced
 * precision anywhere; where cuBLASLt offers nothing under that type, CUBLAS_COMPUTE_32F with an algorithm whose
 * numerical flags say FMA only). C is D (beta 0: D is overwritten, not read; 1: D += the product), fp32.
 *
 * Why a pinned algorithm makes a row independent of M. cuBLASLt is column-major: row-major D[M, N] is column-major
 * D^T [N, M], so each call computes D^T = op_b(B)^T op_a(A)^T with cuBLAS's m = N, n = M, k = K: the rows that vary
 * are cuBLAS's n, the columns of its output. A kernel with a fixed tile (tm x tn) and no split-K gives every output
 * column to one thread block, which forms each of that column's values as the sum over K in the kernel's fixed K
 * steps, each step the same MMA (or FMA) instructions whatever the column's position in the tile; the columns past M
 * in the last tile read zeros (or nothing) and are not stored, and no column's values mix with another's. Column j
 * of D^T, row j of D, is then a function of A's row j, of B and of D's row j alone, for any M. What breaks that: a
 * split of K (SPLITK_NUM > 1, a reduction scheme: how many pieces and in what order they are added is chosen per
 * problem, M included), schemes that need workspace (stream-K's fix-up), and another kernel (another tile, MMA shape
 * or K step) for another M, which is what cuBLAS's own heuristic does per call: hence one algorithm per shape,
 * pinned. CTA swizzling, the stage count and the cluster shape move work between SMs and in time, not the arithmetic
 * of a column; they are pinned too (one configuration, one record): a cluster shape a candidate leaves to the library
 * (AUTO, chosen per call) is replaced by the first concrete one (1x1x1, 2x1x1, 1x2x1, 2x2x1) that passes the checks,
 * and the record says "cluster auto" where none does. The inner shape is left as the candidate has it (cublasLt.h's
 * values name only Ampere's MMA shapes; 0 is "undefined"): test_gpu_gemm_lt's rows-bitwise check over M is what
 * shows it fixed. The epilogue adds beta D once per value, after the whole K sum.
 *
 * Pinning (moe_gemm_lt_plan), per (trans_a, trans_b, N, K, inputs); the first candidate that passes is the algorithm:
 *   1. cuBLASLt's heuristic (cublasLtMatmulAlgoGetHeuristic) asked about MOE_GEMM_LT_PLAN_ROWS rows with no
 *      workspace, its results in its order (its estimate of the fastest first): a choice that depends on that fixed
 *      row count, never on a call's M;
 *   2. every algorithm id cuBLASLt lists for the types (cublasLtMatmulAlgoGetIds, cublasLtMatmulAlgoInit), in id
 *      order, each with its tiles and stages in the order of its CUBLASLT_ALGO_CAP_TILE_IDS and _STAGES_IDS, CTA
 *      swizzling 0 and custom option 0.
 * A candidate is set to CUBLASLT_ALGO_CONFIG_SPLITK_NUM 1 and CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME NONE, must have
 * the numerical flags of its inputs (an fp32 accumulator; bf16: bf16 or fp32 MMA inputs; fp32: no tensor op), and
 * must pass cublasLtMatmulAlgoCheck with no workspace at every M of MOE_GEMM_LT_CHECK_ROWS (1 to 131072; a call at
 * another M that the algorithm refuses fails loudly, never silently with another algorithm). No timing: a pick by
 * time could differ from run to run, and the bits with it. When no candidate passes, moe_gemm_lt_plan fails with
 * MOE_ERR_LIBRARY and says what was tried: the caller keeps its own path (kernels/linear.cu: the 64-row blocks).
 *
 * Leading dimensions and alignment: the algorithm is checked with the layouts the calls will have. Input rows are
 * stored padded to a multiple of 16 bytes (moe_gemm_lt_ld_a, _ld_b; also A's rows of M values under trans_a, so that
 * the alignment an algorithm needs never depends on M); D's rows are N values, as the caller's arrays. A call's
 * pointers must have the algorithm's minimum alignments (CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_*): moe_gemm_lt_run refuses
 * pointers without them, moe_gemm_lt_run_f32 stages such operands through aligned scratch.
 *
 * The bits are those of one GPU model, SM count and cuBLASLt build (algorithm ids and their kernels are the
 * library's): moe_gemm_lt_describe names the configuration, for the run record. cuBLASLt's handle is the context's
 * (core/gpu_cuda.h). Checked by tests/test_gpu_gemm_lt.c (suite gpu: each row bitwise the same for M from 1 to 16384,
 * against the fp32 SGEMM of the same values) and, for the layouts alone, tests/test_gemm_lt_layout.c (suite unit: the
 * column-major calls run by cblas on the CPU); timed by bench/bench_gemm_lt.cu.
 *
 * Host syncs: none in planning (host calls only) or in a run; growing a set's scratch waits for the stream (the old
 * buffer may still be read). Only builds with CUDA define the functions below moe_gemm_lt_ld_b. */
#ifndef MOE_KERNELS_GEMM_LT_H
#define MOE_KERNELS_GEMM_LT_H

#include <stddef.h>

#include "core/gpu.h"

typedef enum { MOE_GEMM_LT_BF16 = 0, MOE_GEMM_LT_FP32 = 1 } moe_gemm_lt_inputs;

/* The rows the plan asks cuBLASLt's heuristic about (a training micro-batch's tokens), and the rows every candidate is
 * checked at. */
enum { MOE_GEMM_LT_PLAN_ROWS = 8192 };
#define MOE_GEMM_LT_CHECK_ROWS {1, 37, 64, 65, 1000, 8192, 16384, 131072}

/* A shape: everything but M. */
typedef struct {
    int trans_a, trans_b; /* 0 or 1, as above */
    int n, k;             /* >= 1 */
    moe_gemm_lt_inputs inputs;
    int bf16_out;         /* 1: D is bf16, rounded once from the fp32 sum by the epilogue (bf16 inputs, beta 0 only:
                             the experts' row projections, experts/expert_ffn.h); 0: D is fp32 */
} moe_gemm_lt_shape;

/* ---- layouts (plain C, libmoe: tests/test_gemm_lt_layout.c runs them with cblas) ---- */

/* The row length (elements) A and B are stored with in a call: their natural width padded to a multiple of 16 bytes
 * of the input type (A's natural width is K, or M under trans_a; B's is K under trans_b, else N). */
int moe_gemm_lt_ld_a(const moe_gemm_lt_shape *shape, int M);
int moe_gemm_lt_ld_b(const moe_gemm_lt_shape *shape);

/* The column-major call that computes a shape at M: cuBLASLt's A is our B, its B our A, its D our D^T. Each matrix
 * as cuBLASLt's layout sees it: rows, cols and ld (column-major), with op (1: transposed) for A and B. */
typedef struct {
    int m, n, k;                            /* N, M, K */
    int op_first, first_rows, first_cols, first_ld;     /* our B */
    int op_second, second_rows, second_cols, second_ld; /* our A */
    int d_rows, d_cols, d_ld;                            /* our D: N, M, N */
} moe__gemm_lt_colmajor;
moe__gemm_lt_colmajor moe__gemm_lt_colmajor_of(const moe_gemm_lt_shape *shape, int M);

/* "A B^T n 4096 k 1024 bf16": the product as op_a(A) op_b(B), N, K and the inputs (" -> bf16" for a bf16 D). */
void moe_gemm_lt_shape_text(const moe_gemm_lt_shape *shape, char *out, size_t n);

/* ---- the pinned GEMM (libmoe_cuda) ---- */

typedef struct moe_gemm_lt moe_gemm_lt;

/* Pins an algorithm for shape (above). MOE_ERR_LIBRARY with what was tried when cuBLASLt offers none;
 * MOE_ERR_INVALID_ARG for a shape out of range. */
moe_status moe_gemm_lt_plan(moe_gpu *gpu, const moe_gemm_lt_shape *shape, moe_gemm_lt **out);
void moe_gemm_lt_free(moe_gemm_lt *g);
const moe_gemm_lt_shape *moe_gemm_lt_shape_of(const moe_gemm_lt *g);

/* The pinned configuration in one line, as "cuBLASLt 130100 compute 32F algo 66 tile 23 stages 35 splitk 1 reduction
 * none swizzle 0 custom 0 inner 0 cluster 2 (heuristic #1 at 8192 rows)" (an illustration, not a measured record; ids
 * as cublasLt.h numbers them, cluster "auto" where the library chooses per call). */
void moe_gemm_lt_describe(const moe_gemm_lt *g, char *out, size_t n);

/* The largest of the algorithm's minimum alignments of A, B and D, in bytes (a caller whose operands may sit at any
 * multiple of 16 bytes asks whether it is at most 16, and decides by the shape alone). */
unsigned moe_gemm_lt_alignment(const moe_gemm_lt *g);

/* D[M, N] (+)= op_a(A) op_b(B) as one cublasLtMatmul with the pinned algorithm, queued on gpu's stream. A and B of the
 * shape's input type (moe_bf16 or float) with the row lengths of moe_gemm_lt_ld_a / _ld_b, D fp32 (bf16 under
 * bf16_out) with rows of N; all three with the algorithm's alignments (MOE_ERR_INVALID_ARG otherwise). beta 0 or 1 (0
 * under bf16_out); M 0 does nothing. */
moe_status moe_gemm_lt_run(moe_gpu *gpu, const moe_gemm_lt *g, int M, const void *A, const void *B, float beta,
                           void *D);

/* ---- a set of pinned GEMMs by shape, for callers with fp32 buffers (kernels/linear.cu) too ---- */

typedef struct moe_gemm_lt_set moe_gemm_lt_set;

moe_status moe_gemm_lt_set_create(moe_gemm_lt_set **out);
void moe_gemm_lt_set_destroy(moe_gpu *gpu, moe_gemm_lt_set *set);

/* The context's set: every pinned GEMM of one device context in one place, whoever asks (the dense linears, each MoE
 * layer's router and experts): one shape, one algorithm, pinned once, and one list for the run record
 * (moe_gemm_lt_set_describe). Created at the first request, freed with the context (moe_gpu_destroy). */
moe_status moe_gemm_lt_context_set(moe_gpu *gpu, moe_gemm_lt_set **out);
/* The context set's moe_gemm_lt_set_describe: "" while nothing asked it for a GEMM. */
int moe_gemm_lt_context_describe(moe_gpu *gpu, char *out, size_t n);

/* The set's GEMM of shape, pinned at the shape's first request and kept. *out NULL (and MOE_OK) when cuBLASLt offers
 * none for it: the caller falls back, and the set keeps the reason (moe_gemm_lt_set_describe) and does not ask again.
 * Other failures (a CUDA error) are returned. */
moe_status moe_gemm_lt_set_get(moe_gpu *gpu, moe_gemm_lt_set *set, const moe_gemm_lt_shape *shape,
                               const moe_gemm_lt **out);

/* moe_gemm_lt_run from dense fp32 arrays, for fp32 D only (rows of their natural width: A [M, K] or [K, M], B [N, K]
 * or [K, N], D [M, N]): bf16 shapes cast A and B to bf16 (round to nearest even: exact when they hold bf16 values, as the model's
 * GEMM inputs do) into the set's scratch with the padded row lengths; fp32 shapes use A and B in place where their
 * rows need no padding and their addresses the algorithm's alignment, else copy them; D goes through scratch where
 * its address is not aligned. g must be one of the set's. */
moe_status moe_gemm_lt_run_f32(moe_gpu *gpu, moe_gemm_lt_set *set, const moe_gemm_lt *g, int M, const float *A,
                               const float *B, float beta, float *D);

/* For a caller that keeps a weight's bf16 copy while the weight does not change (kernels/linear.h): the elements B
 * takes as a call reads it (its rows of moe_gemm_lt_ld_b), B cast into such a copy (round to nearest even, the bits
 * moe_gemm_lt_run_f32's own cast gives; bf16 shapes), and moe_gemm_lt_run_f32 with that copy as B, not cast again
 * (at the algorithm's B alignment: a cudaMalloc'd copy has it). */
size_t moe_gemm_lt_b_count(const moe_gemm_lt *g);
moe_status moe_gemm_lt_cast_b(moe_gpu *gpu, const moe_gemm_lt *g, const float *B, moe_bf16 *out);
moe_status moe_gemm_lt_run_f32_kept_b(moe_gpu *gpu, moe_gemm_lt_set *set, const moe_gemm_lt *g, int M,
                                      const float *A, const moe_bf16 *B, float beta, float *D);

/* One line per shape the set has met, in the order met: "A B^T n 4096 k 1024 bf16: <moe_gemm_lt_describe>" or
 * "...: none (<the reason>)"; "" for none. Returns what snprintf would (the full length). */
int moe_gemm_lt_set_describe(const moe_gemm_lt_set *set, char *out, size_t n);

#endif
