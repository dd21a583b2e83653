/* gemm_rows.h — row-wise GEMMs whose every output row is independent of the other rows in the call, in fp32 or
 * with bf16 inputs (core/precision.h), and weight gradients; cut into library calls by shape alone and spread over
 * the OpenMP pool's threads by the plan (the engine's threads: kernels/gemm_engine.h).
 *
 *   C[rows, n] = A[rows, k] op(B) + beta * C,   op(B) = B^T (B is [n, k]) or B (B is [k, n])
 *
 * GEMM libraries pick different kernels by problem size (OpenBLAS: a "small matrix" path, a gemv path for one row;
 * oneDNN: a kernel per shape), and these round differently, so the same row can get different bits depending on how
 * many rows share its call (measured: see docs/DETERMINISM.md). Expert parallelism changes how many rows each call
 * sees. With row_block > 0 every call has exactly row_block rows, the last block zero-padded through scratch: all
 * calls have one shape, and the engine gives a row the same bits at any position in a call (gemm_engine.h), so a
 * row's result depends only on its own values, which makes outputs bitwise identical across expert-parallel layouts.
 * row_block = 0 makes calls of MOE_GEMM_ROUND_ROWS rows, the last one shorter (faster; the bits may then depend on
 * the layout, never on the thread count).
 *
 * Threads: the calls of one product (its row blocks; a weight gradient's bands of MOE_GEMM_BAND_ROWS output rows)
 * are a list fixed by the product's shape; called outside a parallel region the plan runs them over the pool's
 * threads, each thread on its own engine and scratch (the plan's workers), and inside one it runs them in order on the
 * calling thread. Every call writes its own rows of C, so the thread count never changes a bit, on any CPU and with
 * either library.
 *
 * bf16 inputs: A's rows are rounded to bf16 on their way into each call (through the worker's scratch); B (a weight,
 * fp32) is rounded to bf16 and laid out as the calls read it (for the row blocks, oneDNN's blocked layout where the
 * library prefers one: moe_gemm_engine_prefers_prepared_b) into a prepared copy. Accumulation and C are fp32. The
 * calls run on the CPU GEMM library of kernels/gemm_engine.h: oneDNN's bf16 kernels, or fp32 GEMMs of the rounded
 * values (products of bf16 values are exact in fp32).
 *
 * Prepared weights, kept (bf16 inputs): with a weights version set (moe_gemm_rows_plan_set_weights_version), the plan
 * keeps the prepared copy of every B it meets, per B address and call shape, and reuses it while the version stays
 * the same; a new version makes each copy again at its next use. The caller promises that B's values do not change
 * under one version: a training step's optimizer update, or a checkpoint's load, comes with a new version (the model's
 * parameter version, models/model.h). Version 0, the default, prepares B at every call. fp32 plans lay B out for the
 * row blocks at every call where the library prefers that (AVX-512: a kept fp32 copy would double the weights' memory
 * to save ~4% of a layer's pass at Mixtral-like shapes) and read it as it is elsewhere.
 *
 * beta is 0 (C is overwritten, not read) or 1 (C += product, one addition per value: gemm_engine.h); anything else is
 * MOE_ERR_INVALID_ARG. */
#ifndef MOE_KERNELS_GEMM_ROWS_H
#define MOE_KERNELS_GEMM_ROWS_H

#include <cblas.h>

#include "core/types.h"

/* The block size of the layout-invariant mode: 64 rows fill the libraries' AVX-512 tiles and keep the
 * padding small; larger blocks saved little (docs/BENCHMARKS.md). MOE_GEMM_ROUND_ROWS: the rows of a call without
 * row blocks, and of a bf16 weight gradient's chunks. MOE_GEMM_BAND_ROWS: a weight gradient's output is cut into
 * bands of at most this many whole rows, each one call (wide enough that the library stays on its fast path; a band's
 * columns of A are copied dense, which keeps oneDNN on its brgemm kernels: strided operands send it to its slower
 * sgemm). */
enum {
    MOE_GEMM_ROW_BLOCK = 64,
    MOE_GEMM_ROUND_ROWS = 4 * MOE_GEMM_ROW_BLOCK, /* whole blocks */
    MOE_GEMM_BAND_ROWS = 128,
};
/* Inputs a caller can keep staged at once (moe_gemm_rows_stage). */
enum { MOE_GEMM_STAGE_SLOTS = 5 };

typedef struct moe_gemm_engine moe_gemm_engine;

/* One thread's part of a plan: its engine (the library's state) and the scratch of its calls. */
typedef struct {
    moe_gemm_engine *engine;
    void *scratch; /* MOE_GEMM_ROUND_ROWS * 2 * max_width reals: rounded or padded rows */
    void *slice;   /* a weight-gradient band's columns of A, dense (grown on demand) */
    size_t slice_bytes;
} moe_gemm_worker;

/* Where a plan's staged inputs can live instead of its own buffers: get(ctx, slot, nbytes, &buffer) gives a buffer of
 * at least nbytes for the slot, kept until the next get of that slot asks for more. Plans whose products run one after
 * another (a runtime's MoE layers) share one set of the largest size this way (moe/layer_ops_cpu.c: runtime slots). */
typedef struct {
    moe_status (*get)(void *ctx, int slot, size_t nbytes, void **buffer);
    void *ctx;
} moe_gemm_stage_source;

/* A weight B as the calls of one shape read it (prepared weights, above). */
typedef struct {
    const moe_real *source;       /* the B it was made from */
    int trans_b, block, n, k;     /* the calls it serves: block 0 is a plain copy for any number of rows */
    unsigned long long version;   /* the plan's weights_version when it was made */
    void *data;
    size_t bytes;                 /* data's capacity */
} moe_gemm_prepared_weight;

typedef struct {
    int row_block;            /* MOE_GEMM_ROW_BLOCK or 0 */
    int prepare_b;            /* 1: the row blocks read B prepared for their shape (where the library prefers it) */
    int bf16_inputs;          /* 1: the inputs are rounded to bf16 (see above) */
    int max_width;
    moe_gemm_worker *workers; /* [worker_count]: one per pool thread that has run a call; [0] the calling thread's */
    int worker_count;
    void *rounded;            /* a bf16 weight gradient's chunk of both operands, rounded once for all its bands */
    size_t rounded_bytes;
    unsigned long long weights_version;   /* see above; 0: B prepared at every call */
    moe_gemm_prepared_weight *prepared;   /* the kept copies, [prepared_count] of [prepared_capacity] */
    int prepared_count, prepared_capacity;
    moe_gemm_prepared_weight once;        /* the copy of a call that keeps none */
    void *plain_b;            /* B as the calls' input type (bf16), on its way into a blocked layout */
    size_t plain_b_bytes;
    void *stage[MOE_GEMM_STAGE_SLOTS]; /* staged inputs (moe_gemm_rows_stage), grown on demand: the plan's own, */
    size_t stage_bytes[MOE_GEMM_STAGE_SLOTS];
    moe_gemm_stage_source stage_source; /* or, when get is set, from there (nothing of its own)             */
} moe_gemm_rows_plan;

/* row_block = MOE_GEMM_ROW_BLOCK when layout_invariant, else 0; scratch for widths (k, n, m) up to max_width. */
moe_status moe_gemm_rows_plan_init(moe_gemm_rows_plan *plan, int layout_invariant, int bf16_inputs, int max_width);
void moe_gemm_rows_plan_free(moe_gemm_rows_plan *plan);

/* Prepared weights (above): version 0 stops keeping them; the copies already made stay allocated for reuse. */
void moe_gemm_rows_plan_set_weights_version(moe_gemm_rows_plan *plan, unsigned long long version);

/* The plan is not const: calls reuse its workers' scratch and engines. One caller at a time per plan. */
moe_status moe_gemm_rows_cpu(moe_gemm_rows_plan *plan, CBLAS_TRANSPOSE trans_b, int rows, int n, int k,
                             const moe_real *A, const moe_real *B, moe_real beta, moe_real *C);

/* C[m, n] = A^T B + beta * C with A [rows, m] and B [rows, n] row-major: a weight gradient, summed over rows. Each
 * band of output rows is one call over all rows in fp32; with bf16 inputs both operands are rounded (unless staged)
 * and the rows summed in chunks of MOE_GEMM_ROUND_ROWS, each chunk's product added to the band in chunk order
 * (deterministic for a given row count). */
moe_status moe_gemm_rows_at_b_cpu(moe_gemm_rows_plan *plan, int rows, int m, int n, const moe_real *A,
                                  const moe_real *B, moe_real beta, moe_real *C);

/* Staged inputs: an input that several products read (an expert's rows x feed w1, w3 and two weight gradients) is
 * rounded once into the plan's slot (0 <= slot < MOE_GEMM_STAGE_SLOTS; valid until the slot is staged again) instead
 * of once per product; with fp32 inputs *out is x itself. The _staged products take such inputs and give the bits of
 * their plain twins on the same values. moe_gemm_rows_staged_at: value `index` of a staged input. */
moe_status moe_gemm_rows_stage(moe_gemm_rows_plan *plan, int slot, const moe_real *x, size_t count, const void **out);
/* Grows the slot to hold an input of `count` values now, as staging one would (as moe_gemm_rows_stage_rounded would
 * when `rounded`), so that staging no more later allocates nothing. */
moe_status moe_gemm_rows_reserve_stage(moe_gemm_rows_plan *plan, int slot, size_t count, int rounded);
/* Inputs the caller rounds: caller_rounds is 1 when the plan stages bf16 inputs as moe_real values (bf16 on fp32
 * units: gemm_engine.h), so that a caller that rounds an input as it computes it (moe_bf16_round_inline) has it staged
 * already. stage_rounded: x as staged, x itself but where the plan stages moe_bf16 values (then moe_gemm_rows_stage);
 * x must hold the rounded values when caller_rounds. */
int moe_gemm_rows_caller_rounds(const moe_gemm_rows_plan *plan);
moe_status moe_gemm_rows_stage_rounded(moe_gemm_rows_plan *plan, int slot, const moe_real *x, size_t count,
                                       const void **out);
const void *moe_gemm_rows_staged_at(const moe_gemm_rows_plan *plan, const void *staged, size_t index);
moe_status moe_gemm_rows_staged_cpu(moe_gemm_rows_plan *plan, CBLAS_TRANSPOSE trans_b, int rows, int n, int k,
                                    const void *A, const moe_real *B, moe_real beta, moe_real *C);
moe_status moe_gemm_rows_at_b_staged_cpu(moe_gemm_rows_plan *plan, int rows, int m, int n, const void *A,
                                         const void *B, moe_real beta, moe_real *C);

/* dst[i] = src[i] rounded to bf16 (kept as moe_real), n values: the bf16 copy of a weight. */
void moe_round_bf16_cpu(const moe_real *src, size_t n, moe_real *dst);

#endif
