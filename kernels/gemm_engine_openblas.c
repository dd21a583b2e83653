/* gemm_engine_openblas.c — the GEMM engine on OpenBLAS (gemm_engine.h): the fallback when oneDNN is not built
 * in, and the float64 build's. Stateless; bf16 inputs are moe_real arrays of bf16 values. */
#include "kernels/gemm_engine.h"

#include <stdio.h>
#include <string.h>

#include "core/real.h"

struct moe_gemm_engine {
    int unused;
};

static moe_gemm_engine the_engine;

int moe_gemm_native_bf16(void) { return 0; }

void moe_gemm_set_bf16_mode(moe_bf16_gemm_mode mode) { (void)mode; /* OpenBLAS has no bf16 kernels */ }

const char *moe_gemm_library(void) {
    static char name[160];
    snprintf(name, sizeof name, "%s, core %s (bf16 emulated in fp32)", openblas_get_config(), openblas_get_corename());
    return name;
}

moe_status moe_gemm_engine_create(moe_gemm_engine **out) {
    *out = &the_engine;
    return MOE_OK;
}

void moe_gemm_engine_free(moe_gemm_engine *engine) { (void)engine; }

moe_status moe_gemm_engine_prepared_bytes(moe_gemm_engine *engine, const moe_gemm_call *call, size_t *bytes) {
    (void)engine;
    *bytes = (size_t)call->k * call->n * sizeof(moe_real);
    return MOE_OK;
}

moe_status moe_gemm_engine_prepare_b(moe_gemm_engine *engine, const moe_gemm_call *call, const void *B,
                                     void *prepared) {
    (void)engine;
    memcpy(prepared, B, (size_t)call->k * call->n * sizeof(moe_real));
    return MOE_OK;
}

moe_status moe_gemm_engine_run(moe_gemm_engine *engine, const moe_gemm_call *c, const void *A, const void *B,
                               moe_real *C) {
    (void)engine;
    const int lda = c->trans_a ? c->m : c->k, ldb = c->trans_b ? c->k : c->n;
    moe__gemm(CblasRowMajor, c->trans_a ? CblasTrans : CblasNoTrans, c->trans_b ? CblasTrans : CblasNoTrans, c->m,
              c->n, c->k, 1, A, lda, B, ldb, c->accumulate ? 1 : 0, C, c->n);
    return MOE_OK;
}
