/* gemm_backend.h — internal to kernels/gemm_engine*.c: one CPU GEMM library behind kernels/gemm_engine.h. A backend
 * is a table of the engine's operations on its own engine type; gemm_engine.c picks one per process and wraps
 * every call in a single-threaded section (the library sees one thread). A backend's run must honour the
 * accumulate and leading-dimension fields and never let the library add into C (gemm_engine.h). */
#ifndef MOE_KERNELS_GEMM_BACKEND_H
#define MOE_KERNELS_GEMM_BACKEND_H

#include <stddef.h>

#include "kernels/gemm_engine.h"

typedef struct {
    const char *name; /* what MOE_CPU_GEMM calls it */
    moe_status (*create)(moe_gemm_engine **out);
    void (*free)(moe_gemm_engine *engine);
    moe_status (*run)(moe_gemm_engine *engine, const moe_gemm_call *call, const void *A, const void *B, moe_real *C);
    moe_status (*prepared_bytes)(moe_gemm_engine *engine, const moe_gemm_call *call, size_t *bytes);
    moe_status (*prepare_b)(moe_gemm_engine *engine, const moe_gemm_call *call, const void *B, void *prepared);
    int (*prefers_prepared_b)(void);
    int (*native_bf16)(void);
    void (*set_bf16_mode)(moe_bf16_gemm_mode mode);
    void (*describe)(char *text, size_t size); /* moe_gemm_library()'s text */
} moe_gemm_backend;

extern const moe_gemm_backend moe_gemm_backend_openblas;
#ifdef MOE_HAVE_ONEDNN
extern const moe_gemm_backend moe_gemm_backend_onednn;
#endif

/* A call's leading dimensions with 0 resolved: A [m, k] (or [k, m] with trans_a), B [k, n] (or [n, k]), C [m, n]. */
static inline int moe__gemm_lda(const moe_gemm_call *c) { return c->lda ? c->lda : c->trans_a ? c->m : c->k; }
static inline int moe__gemm_ldb(const moe_gemm_call *c) { return c->ldb ? c->ldb : c->trans_b ? c->k : c->n; }
static inline int moe__gemm_ldc(const moe_gemm_call *c) { return c->ldc ? c->ldc : c->n; }

/* C[m, n] (pitch ldc) = or += P[m, n] (dense): an accumulating call's one addition per value. */
static inline void moe__gemm_store(const moe_gemm_call *c, const moe_real *P, moe_real *C) {
    const int ldc = moe__gemm_ldc(c);
    for (int i = 0; i < c->m; i++) {
        moe_real *row = C + (size_t)i * ldc;
        const moe_real *p = P + (size_t)i * c->n;
        if (c->accumulate)
            for (int j = 0; j < c->n; j++) row[j] += p[j];
        else
            for (int j = 0; j < c->n; j++) row[j] = p[j];
    }
}

#endif
