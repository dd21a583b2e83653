/* gemm_rows_cpu.c — row-wise GEMM in fixed-shape blocks (why: gemm_rows.h), each call on the GEMM engine
 * (kernels/gemm_engine.h). A, C row-major, dense (lda = k, ldc = n); B is [n, k] for CblasTrans and [k, n] for
 * CblasNoTrans. */
#include "kernels/gemm_rows.h"

#include <stdlib.h>
#include <string.h>

#include "core/fail.h"
#include "kernels/cast.h"
#include "kernels/gemm_engine.h"

moe_status moe_gemm_rows_plan_init(moe_gemm_rows_plan *plan, int layout_invariant, int bf16_inputs, int max_width) {
    *plan = (moe_gemm_rows_plan){.row_block = layout_invariant ? MOE_GEMM_ROW_BLOCK : 0, .bf16_inputs = bf16_inputs};
    plan->scratch = malloc((size_t)MOE_GEMM_ROUND_ROWS * 2 * (size_t)max_width * sizeof(moe_real));
    if (!plan->scratch) return MOE_ERR_OUT_OF_MEMORY;
    moe_status st = moe_gemm_engine_create(&plan->engine);
    if (st != MOE_OK) moe_gemm_rows_plan_free(plan);
    return st;
}

void moe_gemm_rows_plan_free(moe_gemm_rows_plan *plan) {
    free(plan->scratch);
    for (int i = 0; i < plan->prepared_count; i++) free(plan->prepared[i].data);
    free(plan->prepared);
    free(plan->once.data);
    free(plan->plain_b);
    for (int i = 0; i < MOE_GEMM_STAGE_SLOTS; i++) free(plan->stage[i]);
    moe_gemm_engine_free(plan->engine);
    *plan = (moe_gemm_rows_plan){0};
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

/* *buffer holding at least `bytes` (its *capacity), grown when it holds fewer */
static moe_status grow(void **buffer, size_t *capacity, size_t bytes) {
    if (*capacity >= bytes) return MOE_OK;
    void *grown = realloc(*buffer, bytes);
    if (!grown) return MOE_ERR_OUT_OF_MEMORY;
    *buffer = grown, *capacity = bytes;
    return MOE_OK;
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
            w->k == key->k && w->accumulate == key->accumulate)
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
                                          .k = call->k,
                                          .accumulate = call->prepared_b && call->accumulate};
    moe_gemm_prepared_weight *w = &plan->once;
    if (plan->bf16_inputs && plan->weights_version) {
        MOE_TRY(kept_copy(plan, B, &key, &w));
        if (w->version == plan->weights_version) return *out = w->data, MOE_OK;
    }
    const size_t count = (size_t)call->n * call->k;
    size_t bytes = count * input_size(plan);
    if (call->prepared_b) MOE_TRY(moe_gemm_engine_prepared_bytes(plan->engine, call, &bytes));
    MOE_TRY(grow(&w->data, &w->bytes, bytes));
    if (call->prepared_b) { /* converted plain (bf16 inputs), then reordered: the conversion is this file's */
        MOE_TRY(grow(&plan->plain_b, &plan->plain_b_bytes, count * input_size(plan)));
        MOE_TRY(moe_gemm_engine_prepare_b(plan->engine, call, as_input(plan, B, count, plan->plain_b), w->data));
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

static moe_status rows_product(moe_gemm_rows_plan *plan, CBLAS_TRANSPOSE trans_b, int rows, int n, int k, operand A,
                               const moe_real *B, moe_real beta, moe_real *C) {
    MOE_TRY(check_beta(beta));
    if (rows == 0) return MOE_OK;
    const int block = plan->row_block;
    moe_gemm_call call = {.trans_b = trans_b == CblasTrans, .n = n, .k = k, .bf16 = native_bf16(plan),
                          .accumulate = beta != 0};
    /* Every call of the blocks has one shape: B is converted and laid out for it once (gemm_engine.h). */
    if (block) call.m = block, call.prepared_b = 1;
    const void *b;
    MOE_TRY(weights_input(plan, &call, B, &b));
    if (block == 0 && !plan->bf16_inputs) {
        call.m = rows;
        return moe_gemm_engine_run(plan->engine, &call, A.data, b, C);
    }
    /* Chunks of MOE_GEMM_ROUND_ROWS rows, each rounded into scratch in one pass (bf16 inputs), each run as blocks
     * of `block` rows (layout-invariant) or as one call. */
    const size_t in_size = input_size(plan);
    const int full = block ? rows / block * block : rows;
    for (int r = 0; r < full; r += MOE_GEMM_ROUND_ROWS) {
        const int chunk = full - r < MOE_GEMM_ROUND_ROWS ? full - r : MOE_GEMM_ROUND_ROWS;
        const char *a = read_input(plan, A, (size_t)r * k, (size_t)chunk * k, plan->scratch);
        call.m = block ? block : chunk;
        for (int i = 0; i < chunk; i += call.m)
            MOE_TRY(moe_gemm_engine_run(plan->engine, &call, a + (size_t)i * k * in_size, b, C + (size_t)(r + i) * n));
    }
    const int tail = rows - full;
    if (tail == 0) return MOE_OK;
    /* The last partial block goes through scratch: [block, k] input (zero-padded) and [block, n] output. */
    char *a = plan->scratch;
    moe_real *c = (moe_real *)(a + (size_t)block * k * sizeof(moe_real));
    const void *tail_rows = read_input(plan, A, (size_t)full * k, (size_t)tail * k, a);
    if (tail_rows != a) memcpy(a, tail_rows, (size_t)tail * k * in_size);
    memset(a + (size_t)tail * k * in_size, 0, (size_t)(block - tail) * k * in_size);
    if (call.accumulate) {
        memcpy(c, C + (size_t)full * n, (size_t)tail * n * sizeof(moe_real));
        memset(c + (size_t)tail * n, 0, (size_t)(block - tail) * n * sizeof(moe_real));
    }
    call.m = block;
    MOE_TRY(moe_gemm_engine_run(plan->engine, &call, a, b, c));
    memcpy(C + (size_t)full * n, c, (size_t)tail * n * sizeof(moe_real));
    return MOE_OK;
}

moe_status moe_gemm_rows_cpu(moe_gemm_rows_plan *plan, CBLAS_TRANSPOSE trans_b, int rows, int n, int k,
                             const moe_real *A, const moe_real *B, moe_real beta, moe_real *C) {
    return rows_product(plan, trans_b, rows, n, k, (operand){A, 0}, B, beta, C);
}

moe_status moe_gemm_rows_staged_cpu(moe_gemm_rows_plan *plan, CBLAS_TRANSPOSE trans_b, int rows, int n, int k,
                                    const void *A, const moe_real *B, moe_real beta, moe_real *C) {
    return rows_product(plan, trans_b, rows, n, k, (operand){A, 1}, B, beta, C);
}

static moe_status at_b_product(moe_gemm_rows_plan *plan, int rows, int m, int n, operand A, operand B, moe_real beta,
                               moe_real *C) {
    MOE_TRY(check_beta(beta));
    if (rows == 0) {
        if (beta == 0) memset(C, 0, (size_t)m * n * sizeof(moe_real));
        return MOE_OK;
    }
    moe_gemm_call call = {.trans_a = 1, .m = m, .n = n, .bf16 = native_bf16(plan), .accumulate = beta != 0};
    if (!plan->bf16_inputs) {
        call.k = rows;
        return moe_gemm_engine_run(plan->engine, &call, A.data, B.data, C);
    }
    char *a = plan->scratch, *b = a + (size_t)MOE_GEMM_ROUND_ROWS * m * input_size(plan);
    for (int r = 0; r < rows; r += MOE_GEMM_ROUND_ROWS) {
        call.k = rows - r < MOE_GEMM_ROUND_ROWS ? rows - r : MOE_GEMM_ROUND_ROWS;
        call.accumulate = r > 0 || beta != 0;
        MOE_TRY(moe_gemm_engine_run(plan->engine, &call, read_input(plan, A, (size_t)r * m, (size_t)call.k * m, a),
                                    read_input(plan, B, (size_t)r * n, (size_t)call.k * n, b), C));
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
