/* gemm_rows_cpu.c — row-wise GEMMs in fixed-shape blocks and weight gradients in fixed bands of rows (why:
 * gemm_rows.h), each call on the GEMM engine (kernels/gemm_engine.h), the calls of a product spread over the pool's
 * threads. A, C row-major, dense (lda = k, ldc = n); B is [n, k] for CblasTrans and [k, n] for CblasNoTrans. */
#include "kernels/gemm_rows.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "core/fail.h"
#include "core/threads.h"
#include "kernels/cast.h"
#include "kernels/gemm_engine.h"

moe_status moe_gemm_rows_plan_init(moe_gemm_rows_plan *plan, int layout_invariant, int bf16_inputs, int max_width) {
    *plan = (moe_gemm_rows_plan){.row_block = layout_invariant ? MOE_GEMM_ROW_BLOCK : 0, .bf16_inputs = bf16_inputs,
                                 .prepare_b = layout_invariant && moe_gemm_engine_prefers_prepared_b(),
                                 .max_width = max_width > 0 ? max_width : 1};
    return MOE_OK;
}

void moe_gemm_rows_plan_free(moe_gemm_rows_plan *plan) {
    for (int i = 0; i < plan->worker_count; i++) {
        moe_gemm_engine_free(plan->workers[i].engine);
        free(plan->workers[i].scratch);
        free(plan->workers[i].slice);
    }
    free(plan->workers);
    free(plan->rounded);
    for (int i = 0; i < plan->prepared_count; i++) free(plan->prepared[i].data);
    free(plan->prepared);
    free(plan->once.data);
    free(plan->plain_b);
    for (int i = 0; i < MOE_GEMM_STAGE_SLOTS; i++) free(plan->stage[i]);
    *plan = (moe_gemm_rows_plan){0};
}

/* *buffer holding at least `bytes` (its *capacity), grown when it holds fewer. realloc, not a cache-line-aligned
 * allocation: with the prepared weights at 64-byte (or page) alignment oneDNN's AVX2 sgemm ran the layer's 64-row
 * blocks 1.4-1.6x slower than at malloc's 16 (bench_moe_layer, 2026-12-06). Measured since (Zen 3, oneDNN 2.6.3):
 * its 64-row calls read a B held [k, n] ~2x slower at 0 or 32 bytes past a 64-byte boundary than at 16 or 48, a B
 * held [n, k] alike at each, the bits the same (bench_gemm_onednn --b-offset; docs/BENCHMARKS.md). glibc's large
 * blocks lie at 16; placing ours there on purpose waits for the same measure on another AVX2 CPU. */
static moe_status grow(void **buffer, size_t *capacity, size_t bytes) {
    if (*capacity >= bytes) return MOE_OK;
    void *grown = realloc(*buffer, bytes ? bytes : 1);
    if (!grown) return MOE_ERR_OUT_OF_MEMORY;
    *buffer = grown, *capacity = bytes;
    return MOE_OK;
}

/* Workers 0 .. count-1 made (an engine and scratch each), so that count threads can run calls. Outside any parallel
 * region. */
static moe_status reserve_workers(moe_gemm_rows_plan *plan, int count) {
    if (count <= plan->worker_count) return MOE_OK;
    moe_gemm_worker *grown = realloc(plan->workers, (size_t)count * sizeof *grown);
    if (!grown) return MOE_ERR_OUT_OF_MEMORY;
    plan->workers = grown;
    const size_t scratch = (size_t)MOE_GEMM_ROUND_ROWS * 2 * (size_t)plan->max_width * sizeof(moe_real);
    while (plan->worker_count < count) {
        moe_gemm_worker *w = &plan->workers[plan->worker_count];
        size_t capacity = 0;
        *w = (moe_gemm_worker){0};
        MOE_TRY(grow(&w->scratch, &capacity, scratch));
        moe_status st = moe_gemm_engine_create(&w->engine);
        if (st != MOE_OK) return free(w->scratch), st;
        plan->worker_count++;
    }
    return MOE_OK;
}

/* One call of a product: job `job` of its list, on worker w. */
typedef moe_status (*product_job)(moe_gemm_rows_plan *plan, moe_gemm_worker *w, int job, const void *product);

/* Runs jobs 0 .. count-1 of a product: over the pool's threads (static schedule, one worker each) when called outside
 * a parallel region with more than one job and thread, else in order on worker 0. Every job writes its own part of
 * the output, so the result is the same either way. A failed job's status and message are the lowest failed job's. */
static moe_status run_jobs(moe_gemm_rows_plan *plan, int count, product_job job, const void *product) {
    int threads = 1;
#ifdef _OPENMP
    if (!omp_in_parallel()) threads = moe_threads_get();
#endif
    if (threads > count) threads = count;
    MOE_TRY(reserve_workers(plan, threads > 1 ? threads : 1));
    if (threads <= 1) {
        for (int j = 0; j < count; j++) MOE_TRY(job(plan, &plan->workers[0], j, product));
        return MOE_OK;
    }
    moe_status failure = MOE_OK;
    int failed_job = count;
    char message[512] = "";
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int j = 0; j < count; j++) {
        const moe_status st = job(plan, &plan->workers[moe__thread_id()], j, product);
        if (st != MOE_OK) {
#pragma omp critical
            if (j < failed_job) {
                failed_job = j, failure = st;
                snprintf(message, sizeof message, "%s", moe_failure_message(st));
            }
        }
    }
    return failure == MOE_OK ? MOE_OK : moe_fail(failure, "%s", message);
}

void moe_round_bf16_cpu(const moe_real *src, size_t n, moe_real *dst) {
#ifdef MOE_REAL_IS_DOUBLE
    for (size_t i = 0; i < n; i++) dst[i] = (moe_real)moe_bf16_round((float)src[i]);
#else
    moe_bf16_round_n(src, n, dst);
#endif
}

/* A native bf16 engine takes moe_bf16 operands; the others moe_real ones holding bf16 values. */
static int native_bf16(const moe_gemm_rows_plan *plan) { return plan->bf16_inputs && moe_gemm_native_bf16(); }
static size_t input_size(const moe_gemm_rows_plan *plan) {
    return native_bf16(plan) ? sizeof(moe_bf16) : sizeof(moe_real);
}

/* count values of an input as a call reads them: x itself (fp32), or rounded to bf16 into dst. */
static const void *as_input(const moe_gemm_rows_plan *plan, const moe_real *x, size_t count, void *dst) {
    if (!plan->bf16_inputs) return x;
#ifndef MOE_REAL_IS_DOUBLE
    if (native_bf16(plan)) {
        moe_bf16_from_float_n(x, count, dst);
        return dst;
    }
#endif
    moe_round_bf16_cpu(x, count, dst);
    return dst;
}

/* An input of the calls: fp32 values converted on the way in, or values already staged (moe_gemm_rows_stage). */
typedef struct {
    const void *data;
    int staged;
} operand;

/* count values of x from value `first` on, as a call reads them: staged values as they are, else as_input into dst */
static const void *read_input(const moe_gemm_rows_plan *plan, operand x, size_t first, size_t count, void *dst) {
    if (x.staged) return (const char *)x.data + first * input_size(plan);
    return as_input(plan, (const moe_real *)x.data + first, count, dst);
}

moe_status moe_gemm_rows_stage(moe_gemm_rows_plan *plan, int slot, const moe_real *x, size_t count, const void **out) {
    *out = x;
    if (!plan->bf16_inputs) return MOE_OK;
    if (slot < 0 || slot >= MOE_GEMM_STAGE_SLOTS)
        return moe_fail(MOE_ERR_INVALID_ARG, "gemm_rows: stage slot %d is not in [0, %d)", slot, MOE_GEMM_STAGE_SLOTS);
    const size_t bytes = (count ? count : 1) * input_size(plan);
    if (plan->stage_source.get) {
        void *buffer;
        MOE_TRY(plan->stage_source.get(plan->stage_source.ctx, slot, bytes, &buffer));
        *out = as_input(plan, x, count, buffer);
        return MOE_OK;
    }
    MOE_TRY(grow(&plan->stage[slot], &plan->stage_bytes[slot], bytes));
    *out = as_input(plan, x, count, plan->stage[slot]);
    return MOE_OK;
}

moe_status moe_gemm_rows_reserve_stage(moe_gemm_rows_plan *plan, int slot, size_t count, int rounded) {
    if (!plan->bf16_inputs || (rounded && !native_bf16(plan))) return MOE_OK; /* such inputs are not staged */
    if (slot < 0 || slot >= MOE_GEMM_STAGE_SLOTS)
        return moe_fail(MOE_ERR_INVALID_ARG, "gemm_rows: stage slot %d is not in [0, %d)", slot, MOE_GEMM_STAGE_SLOTS);
    const size_t bytes = (count ? count : 1) * input_size(plan);
    void *buffer;
    if (plan->stage_source.get) return plan->stage_source.get(plan->stage_source.ctx, slot, bytes, &buffer);
    return grow(&plan->stage[slot], &plan->stage_bytes[slot], bytes);
}

int moe_gemm_rows_caller_rounds(const moe_gemm_rows_plan *plan) { return plan->bf16_inputs && !native_bf16(plan); }

moe_status moe_gemm_rows_stage_rounded(moe_gemm_rows_plan *plan, int slot, const moe_real *x, size_t count,
                                       const void **out) {
    if (!native_bf16(plan)) return *out = x, MOE_OK; /* an fp32 plan stages x itself too */
    return moe_gemm_rows_stage(plan, slot, x, count, out);
}

const void *moe_gemm_rows_staged_at(const moe_gemm_rows_plan *plan, const void *staged, size_t index) {
    return (const char *)staged + index * input_size(plan);
}

void moe_gemm_rows_plan_set_weights_version(moe_gemm_rows_plan *plan, unsigned long long version) {
    plan->weights_version = version;
}

/* The kept copy of B for key's calls: the one made from B, or a stale one to reuse, or a new one (version 0 when it
 * has to be made). */
static moe_status kept_copy(moe_gemm_rows_plan *plan, const moe_real *B, const moe_gemm_prepared_weight *key,
                            moe_gemm_prepared_weight **out) {
    moe_gemm_prepared_weight *stale = NULL;
    for (int i = 0; i < plan->prepared_count; i++) {
        moe_gemm_prepared_weight *w = &plan->prepared[i];
        if (w->source == B && w->trans_b == key->trans_b && w->block == key->block && w->n == key->n &&
            w->k == key->k)
            return *out = w, MOE_OK;
        if (!stale && w->version != plan->weights_version) stale = w;
    }
    if (!stale) {
        if (plan->prepared_count == plan->prepared_capacity) {
            const int capacity = plan->prepared_capacity ? 2 * plan->prepared_capacity : 16;
            moe_gemm_prepared_weight *grown = realloc(plan->prepared, (size_t)capacity * sizeof *grown);
            if (!grown) return MOE_ERR_OUT_OF_MEMORY;
            plan->prepared = grown, plan->prepared_capacity = capacity;
        }
        stale = &plan->prepared[plan->prepared_count++];
        *stale = (moe_gemm_prepared_weight){0};
    }
    void *data = stale->data;
    const size_t bytes = stale->bytes;
    *stale = *key;
    stale->data = data, stale->bytes = bytes, stale->version = 0;
    return *out = stale, MOE_OK;
}

/* B [n, k] (trans_b) or [k, n] as call's calls read it: B itself (fp32 whole calls), or its prepared copy
 * (gemm_rows.h): rounded to bf16 (bf16 inputs) and laid out for the row blocks (call->prepared_b), or converted
 * plain. */
static moe_status weights_input(moe_gemm_rows_plan *plan, const moe_gemm_call *call, const moe_real *B,
                                const void **out) {
    *out = B;
    if (!plan->bf16_inputs && !call->prepared_b) return MOE_OK;
    const moe_gemm_prepared_weight key = {.source = B,
                                          .trans_b = call->trans_b,
                                          .block = call->prepared_b ? call->m : 0,
                                          .n = call->n,
                                          .k = call->k};
    moe_gemm_prepared_weight *w = &plan->once;
    if (plan->bf16_inputs && plan->weights_version) {
        MOE_TRY(kept_copy(plan, B, &key, &w));
        if (w->version == plan->weights_version) return *out = w->data, MOE_OK;
    }
    const size_t count = (size_t)call->n * call->k;
    size_t bytes = count * input_size(plan);
    moe_gemm_engine *engine = plan->workers[0].engine; /* the calling thread's (reserve_workers made it) */
    if (call->prepared_b) MOE_TRY(moe_gemm_engine_prepared_bytes(engine, call, &bytes));
    MOE_TRY(grow(&w->data, &w->bytes, bytes));
    if (call->prepared_b) { /* converted plain (bf16 inputs), then reordered: the conversion is this file's */
        MOE_TRY(grow(&plan->plain_b, &plan->plain_b_bytes, count * input_size(plan)));
        MOE_TRY(moe_gemm_engine_prepare_b(engine, call, as_input(plan, B, count, plan->plain_b), w->data));
    } else {
        as_input(plan, B, count, w->data);
    }
    if (w != &plan->once) w->version = plan->weights_version;
    *out = w->data;
    return MOE_OK;
}

static moe_status check_beta(moe_real beta) {
    return beta == 0 || beta == 1 ? MOE_OK : moe_fail(MOE_ERR_INVALID_ARG, "gemm_rows: beta %g is neither 0 nor 1",
                                                      (double)beta);
}

/* A row product: calls of `block` rows (the last one zero-padded) when layout-invariant, else of MOE_GEMM_ROUND_ROWS
 * rows (the last one shorter). */
typedef struct {
    moe_gemm_call call; /* m is each call's */
    int rows, block;
    operand A;
    const void *b; /* B as the calls read it (weights_input) */
    moe_real *C;
} row_product;

static moe_status row_block_job(moe_gemm_rows_plan *plan, moe_gemm_worker *w, int job, const void *product) {
    const row_product *p = product;
    moe_gemm_call call = p->call;
    const int first = job * p->block, rows = p->rows - first < p->block ? p->rows - first : p->block;
    const int k = call.k, n = call.n;
    const size_t in_size = input_size(plan);
    const int padded = plan->row_block && rows < p->block;
    const void *a = read_input(plan, p->A, (size_t)first * k, (size_t)rows * k, w->scratch);
    moe_real *C = p->C + (size_t)first * n;
    if (!padded) {
        call.m = rows;
        return moe_gemm_engine_run(w->engine, &call, a, p->b, C);
    }
    /* The last partial block goes through scratch: [block, k] input (zero-padded) and [block, n] output, then its
     * rows written or added (one addition per value, as the engine's own) into C. */
    char *in = w->scratch;
    moe_real *out = (moe_real *)(in + (size_t)p->block * k * sizeof(moe_real));
    if (a != in) memcpy(in, a, (size_t)rows * k * in_size);
    memset(in + (size_t)rows * k * in_size, 0, (size_t)(p->block - rows) * k * in_size);
    call.m = p->block, call.accumulate = 0;
    MOE_TRY(moe_gemm_engine_run(w->engine, &call, in, p->b, out));
    for (size_t i = 0; i < (size_t)rows * n; i++) C[i] = p->call.accumulate ? C[i] + out[i] : out[i];
    return MOE_OK;
}

static moe_status rows_product(moe_gemm_rows_plan *plan, CBLAS_TRANSPOSE trans_b, int rows, int n, int k, operand A,
                               const moe_real *B, moe_real beta, moe_real *C) {
    MOE_TRY(check_beta(beta));
    if (k > plan->max_width || n > plan->max_width) /* the workers' scratch holds rows of max_width */
        return moe_fail(MOE_ERR_INVALID_ARG, "gemm_rows: a product of k %d and n %d past the plan's max_width %d", k, n,
                        plan->max_width);
    if (rows == 0) return MOE_OK;
    MOE_TRY(reserve_workers(plan, 1));
    row_product p = {.call = {.trans_b = trans_b == CblasTrans, .n = n, .k = k, .bf16 = native_bf16(plan),
                              .accumulate = beta != 0},
                     .rows = rows, .block = plan->row_block ? plan->row_block : MOE_GEMM_ROUND_ROWS, .A = A, .C = C};
    /* Every call of the blocks has one shape: B is laid out for it once where the library prefers that (gemm_engine.h),
     * and converted to the calls' input type once either way. */
    if (plan->row_block) p.call.m = plan->row_block, p.call.prepared_b = plan->prepare_b;
    MOE_TRY(weights_input(plan, &p.call, B, &p.b));
    return run_jobs(plan, (rows + p.block - 1) / p.block, row_block_job, &p);
}

moe_status moe_gemm_rows_cpu(moe_gemm_rows_plan *plan, CBLAS_TRANSPOSE trans_b, int rows, int n, int k,
                             const moe_real *A, const moe_real *B, moe_real beta, moe_real *C) {
    return rows_product(plan, trans_b, rows, n, k, (operand){A, 0}, B, beta, C);
}

moe_status moe_gemm_rows_staged_cpu(moe_gemm_rows_plan *plan, CBLAS_TRANSPOSE trans_b, int rows, int n, int k,
                                    const void *A, const moe_real *B, moe_real beta, moe_real *C) {
    return rows_product(plan, trans_b, rows, n, k, (operand){A, 1}, B, beta, C);
}

/* A weight gradient C[m, n] (+)= A^T B over `rows` rows: one job per band of at most MOE_GEMM_BAND_ROWS output rows,
 * each band's calls over all rows (fp32) or over chunks of MOE_GEMM_ROUND_ROWS rows added in order (bf16 inputs,
 * rounded: staged, or a chunk at a time by at_b_product). A band reads B whole and its columns of A, copied dense
 * when the band is not all of C (gemm_rows.h says why). */
typedef struct {
    moe_gemm_call call; /* m, k and accumulate are each call's */
    int rows, m, accumulate;
    const void *A, *B;
    moe_real *C;
} weight_gradient;

static moe_status band_job(moe_gemm_rows_plan *plan, moe_gemm_worker *w, int job, const void *product) {
    const weight_gradient *p = product;
    const size_t in_size = input_size(plan);
    const int i0 = job * MOE_GEMM_BAND_ROWS, n = p->call.n;
    moe_gemm_call call = p->call;
    call.m = p->m - i0 < MOE_GEMM_BAND_ROWS ? p->m - i0 : MOE_GEMM_BAND_ROWS;
    const int whole = call.m == p->m;
    const int chunk = plan->bf16_inputs ? MOE_GEMM_ROUND_ROWS : p->rows;
    const size_t slice_rows = (size_t)(chunk < p->rows ? chunk : p->rows);
    if (!whole) MOE_TRY(grow(&w->slice, &w->slice_bytes, slice_rows * call.m * in_size));
    for (int r = 0; r < p->rows; r += chunk) {
        call.k = p->rows - r < chunk ? p->rows - r : chunk;
        call.accumulate = r > 0 || p->accumulate;
        const char *a = (const char *)p->A + ((size_t)r * p->m + i0) * in_size;
        if (!whole) { /* columns [i0, i0 + m) of the chunk's rows of A */
            for (int t = 0; t < call.k; t++)
                memcpy((char *)w->slice + (size_t)t * call.m * in_size, a + (size_t)t * p->m * in_size,
                       (size_t)call.m * in_size);
            a = w->slice;
        }
        const char *b = (const char *)p->B + (size_t)r * n * in_size;
        MOE_TRY(moe_gemm_engine_run(w->engine, &call, a, b, p->C + (size_t)i0 * n));
    }
    return MOE_OK;
}

static moe_status at_b_product(moe_gemm_rows_plan *plan, int rows, int m, int n, operand A, operand B, moe_real beta,
                               moe_real *C) {
    MOE_TRY(check_beta(beta));
    if (rows == 0) {
        if (beta == 0) memset(C, 0, (size_t)m * n * sizeof(moe_real));
        return MOE_OK;
    }
    weight_gradient p = {.call = {.trans_a = 1, .n = n, .bf16 = native_bf16(plan)}, .rows = rows, .m = m,
                         .accumulate = beta != 0, .A = A.data, .B = B.data, .C = C};
    const int bands = (m + MOE_GEMM_BAND_ROWS - 1) / MOE_GEMM_BAND_ROWS;
    if (!plan->bf16_inputs || (A.staged && B.staged)) return run_jobs(plan, bands, band_job, &p);
    /* Rounded here a chunk at a time (the bands' calls read each chunk): the same calls as on staged inputs. */
    const size_t in_size = input_size(plan);
    MOE_TRY(grow(&plan->rounded, &plan->rounded_bytes, (size_t)MOE_GEMM_ROUND_ROWS * (m + n) * in_size));
    char *a = plan->rounded, *b = a + (size_t)MOE_GEMM_ROUND_ROWS * m * in_size;
    for (int r = 0; r < rows; r += MOE_GEMM_ROUND_ROWS) {
        p.rows = rows - r < MOE_GEMM_ROUND_ROWS ? rows - r : MOE_GEMM_ROUND_ROWS;
        p.accumulate = r > 0 || beta != 0;
        p.A = read_input(plan, A, (size_t)r * m, (size_t)p.rows * m, a);
        p.B = read_input(plan, B, (size_t)r * n, (size_t)p.rows * n, b);
        MOE_TRY(run_jobs(plan, bands, band_job, &p));
    }
    return MOE_OK;
}

moe_status moe_gemm_rows_at_b_cpu(moe_gemm_rows_plan *plan, int rows, int m, int n, const moe_real *A,
                                  const moe_real *B, moe_real beta, moe_real *C) {
    return at_b_product(plan, rows, m, n, (operand){A, 0}, (operand){B, 0}, beta, C);
}

moe_status moe_gemm_rows_at_b_staged_cpu(moe_gemm_rows_plan *plan, int rows, int m, int n, const void *A,
                                         const void *B, moe_real beta, moe_real *C) {
    return at_b_product(plan, rows, m, n, (operand){A, 1}, (operand){B, 1}, beta, C);
}
