/* linear.cu — the dense linear layer's products on cuBLAS (linear.h). The calls, with every transpose, leading
 * dimension, offset and the padded last block, are kernels/linear_gemms.c's list (tests/test_linear_gemms.c runs
 * the same list on the CPU against the CPU's row-wise GEMMs); this file runs them: a padded block's rows go into
 * the plan's PAD_IN (zeros after them; C's rows into PAD_OUT when beta is 1), one full-block cublasSgemm, its rows
 * back. All on the context's stream, in list order. Under MOE_LINEAR_LT a product is instead one pinned cuBLASLt
 * call (kernels/gemm_lt.h) from linear_gemms.c's moe__linear_lt_call, where its shape has one.
 * Checked against the CPU table by tests/test_gpu_dense_table.c, the cuBLASLt calls by tests/test_gpu_gemm_lt.c
 * (build: ninja -C build; run: meson test -C build --suite gpu). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <new>
#include <vector>

#include "core/gpu_cuda.h"

extern "C" {
#include "kernels/cast.h"
#include "kernels/gemm_rows.h"
#include "kernels/linear.h"
#include "kernels/linear_gemms.h"
}

namespace {

cublasOperation_t op(int trans) { return trans ? CUBLAS_OP_T : CUBLAS_OP_N; }

moe_status copy_rows(moe_gpu *gpu, float *dst, const float *src, int rows, int width) {
    MOE_CUDA_TRY(cudaMemcpyAsync(dst, src, (size_t)rows * width * sizeof(float), cudaMemcpyDeviceToDevice,
                                 gpu->stream));
    return MOE_OK;
}

moe_status zero_rows(moe_gpu *gpu, float *dst, int rows, int width) {
    MOE_CUDA_TRY(cudaMemsetAsync(dst, 0, (size_t)rows * width * sizeof(float), gpu->stream));
    return MOE_OK;
}

/* a padded call's block: its token rows into PAD_IN (and C's into PAD_OUT when it accumulates), zeros after them */
moe_status fill_pads(moe_gpu *gpu, const moe__lin_gemm &g, float *const *arrays) {
    const int spare = g.n - g.rows;
    MOE_TRY(copy_rows(gpu, arrays[g.b], arrays[g.token_in] + (size_t)g.first_row * g.ldb, g.rows, g.ldb));
    MOE_TRY(zero_rows(gpu, arrays[g.b] + (size_t)g.rows * g.ldb, spare, g.ldb));
    if (g.beta == 0) return MOE_OK;
    MOE_TRY(copy_rows(gpu, arrays[g.c], arrays[g.token_out] + (size_t)g.first_row * g.ldc, g.rows, g.ldc));
    return zero_rows(gpu, arrays[g.c] + (size_t)g.rows * g.ldc, spare, g.ldc);
}

} // namespace

/* A W's bf16 copy and the weights version it was cast at. */
struct moe__linear_kept_weight {
    const float *W;
    int out, in;
    unsigned long long version;
    moe_bf16 *bf16; /* moe_gemm_lt_b_count elements */
};

struct moe_linear_kept {
    std::vector<moe__linear_kept_weight> weights;
    unsigned long long version; /* 0: keep none */
};

namespace {

/* W [out, in]'s bf16 copy as g reads it as B (forward and backward input lay it out alike: [out, ld_b(in)]), cast
 * again when the version changed since its last cast */
moe_status kept_weight_of(moe_gpu *gpu, moe_linear_kept *kept, const moe_gemm_lt *g, const float *W, int out, int in,
                          const moe_bf16 **b16) {
    moe__linear_kept_weight *w = NULL;
    for (moe__linear_kept_weight &k : kept->weights)
        if (k.W == W && k.out == out && k.in == in) w = &k;
    if (!w) {
        void *copy = NULL;
        MOE_TRY(moe_gpu_alloc(gpu, moe_gemm_lt_b_count(g) * sizeof(moe_bf16), &copy));
        try {
            kept->weights.push_back(moe__linear_kept_weight{W, out, in, 0, (moe_bf16 *)copy});
        } catch (...) { /* no exception leaves for C */
            moe_gpu_free(gpu, copy);
            return MOE_ERR_OUT_OF_MEMORY;
        }
        w = &kept->weights.back();
    }
    if (w->version != kept->version) {
        MOE_TRY(moe_gemm_lt_cast_b(gpu, g, W, w->bf16));
        w->version = kept->version;
    }
    *b16 = w->bf16;
    return MOE_OK;
}

moe_status check_args(const moe_linear_plan *plan, moe__lin_product product, int rows, int in, int out, float beta) {
    if (rows < 0 || in < 1 || out < 1)
        return moe_fail(MOE_ERR_INVALID_ARG, "linear: %d rows of %d -> %d values", rows, in, out);
    if (beta != 0 && beta != 1)
        return moe_fail(MOE_ERR_INVALID_ARG, "linear: beta %g is neither 0 nor 1", (double)beta);
    if (product != MOE__LIN_BACKWARD_WEIGHT && plan->layout_invariant && (in > plan->max_width || out > plan->max_width))
        return moe_fail(MOE_ERR_INVALID_ARG, "linear: rows of %d -> %d values are wider than the plan's %d", in, out,
                        plan->max_width);
    return MOE_OK;
}

/* The product as one pinned cuBLASLt call; *ran 0 when cuBLASLt offers no such algorithm for its shape (the plan's
 * set keeps why), and the SGEMM path runs it. rows >= 1. */
moe_status run_lt(moe_gpu *gpu, const moe_linear_plan *plan, moe__lin_product product, float *const *arrays, int rows,
                  int in, int out, float beta, int *ran) {
    const moe__lin_lt_call c = moe__linear_lt_call(product, rows, in, out, plan->bf16_inputs);
    const moe_gemm_lt *g = NULL;
    *ran = 0;
    MOE_TRY(moe_gemm_lt_set_get(gpu, plan->lt, &c.shape, &g));
    if (!g) return MOE_OK;
    if (plan->kept && plan->kept->version && c.b == MOE__LIN_W) {
        const moe_bf16 *w = NULL;
        MOE_TRY(kept_weight_of(gpu, plan->kept, g, arrays[MOE__LIN_W], out, in, &w));
        MOE_TRY(moe_gemm_lt_run_f32_kept_b(gpu, plan->lt, g, c.M, arrays[c.a], w, beta, arrays[c.d]));
    } else {
        MOE_TRY(moe_gemm_lt_run_f32(gpu, plan->lt, g, c.M, arrays[c.a], arrays[c.b], beta, arrays[c.d]));
    }
    *ran = 1;
    return MOE_OK;
}

/* Under MOE_LINEAR_LT with bf16 inputs the token operands (x, dy) may come unrounded (linear.h): a product that runs
 * as SGEMM, its shape having no pinned algorithm, rounds them first into the plan's buffer, as the pinned call's cast
 * does (round to nearest even; kernels/cast.h), so either path multiplies the same values. */
moe_status round_token_operands(moe_gpu *gpu, moe_linear_rounded *buf, float **arrays, int rows, int in, int out) {
    const moe__lin_array token[] = {MOE__LIN_X, MOE__LIN_DY};
    const size_t width[] = {(size_t)in, (size_t)out};
    size_t total = 0;
    for (int i = 0; i < 2; i++) total += arrays[token[i]] ? (size_t)rows * width[i] : 0;
    if (total * sizeof(float) > buf->nbytes) {
        MOE_TRY(moe_gpu_synchronize(gpu)); /* queued products may still read the old buffer */
        moe_gpu_free(gpu, buf->data);
        buf->data = NULL, buf->nbytes = 0;
        void *grown = NULL;
        MOE_TRY(moe_gpu_alloc(gpu, total * sizeof(float), &grown));
        buf->data = (float *)grown, buf->nbytes = total * sizeof(float);
    }
    float *at = buf->data;
    for (int i = 0; i < 2; i++) {
        if (!arrays[token[i]]) continue;
        const size_t n = (size_t)rows * width[i];
        MOE_TRY(moe_bf16_round_cuda(gpu, arrays[token[i]], n, at));
        arrays[token[i]] = at, at += n;
    }
    return MOE_OK;
}

/* arrays: each moe__lin_array's device pointer (only C operands and token_out are written) */
moe_status run(moe_gpu *gpu, const moe_linear_plan *plan, moe__lin_product product, float *arrays[MOE__LIN_ARRAYS],
               int rows, int in, int out, float beta) {
    MOE_TRY(check_args(plan, product, rows, in, out, beta));
    arrays[MOE__LIN_PAD_IN] = plan->pad_in, arrays[MOE__LIN_PAD_OUT] = plan->pad_out;
    if (product == MOE__LIN_BACKWARD_WEIGHT && rows == 0 && beta == 0) /* an empty sum, as the CPU's */
        return zero_rows(gpu, arrays[MOE__LIN_DW], out, in);
    if (plan->lt && rows > 0) {
        int ran = 0;
        MOE_TRY(run_lt(gpu, plan, product, arrays, rows, in, out, beta, &ran));
        if (ran) return MOE_OK;
        if (plan->rounded) MOE_TRY(round_token_operands(gpu, plan->rounded, arrays, rows, in, out));
    }
    const float one = 1;
    const int count = moe__linear_gemm_count(product, rows, plan->layout_invariant);
    for (int i = 0; i < count; i++) {
        const moe__lin_gemm g = moe__linear_gemm(product, rows, in, out, plan->layout_invariant, beta, i);
        if (g.padded) MOE_TRY(fill_pads(gpu, g, arrays));
        MOE_CUBLAS_TRY(cublasSgemm(gpu->blas, op(g.trans_a), op(g.trans_b), g.m, g.n, g.k, &one,
                                   arrays[g.a] + g.a_off, g.lda, arrays[g.b] + g.b_off, g.ldb, &g.beta,
                                   arrays[g.c] + g.c_off, g.ldc));
        if (g.padded)
            MOE_TRY(copy_rows(gpu, arrays[g.token_out] + (size_t)g.first_row * g.ldc, arrays[g.c], g.rows, g.ldc));
    }
    return MOE_OK;
}

} // namespace

extern "C" moe_status moe_linear_gemm_from_env(moe_linear_gemm *out) {
    const char *v = getenv("MOE_LINEAR_GEMM");
    *out = MOE_LINEAR_SGEMM;
    if (!v || !*v || !strcmp(v, "sgemm")) return MOE_OK;
    if (!strcmp(v, "lt")) {
        *out = MOE_LINEAR_LT;
        return MOE_OK;
    }
    return moe_fail(MOE_ERR_INVALID_CONFIG, "MOE_LINEAR_GEMM=%s: use sgemm (cublasSgemm, the default) or lt (one pinned "
                                            "cuBLASLt call per product, kernels/linear.h)", v);
}

extern "C" moe_status moe_linear_plan_init(moe_gpu *gpu, moe_linear_gemm gemm, int layout_invariant, int bf16_inputs,
                                           int max_width, moe_linear_plan *plan) {
    *plan = moe_linear_plan{};
    plan->layout_invariant = layout_invariant, plan->max_width = max_width, plan->bf16_inputs = bf16_inputs;
    if (gemm != MOE_LINEAR_SGEMM && gemm != MOE_LINEAR_LT)
        return moe_fail(MOE_ERR_INVALID_ARG, "linear: no GEMM mode %d", (int)gemm);
    if (gemm == MOE_LINEAR_LT) MOE_TRY(moe_gemm_lt_context_set(gpu, &plan->lt)); /* the context's: not the plan's */
    if (gemm == MOE_LINEAR_LT && bf16_inputs) { /* the fallback's rounded operands (round_token_operands) */
        plan->rounded = (moe_linear_rounded *)calloc(1, sizeof *plan->rounded);
        const char *keep = getenv("MOE_LINEAR_KEEP_WEIGHTS");
        if (!keep || strcmp(keep, "0")) plan->kept = new (std::nothrow) moe_linear_kept{};
        if (!plan->rounded || (!plan->kept && (!keep || strcmp(keep, "0"))))
            return moe_linear_plan_free(gpu, plan), MOE_ERR_OUT_OF_MEMORY;
    }
    if (!layout_invariant) return MOE_OK;
    moe_status st = max_width < 1 ? moe_fail(MOE_ERR_INVALID_ARG, "linear: max_width %d", max_width) : MOE_OK;
    const size_t nbytes = (size_t)MOE_GEMM_ROW_BLOCK * max_width * sizeof(float);
    void *in = NULL, *out = NULL;
    if (st == MOE_OK) st = moe_gpu_alloc(gpu, nbytes, &in);
    if (st == MOE_OK) st = moe_gpu_alloc(gpu, nbytes, &out);
    plan->pad_in = (float *)in, plan->pad_out = (float *)out;
    if (st != MOE_OK) moe_linear_plan_free(gpu, plan);
    return st;
}

extern "C" void moe_linear_plan_free(moe_gpu *gpu, moe_linear_plan *plan) {
    moe_gpu_free(gpu, plan->pad_in);
    moe_gpu_free(gpu, plan->pad_out);
    if (plan->rounded) moe_gpu_free(gpu, plan->rounded->data);
    free(plan->rounded);
    if (plan->kept)
        for (moe__linear_kept_weight &k : plan->kept->weights) moe_gpu_free(gpu, k.bf16);
    delete plan->kept;
    *plan = moe_linear_plan{};
}

extern "C" void moe_linear_plan_set_weights_version(const moe_linear_plan *plan, unsigned long long version) {
    if (plan->kept) plan->kept->version = version;
}

extern "C" int moe_linear_plan_kept_weights(const moe_linear_plan *plan) {
    return plan->kept ? (int)plan->kept->weights.size() : 0;
}

extern "C" int moe_linear_plan_describe(const moe_linear_plan *plan, char *out, size_t n) {
    if (!plan->lt)
        return plan->layout_invariant ? snprintf(out, n, "cublasSgemm in %d-row blocks", (int)MOE_GEMM_ROW_BLOCK)
                                      : snprintf(out, n, "cublasSgemm, one call per product");
    const int head = snprintf(out, n, "cuBLASLt, one pinned call per product (%s inputs); per shape:\n",
                              plan->bf16_inputs ? "bf16" : "fp32");
    const size_t used = head > 0 ? (size_t)head : 0;
    return head + moe_gemm_lt_set_describe(plan->lt, used < n ? out + used : NULL, used < n ? n - used : 0);
}

extern "C" moe_status moe_linear_forward_cuda(moe_gpu *gpu, const moe_linear_plan *plan, const float *x,
                                              const float *W, int rows, int in, int out, float *y) {
    float *arrays[MOE__LIN_ARRAYS] = {};
    arrays[MOE__LIN_X] = const_cast<float *>(x), arrays[MOE__LIN_W] = const_cast<float *>(W), arrays[MOE__LIN_Y] = y;
    return run(gpu, plan, MOE__LIN_FORWARD, arrays, rows, in, out, 0);
}

extern "C" moe_status moe_linear_backward_input_cuda(moe_gpu *gpu, const moe_linear_plan *plan, const float *dy,
                                                     const float *W, int rows, int in, int out, float beta,
                                                     float *dx) {
    float *arrays[MOE__LIN_ARRAYS] = {};
    arrays[MOE__LIN_DY] = const_cast<float *>(dy), arrays[MOE__LIN_W] = const_cast<float *>(W);
    arrays[MOE__LIN_DX] = dx;
    return run(gpu, plan, MOE__LIN_BACKWARD_INPUT, arrays, rows, in, out, beta);
}

extern "C" moe_status moe_linear_backward_weight_cuda(moe_gpu *gpu, const moe_linear_plan *plan, const float *dy,
                                                      const float *x, int rows, int in, int out, float beta,
                                                      float *dW) {
    float *arrays[MOE__LIN_ARRAYS] = {};
    arrays[MOE__LIN_DY] = const_cast<float *>(dy), arrays[MOE__LIN_X] = const_cast<float *>(x);
    arrays[MOE__LIN_DW] = dW;
    return run(gpu, plan, MOE__LIN_BACKWARD_WEIGHT, arrays, rows, in, out, beta);
}
