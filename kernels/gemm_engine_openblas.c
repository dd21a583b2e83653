/* gemm_engine_openblas.c — the GEMM engine's OpenBLAS backend (gemm_backend.h; what it guarantees: gemm_engine.h):
 * where oneDNN is not built in, the float64 build's, and MOE_CPU_GEMM=openblas. bf16 inputs are moe_real arrays of
 * bf16 values. Per engine (one thread's) only a product buffer: OpenBLAS keeps no state a call could change.
 *
 * Every call writes its product with beta = 0 (into C, or into the buffer when accumulating, then added once):
 * OpenBLAS's sgemm adds C into its sum after the first k block when given beta = 1.
 *
 * A row product runs as calls of ROW_GROUP rows whose rows are the kernel's M dimension, the one its vector lanes run
 * along: OpenBLAS computes column-major C, and row-major C[m, n] is column-major C^T, where our rows are its N
 * dimension; with them there, a 64-row call gave a row other bits depending on its position in the call on the
 * Haswell/Zen kernels (rows at some positions go through other register blocks and edge kernels: 16842 of 29760 rows
 * in bench/gemm_row_consistency, 2026-12-06). Calls of 16 rows computed as column-major [16, n] = A_g op(B) gave
 * every row the same bits at every position, on the Haswell, Zen, SkylakeX, Sandybridge, Nehalem and Prescott
 * kernels and every shape tried (tests/test_gemm_rows_position.c holds it for the kernels in use); the product then
 * goes through the buffer into C's rows. A weight gradient (trans_a) sums over k and runs as one call. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fail.h"
#include "core/real.h"
#include "kernels/gemm_backend.h"

enum { ROW_GROUP = 16 }; /* rows per call of a row product (see above) */

struct moe_gemm_engine {
    moe_real *product; /* a call's product before it reaches C */
    size_t product_count;
};

static int openblas_native_bf16(void) { return 0; }
static int openblas_prefers_prepared_b(void) { return 0; } /* its prepared copy is a plain one */

static void openblas_set_bf16_mode(moe_bf16_gemm_mode mode) { (void)mode; /* OpenBLAS has no bf16 kernels */ }

static void openblas_describe(char *text, size_t size) {
    snprintf(text, size, "%s, core %s (bf16 emulated in fp32)", openblas_get_config(), openblas_get_corename());
}

static moe_status openblas_create(moe_gemm_engine **out) {
    *out = calloc(1, sizeof **out);
    return *out ? MOE_OK : MOE_ERR_OUT_OF_MEMORY;
}

static void openblas_free(moe_gemm_engine *engine) {
    free(engine->product);
    free(engine);
}

static moe_status openblas_prepared_bytes(moe_gemm_engine *engine, const moe_gemm_call *call, size_t *bytes) {
    (void)engine;
    *bytes = (size_t)call->k * call->n * sizeof(moe_real);
    return MOE_OK;
}

static moe_status openblas_prepare_b(moe_gemm_engine *engine, const moe_gemm_call *call, const void *B,
                                     void *prepared) {
    (void)engine;
    memcpy(prepared, B, (size_t)call->k * call->n * sizeof(moe_real));
    return MOE_OK;
}

static moe_status product_buffer(moe_gemm_engine *e, size_t count) {
    if (e->product_count >= count) return MOE_OK;
    moe_real *grown = realloc(e->product, count * sizeof *grown);
    if (!grown) return MOE_ERR_OUT_OF_MEMORY;
    e->product = grown, e->product_count = count;
    return MOE_OK;
}

/* C = or += A^T B over k rows: one call, beta 0. */
static moe_status weight_gradient(moe_gemm_engine *e, const moe_gemm_call *c, const moe_real *A, const moe_real *B,
                                  moe_real *C) {
    const int ldb = moe__gemm_ldb(c), lda = moe__gemm_lda(c);
    const CBLAS_TRANSPOSE tb = c->trans_b ? CblasTrans : CblasNoTrans;
    if (!c->accumulate) {
        moe__gemm(CblasRowMajor, CblasTrans, tb, c->m, c->n, c->k, 1, A, lda, B, ldb, 0, C, moe__gemm_ldc(c));
        return MOE_OK;
    }
    MOE_TRY(product_buffer(e, (size_t)c->m * c->n));
    moe__gemm(CblasRowMajor, CblasTrans, tb, c->m, c->n, c->k, 1, A, lda, B, ldb, 0, e->product, c->n);
    moe__gemm_store(c, e->product, C);
    return MOE_OK;
}

/* Row i of A op(B) for rows in groups of ROW_GROUP (see above): the group's column-major product P [rows, n] (P[j rows
 * + r] is C[r, j]), then each row written or added into C. */
static moe_status row_product(moe_gemm_engine *e, const moe_gemm_call *c, const moe_real *A, const moe_real *B,
                              moe_real *C) {
    const int lda = moe__gemm_lda(c), ldb = moe__gemm_ldb(c), ldc = moe__gemm_ldc(c);
    /* column-major: A's rows [rows, k] are A^T of a [k, rows] matrix with pitch lda; B stored [n, k] (trans_b) is a
     * column-major [k, n] used as it is, B stored [k, n] a column-major [n, k] used transposed */
    const CBLAS_TRANSPOSE tb = c->trans_b ? CblasNoTrans : CblasTrans;
    MOE_TRY(product_buffer(e, (size_t)ROW_GROUP * c->n));
    for (int r0 = 0; r0 < c->m; r0 += ROW_GROUP) {
        const int rows = c->m - r0 < ROW_GROUP ? c->m - r0 : ROW_GROUP;
        moe__gemm(CblasColMajor, CblasTrans, tb, rows, c->n, c->k, 1, A + (size_t)r0 * lda, lda, B, ldb, 0,
                  e->product, rows);
        for (int r = 0; r < rows; r++) {
            moe_real *row = C + (size_t)(r0 + r) * ldc;
            const moe_real *p = e->product + r;
            if (c->accumulate)
                for (int j = 0; j < c->n; j++) row[j] += p[(size_t)j * rows];
            else
                for (int j = 0; j < c->n; j++) row[j] = p[(size_t)j * rows];
        }
    }
    return MOE_OK;
}

static moe_status openblas_run(moe_gemm_engine *engine, const moe_gemm_call *c, const void *A, const void *B,
                               moe_real *C) {
    /* OpenBLAS's own threads are a process-wide setting that the OpenMP pool's thread count does not reach (its
     * pthreads build): one thread, always (core/threads.c sets it so too); never restored, since another of the
     * pool's threads may be inside a call. */
    if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
    return c->trans_a ? weight_gradient(engine, c, A, B, C) : row_product(engine, c, A, B, C);
}

const moe_gemm_backend moe_gemm_backend_openblas = {
    .name = "openblas",
    .create = openblas_create,
    .free = openblas_free,
    .run = openblas_run,
    .prepared_bytes = openblas_prepared_bytes,
    .prepare_b = openblas_prepare_b,
    .native_bf16 = openblas_native_bf16,
    .prefers_prepared_b = openblas_prefers_prepared_b,
    .set_bf16_mode = openblas_set_bf16_mode,
    .describe = openblas_describe,
};
