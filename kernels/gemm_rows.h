/* gemm_rows.h — row-wise GEMMs whose every output row is independent of the other rows in the call, in fp32 or
 * with bf16 inputs (core/precision.h).
 *
 *   C[rows, n] = A[rows, k] op(B) + beta * C,   op(B) = B^T (B is [n, k]) or B (B is [k, n])
 *
 * OpenBLAS picks different kernels by problem size (a "small matrix" path, a gemv path for one row), and
 * these round differently, so the same row can get different bits depending on how many rows share its
 * call (measured with 0.3.21: see docs/DETERMINISM.md). Expert parallelism changes how many rows each
 * call sees. With row_block > 0 every call has exactly row_block rows, the last block zero-padded
 * through scratch: all calls have one shape, and a row's result depends only on its own values, which
 * makes outputs bitwise identical across expert-parallel layouts. row_block = 0 makes one call (faster;
 * the bits may then depend on the layout).
 *
 * bf16 inputs: A's rows are rounded to bf16 on their way into each call (through scratch, so calls take at most
 * MOE_GEMM_ROUND_ROWS rows); B must already hold bf16 values (a weight's bf16 copy, made once per forward by its
 * owner). Accumulation and C are fp32. The calls run on the CPU GEMM library of kernels/gemm_engine.h: oneDNN's
 * bf16 kernels, or OpenBLAS's sgemm on the rounded values (products of bf16 values are exact in fp32).
 *
 * beta is 0 (C is overwritten, not read) or 1 (C += product); anything else is MOE_ERR_INVALID_ARG. */
#ifndef MOE_KERNELS_GEMM_ROWS_H
#define MOE_KERNELS_GEMM_ROWS_H

#include <cblas.h>

#include "core/types.h"

/* The block size of the layout-invariant mode: 64 rows fill the libraries' AVX-512 tiles and keep the
 * padding small; larger blocks saved little (docs/BENCHMARKS.md). The rows a bf16 call rounds at a time. */
enum { MOE_GEMM_ROW_BLOCK = 64, MOE_GEMM_ROUND_ROWS = 4 * MOE_GEMM_ROW_BLOCK /* whole blocks */ };
/* Inputs a caller can keep staged at once (moe_gemm_rows_stage). */
enum { MOE_GEMM_STAGE_SLOTS = 5 };

typedef struct moe_gemm_engine moe_gemm_engine;

/* Where a plan's staged inputs can live instead of its own buffers: get(ctx, slot, nbytes, &buffer) gives a buffer of
 * at least nbytes for the slot, kept until the next get of that slot asks for more. Plans whose products run one after
 * another (a runtime's MoE layers) share one set of the largest size this way (moe/layer_ops_cpu.c: runtime slots). */
typedef struct {
    moe_status (*get)(void *ctx, int slot, size_t nbytes, void **buffer);
    void *ctx;
} moe_gemm_stage_source;

typedef struct {
    int row_block;            /* MOE_GEMM_ROW_BLOCK or 0 */
    int bf16_inputs;          /* 1: the inputs are rounded to bf16 (see above) */
    void *scratch;            /* MOE_GEMM_ROUND_ROWS * 2 * max_width reals: rounded or padded rows */
    moe_bf16 *weights16;      /* a native bf16 engine: B as moe_bf16, converted once per call */
    size_t weights16_count;   /* what weights16 holds */
    moe_gemm_engine *engine;  /* the GEMM library's state (primitive cache) */
    void *stage[MOE_GEMM_STAGE_SLOTS]; /* staged inputs (moe_gemm_rows_stage), grown on demand: the plan's own, */
    size_t stage_bytes[MOE_GEMM_STAGE_SLOTS];
    moe_gemm_stage_source stage_source; /* or, when get is set, from there (nothing of its own)             */
} moe_gemm_rows_plan;

/* row_block = MOE_GEMM_ROW_BLOCK when layout_invariant, else 0; scratch for widths (k, n, m) up to max_width. */
moe_status moe_gemm_rows_plan_init(moe_gemm_rows_plan *plan, int layout_invariant, int bf16_inputs, int max_width);
void moe_gemm_rows_plan_free(moe_gemm_rows_plan *plan);

/* The plan is not const: calls reuse its scratch and the engine's cached primitives (one thread per plan). */
moe_status moe_gemm_rows_cpu(moe_gemm_rows_plan *plan, CBLAS_TRANSPOSE trans_b, int rows, int n, int k,
                             const moe_real *A, const moe_real *B, moe_real beta, moe_real *C);

/* C[m, n] = A^T B + beta * C with A [rows, m] and B [rows, n] row-major: a weight gradient, summed over rows. One
 * call in fp32; with bf16 inputs both operands are rounded and the rows summed in chunks of MOE_GEMM_ROUND_ROWS,
 * in order (deterministic for a given row count). */
moe_status moe_gemm_rows_at_b_cpu(moe_gemm_rows_plan *plan, int rows, int m, int n, const moe_real *A,
                                  const moe_real *B, moe_real beta, moe_real *C);

/* Staged inputs: an input that several products read (an expert's rows x feed w1, w3 and two weight gradients) is
 * rounded once into the plan's slot (0 <= slot < MOE_GEMM_STAGE_SLOTS; valid until the slot is staged again) instead
 * of once per product; with fp32 inputs *out is x itself. The _staged products take such inputs and give the bits of
 * their plain twins on the same values. moe_gemm_rows_staged_at: value `index` of a staged input. */
moe_status moe_gemm_rows_stage(moe_gemm_rows_plan *plan, int slot, const moe_real *x, size_t count, const void **out);
const void *moe_gemm_rows_staged_at(const moe_gemm_rows_plan *plan, const void *staged, size_t index);
moe_status moe_gemm_rows_staged_cpu(moe_gemm_rows_plan *plan, CBLAS_TRANSPOSE trans_b, int rows, int n, int k,
                                    const void *A, const moe_real *B, moe_real beta, moe_real *C);
moe_status moe_gemm_rows_at_b_staged_cpu(moe_gemm_rows_plan *plan, int rows, int m, int n, const void *A,
                                         const void *B, moe_real beta, moe_real *C);

/* dst[i] = src[i] rounded to bf16 (kept as moe_real), n values: the bf16 copy of a weight. */
void moe_round_bf16_cpu(const moe_real *src, size_t n, moe_real *dst);

#endif
