/* gemm_engine.h — internal to kernels/: one GEMM call on the CPU GEMM library, on the calling thread only.
 *
 *   oneDNN (built in where found; float builds): the matmul primitive, in fp32, or with bf16 inputs (moe_bf16 arrays)
 *     and fp32 accumulation and output, on AVX512_BF16 / AMX where the CPU has them. Each engine keeps its primitives
 *     per shape, so that a shape met again (the 64-row blocks) costs no primitive creation; a weight gradient over at
 *     most 256 rows has one for every row count (a run-time k).
 *   OpenBLAS (where oneDNN is not built in, the float64 build, or MOE_CPU_GEMM=openblas): sgemm / dgemm; bf16 inputs
 *     arrive as moe_real arrays of values already rounded to bf16, whose products are exact in fp32.
 * The library is chosen once per process (moe_gemm_library() names it): MOE_CPU_GEMM=onednn or openblas, oneDNN by
 * default where it is built in; anything else, or onednn where it is not built in, fails the first engine's creation
 * with a message.
 *
 * What the engine promises, by construction rather than by a measurement of one CPU (docs/DETERMINISM.md, "Threads"):
 *  - one engine is one thread's: every library call runs single-threaded (the OpenMP pool's thread count is 1 while
 *    the library builds or runs anything), so a call's bits never depend on the thread count. The caller
 *    (kernels/gemm_rows.h) cuts its products into calls by shape alone and spreads the calls over threads, one
 *    engine per thread;
 *  - accumulation is never fused into the library: an accumulating call (C += product) forms the product in the
 *    engine's scratch and adds it to C once, so C + product is one fp32 addition per value whatever the library does
 *    with its k (oneDNN's AVX2 sgemm and OpenBLAS add C after their first k block when given beta = 1);
 *  - a row product (trans_a 0) gives each row bits that do not depend on the row's position in the call: oneDNN's
 *    kernels do so at any position (measured on AVX-512 and AVX2: tests/test_gemm_rows_position.c), OpenBLAS's only
 *    with the rows in its vector lanes, so the OpenBLAS engine runs a row product as calls of 16 rows with the rows
 *    in the kernel's M dimension (its 64-row calls gave rows other bits by position on Haswell/Zen kernels: 16842
 *    of 29760 rows in bench/gemm_row_consistency). */
#ifndef MOE_KERNELS_GEMM_ENGINE_H
#define MOE_KERNELS_GEMM_ENGINE_H

#include "core/types.h"

typedef struct moe_gemm_engine moe_gemm_engine;

/* C[m, n] (+)= op(A) op(B), all row-major; a leading dimension of 0 means dense (k, n or m as the layout asks). */
typedef struct {
    int trans_a;    /* 0: A is [m, k]; 1: A is stored [k, m] (a weight gradient, summed over k rows) */
    int trans_b;    /* 0: B is [k, n]; 1: B is stored [n, k] (a weight in the Hugging Face layout) */
    int m, n, k;
    int bf16;       /* bf16 inputs: moe_bf16 arrays when moe_gemm_native_bf16(), else moe_real (see above) */
    int accumulate; /* 1: C += product; 0: C = product (C is not read) */
    int prepared_b; /* B is what moe_gemm_engine_prepare_b returned for this call's shape (dense operands only) */
    int lda, ldb, ldc; /* 0: dense; else the row pitch, in values, of A, B and C as stored (a tile of a larger one) */
} moe_gemm_call;

/* MOE_OK when the library MOE_CPU_GEMM asks for is in this build (or it asks for none); else MOE_ERR_INVALID_CONFIG
 * with the reason, which every engine's creation then gives too: for a program to refuse before it starts work. */
moe_status moe_gemm_engine_available(void);
moe_status moe_gemm_engine_create(moe_gemm_engine **out);
void moe_gemm_engine_free(moe_gemm_engine *engine);
moe_status moe_gemm_engine_run(moe_gemm_engine *engine, const moe_gemm_call *call, const void *A, const void *B,
                               moe_real *C);
/* The same call with the library threading it over the pool's threads, for bench_moe_layer's floor only (the library's
 * own best at whole calls): its bits may depend on the thread count. */
moe_status moe_gemm_engine_run_library_threads(moe_gemm_engine *engine, const moe_gemm_call *call, const void *A,
                                               const void *B, moe_real *C);

/* B prepared for calls of call's shape with prepared_b set, which take the prepared copy as their B: oneDNN's
 * blocked layout that its matmul for call->m rows prefers, in the call's input type (the 64-row blocks then run as
 * fast as one whole call: docs/BENCHMARKS.md); OpenBLAS's plain copy. prepared_bytes: its size; prepare_b: B, plain
 * and in the call's input type (moe_bf16 for a bf16 call, else moe_real), reordered into `prepared`: the same values,
 * in another order. The caller owns the copy (kernels/gemm_rows.h keeps a weight's until the weight changes); any
 * engine's calls of that shape may read it. */
moe_status moe_gemm_engine_prepared_bytes(moe_gemm_engine *engine, const moe_gemm_call *call, size_t *bytes);
moe_status moe_gemm_engine_prepare_b(moe_gemm_engine *engine, const moe_gemm_call *call, const void *B,
                                     void *prepared);
/* 1 when calls of one shape run faster on B prepared for it than on B as held, so that a product cut into such calls
 * pays for the preparation: oneDNN where its matmul runs brgemm (AVX-512 and up; the blocked weights made 64-row
 * blocks as fast as one whole call). 0 for oneDNN's AVX2 sgemm, which ran a prepared B at 0.4-1.3x the plain one's
 * speed, its preparation as long as a 64-row call at fine-grained experts' shapes, and gave the same bits either way
 * (docs/BENCHMARKS.md, "The CPU MoE layer at a fine-grained shape": the layer 1.75x faster without), and for OpenBLAS,
 * whose prepared copy is a plain copy. A rule of the library and the instruction set it runs, never of a call's rows,
 * so that which rows share a call cannot change a bit. */
int moe_gemm_engine_prefers_prepared_b(void);

/* 1 when bf16 calls take moe_bf16 arrays (a real bf16 kernel), 0 when they take moe_real arrays of bf16 values. */
int moe_gemm_native_bf16(void);

/* How bf16 calls run where the library has bf16 kernels (oneDNN on AVX512_BF16 or AMX): on those (native), or as fp32
 * products of the bf16 values (fp32: the same inputs and fp32 accumulation, each product exact in fp32; the sums
 * round per term where the dot-product instruction rounds per pair, so the bits differ at rounding level). The
 * faster one depends on the core: auto takes native with AMX or on an AMD CPU (Zen 4 runs AVX512_BF16 dot products at
 * twice its fp32 FMA rate), fp32 on an Intel CPU without AMX (there the bf16 kernels ran at ~60% of the fp32 ones:
 * docs/BENCHMARKS.md, "bf16 GEMMs on the faster unit"). The mode comes from the MOE_BF16_GEMM environment variable
 * (auto, native or fp32; auto when unset, and when it is anything else, which moe_gemm_library()'s text then names)
 * at the first call, or from set_bf16_mode (tests), which must come before any engine or plan is made. A CPU without
 * bf16 kernels, and OpenBLAS, always run fp32. The choice is in moe_gemm_library()'s text. */
typedef enum { MOE_BF16_GEMM_AUTO, MOE_BF16_GEMM_NATIVE, MOE_BF16_GEMM_FP32 } moe_bf16_gemm_mode;
void moe_gemm_set_bf16_mode(moe_bf16_gemm_mode mode);

/* The library, its exact version and the instruction set its kernels run on, and the bf16 mode, for logs, the run
 * record, checkpoints and benchmark output: "oneDNN 2.6.3, isa avx512_core_bf16 (bf16 kernels, MOE_BF16_GEMM auto)",
 * "OpenBLAS 0.3.21 ..., core Haswell (bf16 emulated in fp32)". Two runs whose texts differ may differ in their
 * last bits (docs/DETERMINISM.md); the same text on the same build gives the same bits. */
const char *moe_gemm_library(void);

#endif
