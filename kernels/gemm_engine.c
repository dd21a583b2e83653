/* gemm_engine.c — the GEMM engine (gemm_engine.h): the library chosen once per process (MOE_CPU_GEMM), and every
 * library call made single-threaded. The OpenMP pool is the libraries' pool too (oneDNN's runtime is libgomp), so the
 * calling thread's thread count is set to 1 around each call and given back after: inside a parallel region that is
 * the calling thread's own setting (the region's other threads run their own calls); outside one, the library would
 * otherwise thread the call itself, and oneDNN chooses its blocking, k splits included, by the thread count it sees
 * when it builds a primitive. OpenBLAS is held at one thread by core/threads.c. */
#include "kernels/gemm_engine.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "core/fail.h"
#include "kernels/gemm_backend.h"

static const moe_gemm_backend *backend;
static char refused[160]; /* why MOE_CPU_GEMM could not be honoured ("" when it was) */
static pthread_once_t backend_once = PTHREAD_ONCE_INIT;

static void choose_backend(void) {
#ifdef MOE_HAVE_ONEDNN
    backend = &moe_gemm_backend_onednn;
#else
    backend = &moe_gemm_backend_openblas;
#endif
    const char *asked = getenv("MOE_CPU_GEMM");
    if (!asked || !*asked || !strcmp(asked, backend->name)) return;
    if (!strcmp(asked, moe_gemm_backend_openblas.name)) {
        backend = &moe_gemm_backend_openblas;
        return;
    }
    if (!strcmp(asked, "onednn"))
        snprintf(refused, sizeof refused, "MOE_CPU_GEMM=onednn, but this build has no oneDNN (libdnnl-dev was not "
                 "found when it was configured); unset it for OpenBLAS");
    else
        snprintf(refused, sizeof refused, "MOE_CPU_GEMM=%.40s is neither onednn nor openblas", asked);
}

static const moe_gemm_backend *the_backend(void) {
    pthread_once(&backend_once, choose_backend);
    return backend;
}

/* The library sees one thread inside: see the top of this file. */
static int serial_begin(void) {
#ifdef _OPENMP
    const int saved = omp_get_max_threads();
    if (saved != 1) omp_set_num_threads(1);
    return saved;
#else
    return 1;
#endif
}

static void serial_end(int saved) {
#ifdef _OPENMP
    if (saved != 1) omp_set_num_threads(saved);
#else
    (void)saved;
#endif
}

moe_status moe_gemm_engine_available(void) {
    the_backend();
    return *refused ? moe_fail(MOE_ERR_INVALID_CONFIG, "%s", refused) : MOE_OK;
}

moe_status moe_gemm_engine_create(moe_gemm_engine **out) {
    const moe_gemm_backend *b = the_backend();
    MOE_TRY(moe_gemm_engine_available());
    const int saved = serial_begin();
    const moe_status st = b->create(out);
    serial_end(saved);
    return st;
}

void moe_gemm_engine_free(moe_gemm_engine *engine) {
    if (engine) the_backend()->free(engine);
}

static moe_status check_call(const moe_gemm_call *c) {
    if (c->m < 0 || c->n < 0 || c->k < 0 || (c->prepared_b && (c->lda || c->ldb || c->ldc)))
        return moe_fail(MOE_ERR_INVALID_ARG, "gemm engine: call [%d x %d] x [%d x %d] (prepared B %d, pitches %d %d "
                        "%d) is not one the engine runs", c->m, c->k, c->k, c->n, c->prepared_b, c->lda, c->ldb,
                        c->ldc);
    return MOE_OK;
}

moe_status moe_gemm_engine_run(moe_gemm_engine *engine, const moe_gemm_call *call, const void *A, const void *B,
                               moe_real *C) {
    MOE_TRY(check_call(call));
    if (call->m == 0 || call->n == 0) return MOE_OK;
    if (call->k == 0) { /* an empty sum: C = 0, or C + 0 (which is C but for a -0) */
        for (int i = 0; i < call->m; i++) {
            moe_real *row = C + (size_t)i * moe__gemm_ldc(call);
            for (int j = 0; j < call->n; j++) row[j] = call->accumulate ? row[j] + 0 : 0;
        }
        return MOE_OK;
    }
    const int saved = serial_begin();
    const moe_status st = the_backend()->run(engine, call, A, B, C);
    serial_end(saved);
    return st;
}

moe_status moe_gemm_engine_run_library_threads(moe_gemm_engine *engine, const moe_gemm_call *call, const void *A,
                                               const void *B, moe_real *C) {
    MOE_TRY(check_call(call));
    return call->m && call->n && call->k ? the_backend()->run(engine, call, A, B, C)
                                         : moe_gemm_engine_run(engine, call, A, B, C);
}

moe_status moe_gemm_engine_prepared_bytes(moe_gemm_engine *engine, const moe_gemm_call *call, size_t *bytes) {
    const int saved = serial_begin();
    const moe_status st = the_backend()->prepared_bytes(engine, call, bytes);
    serial_end(saved);
    return st;
}

/* The reorder itself runs on the library's threads: it permutes values (exactly), so the thread count cannot change
 * a bit of it, and on one thread it held the others up (the weights of an fp32 plan are laid out at every call). The
 * matmul it lays B out for is built first, single-threaded, like every other (its layout comes from that build). */
moe_status moe_gemm_engine_prepare_b(moe_gemm_engine *engine, const moe_gemm_call *call, const void *B,
                                     void *prepared) {
    size_t bytes;
    MOE_TRY(moe_gemm_engine_prepared_bytes(engine, call, &bytes));
    return the_backend()->prepare_b(engine, call, B, prepared);
}

int moe_gemm_native_bf16(void) { return the_backend()->native_bf16(); }

int moe_gemm_engine_prefers_prepared_b(void) { return the_backend()->prefers_prepared_b(); }

void moe_gemm_set_bf16_mode(moe_bf16_gemm_mode mode) { the_backend()->set_bf16_mode(mode); }

const char *moe_gemm_library(void) {
    static char text[320];
    const moe_gemm_backend *b = the_backend();
    if (*refused) {
        snprintf(text, sizeof text, "none: %s", refused);
        return text;
    }
    b->describe(text, sizeof text);
    return text;
}
