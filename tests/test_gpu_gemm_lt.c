/* test_gpu_gemm_lt.c — the pinned cuBLASLt GEMMs (kernels/gemm_lt.h) as the dense linear runs them under
 * MOE_LINEAR_LT (kernels/linear.h; issue 50, item 2), for each of the three products at a few shapes, with bf16 inputs
 * and with fp32 inputs (the router's), beta 0 and 1:
 *   invariance  each row of a call of M rows, M in {1, 37, 64, 65, 1000, 8192, 16384}, the call starting at another
 *               row of the inputs, has the bits of the same row in the call of 16384 rows (the rows: token rows; a
 *               weight gradient's output rows, for which the smaller calls get their columns of dy copied out)
 *   repeat      the 16384-row call run again gives the same bits
 *   accuracy    the 16384-row call against one cublasSgemm of the same values under the pedantic handle
 *               (MOE_LINEAR_SGEMM without row blocks), within the "linear" tolerance row: bf16 values multiply
 *               exactly in fp32, so the two differ in the order of their sums only
 *   pinned      every shape has a pinned algorithm (a fallback to cublasSgemm fails the test); each shape's
 *               configuration is printed (moe_linear_plan_describe), what the run record is to carry.
 *   unrounded   under bf16, token operands (x, dy) that are not bf16 values give each product the bits of their
 *               rounded values (the call's cast rounds them: the dense table no longer rounds them first)
 *   kept        with a weights version set (kernels/linear.h's kept weights), forward and backward input give the
 *               bits of the uncached calls from one kept copy of W; W changed in place under the same version still
 *               computes with the kept copy (it is not cast again), and a new version casts it again
 * Outputs are poisoned (NaN) before every beta-0 call: beta 0 must not read them. Inputs under bf16 hold bf16 values,
 * as the model's GEMM inputs do, but in the unrounded case. Exit 77 (skip) without a GPU.
 * Run: meson test -C build test_gpu_gemm_lt (or build/tests/test_gpu_gemm_lt). */
#include <stdlib.h>
#include <string.h>

#include "kernels/cast.h"
#include "kernels/gemm_lt.h"
#include "kernels/linear.h"
#include "kernels/linear_gemms.h"
#include "tests/test_gpu_util.h"
#include "tests/test_tolerance.h"

enum { MAX_ROWS = 16384 };
static const int kRows[] = {1, 37, 64, 65, 1000, 8192, MAX_ROWS};
static const char *const kProductNames[] = {"forward", "backward input", "backward weight"};

typedef struct {
    const char *name;
    int bf16, in, out; /* W [out, in] */
    int tokens;        /* the weight gradient's rows (its K) */
} shape_case;

static const shape_case kShapes[] = {
    {"bf16, W [512, 256]", 1, 256, 512, 300},
    {"bf16, W [96, 1024]", 1, 1024, 96, 517},
    {"bf16, W [36, 100] (rows of no whole 16 bytes)", 1, 100, 36, 45},
    {"fp32, the router's W [8, 256]", 0, 256, 8, 300},
    {"fp32, W [64, 1024]", 0, 1024, 64, 129},
};

static float *host_floats(size_t count) {
    float *p = malloc((count ? count : 1) * sizeof(float));
    if (!p) {
        fprintf(stderr, "test_gpu_gemm_lt: out of memory\n");
        exit(1);
    }
    return p;
}

/* count uniform values, rounded to bf16 when the case is bf16 */
static float *inputs(moe_rng *rng, size_t count, double scale, int bf16) {
    float *p = test_alloc_uniform(rng, count, scale);
    if (bf16) moe_bf16_round_n(p, count, p);
    return p;
}

/* One product of a case as the linear runs it: A, B device inputs, D the output ([M, N]), M its varying rows. */
typedef struct {
    moe_gpu *gpu;
    const shape_case *c;
    moe__lin_product product;
} product_run;

static moe_status run(const product_run *r, const moe_linear_plan *plan, int M, const float *A, const float *B,
                      float beta, float *D) {
    const int in = r->c->in, out = r->c->out;
    switch (r->product) {
    case MOE__LIN_FORWARD: return moe_linear_forward_cuda(r->gpu, plan, A, B, M, in, out, D);
    case MOE__LIN_BACKWARD_INPUT: return moe_linear_backward_input_cuda(r->gpu, plan, A, B, M, in, out, beta, D);
    default: return moe_linear_backward_weight_cuda(r->gpu, plan, A, B, r->c->tokens, in, M, beta, D);
    }
}

/* count floats on the device at `shift` floats into a buffer of its own (*base, to free): a shift of 1 leaves the
 * array 4-byte aligned only, as an array at an odd row of another can be, which the calls must stage */
static float *device_at(moe_gpu *gpu, const float *host, size_t count, int shift, float **base) {
    *base = test_gpu_alloc(gpu, (count + (size_t)shift) * sizeof(float)); /* poisoned */
    if (host) CHECK_OK(moe_gpu_upload(gpu, *base + shift, host, count * sizeof(float)));
    return *base + shift;
}

/* D [M, N] on the device for a call: D0's rows [first, first + M) under beta 1, else poison */
static float *output_for(moe_gpu *gpu, const float *D0, int first, int M, int N, float beta, int shift, float **base) {
    return device_at(gpu, beta != 0 ? D0 + (size_t)first * N : NULL, (size_t)M * N, shift, base);
}

static float *download(moe_gpu *gpu, const float *d, size_t count) {
    float *h = host_floats(count);
    test_gpu_download(gpu, h, d, count * sizeof(float));
    return h;
}

static size_t differing(const float *a, const float *b, size_t count) {
    size_t bad = 0;
    for (size_t i = 0; i < count; i++) bad += memcmp(&a[i], &b[i], sizeof(float)) != 0;
    return bad;
}

static void check_product(moe_gpu *gpu, const shape_case *c, moe__lin_product product, const moe_linear_plan *lt,
                          const moe_linear_plan *sgemm, moe_rng *rng) {
    const product_run r = {gpu, c, product};
    const int Mf = MAX_ROWS, in = c->in, out = c->out, T = c->tokens;
    /* the full problem: A [Mf, K] (or dy [T, Mf] for the weight gradient), B, D0 [Mf, N] */
    const int weight = product == MOE__LIN_BACKWARD_WEIGHT;
    const int N = product == MOE__LIN_FORWARD ? out : in;
    const int a_rows = weight ? T : Mf, a_width = weight ? Mf : product == MOE__LIN_FORWARD ? in : out;
    const int b_rows = weight ? T : out; /* x [T, in] or W [out, in] */
    const size_t a_count = (size_t)a_rows * a_width, b_count = (size_t)b_rows * in, d_count = (size_t)Mf * N;
    float *A = inputs(rng, a_count, 1.0, c->bf16), *B = inputs(rng, b_count, 1.0, c->bf16);
    float *D0 = test_alloc_uniform(rng, d_count, 1.0);
    float *dA = test_gpu_upload(gpu, A, a_count * sizeof(float)), *dB = test_gpu_upload(gpu, B, b_count * sizeof(float));
    const char *dtype = c->bf16 ? "bf16" : "f32";
    char label[200];
    /* the pinned algorithm: the shape's, K = T for the weight gradient */
    const moe__lin_lt_call call = moe__linear_lt_call(product, weight ? T : Mf, in, out, c->bf16);
    for (int beta = 0; beta <= (product == MOE__LIN_FORWARD ? 0 : 1); beta++) {
        snprintf(label, sizeof label, "%s, %s, beta %d", c->name, kProductNames[product], beta);
        float *base;
        float *d = output_for(gpu, D0, 0, Mf, N, (float)beta, 0, &base);
        CHECK_OK(run(&r, lt, Mf, dA, dB, (float)beta, d));
        float *full = download(gpu, d, d_count);
        test_gpu_free(gpu, base);
        const moe_gemm_lt *g = NULL;
        CHECK_OK(moe_gemm_lt_set_get(gpu, lt->lt, &call.shape, &g));
        CHECK(g != NULL, "%s: no pinned algorithm; the product ran as cublasSgemm (see the plan's description below)",
              label);
        /* repeat */
        d = output_for(gpu, D0, 0, Mf, N, (float)beta, 0, &base);
        CHECK_OK(run(&r, lt, Mf, dA, dB, (float)beta, d));
        float *again = download(gpu, d, d_count);
        test_gpu_free(gpu, base);
        const size_t repeat_bad = differing(full, again, d_count);
        CHECK(repeat_bad == 0, "%s: %zu of %zu values differ when the call runs again", label, repeat_bad, d_count);
        free(again);
        /* accuracy: one cublasSgemm of the same values */
        d = output_for(gpu, D0, 0, Mf, N, (float)beta, 0, &base);
        CHECK_OK(run(&r, sgemm, Mf, dA, dB, (float)beta, d));
        float *want = download(gpu, d, d_count);
        test_gpu_free(gpu, base);
        test_tolerance_check("linear", dtype, full, want, d_count, "%s: against cublasSgemm", label);
        free(want);
        /* invariance: M rows, those from row `first` of the full call's inputs (a copy, every other one at a 4-byte
         * offset), have the full call's bits */
        for (size_t i = 0; i < sizeof kRows / sizeof *kRows; i++) {
            const int M = kRows[i], first = (int)((long long)(Mf - M) * 5 / 7), shift = (int)(i % 2);
            const size_t count = (size_t)(weight ? T : M) * (weight ? M : a_width);
            float *h = host_floats(count);
            if (weight) /* dy's columns [first, first + M) as a [T, M] array */
                for (int t = 0; t < T; t++) memcpy(h + (size_t)t * M, A + (size_t)t * Mf + first, (size_t)M * sizeof(float));
            else
                memcpy(h, A + (size_t)first * a_width, count * sizeof(float));
            float *a_base, *d_base;
            const float *a = device_at(gpu, h, count, shift, &a_base);
            free(h);
            float *dm = output_for(gpu, D0, first, M, N, (float)beta, shift, &d_base);
            CHECK_OK(run(&r, lt, M, a, dB, (float)beta, dm));
            float *got = download(gpu, dm, (size_t)M * N);
            const size_t bad = differing(got, full + (size_t)first * N, (size_t)M * N);
            printf("%-72s M %5d from row %5d%s: %s\n", label, M, first, shift ? " (arrays 4-byte aligned)" : "",
                   bad ? "DIFFERS" : "bitwise the 16384-row call's");
            CHECK(bad == 0, "%s: %zu of %zu values of rows [%d, %d) differ between calls of %d and %d rows", label, bad,
                  (size_t)M * N, first, first + M, M, Mf);
            free(got);
            test_gpu_free(gpu, a_base), test_gpu_free(gpu, d_base);
        }
        free(full);
    }
    test_gpu_free(gpu, dA), test_gpu_free(gpu, dB);
    free(A), free(B), free(D0);
}

/* Unrounded token operands under bf16 (x, dy; kernels/linear.h): the pinned call's cast rounds them, so each product
 * gives the bits of the rounded operands (moe/dense_ops_cuda.c passes them unrounded under MOE_LINEAR_LT). */
static void check_unrounded(moe_gpu *gpu, moe_rng *rng) {
    enum { IN = 256, OUT = 512, T = 300 };
    moe_linear_plan lt;
    CHECK_OK(moe_linear_plan_init(gpu, MOE_LINEAR_LT, 0, 1, 0, &lt));
    if (test_failures) return;
    float *x = test_alloc_uniform(rng, (size_t)T * IN, 1.0), *dy = test_alloc_uniform(rng, (size_t)T * OUT, 1.0);
    float *W = inputs(rng, (size_t)OUT * IN, 0.05, 1);
    float *xr = host_floats((size_t)T * IN), *dyr = host_floats((size_t)T * OUT);
    moe_bf16_round_n(x, (size_t)T * IN, xr), moe_bf16_round_n(dy, (size_t)T * OUT, dyr);
    CHECK(memcmp(x, xr, (size_t)T * IN * sizeof(float)) != 0, "the unrounded inputs are already bf16 values");
    float *operands[2][2] = {{x, dy}, {xr, dyr}}, *got[2][3];
    const size_t counts[3] = {(size_t)T * OUT, (size_t)T * IN, (size_t)OUT * IN};
    float *dW_ = test_gpu_upload(gpu, W, (size_t)OUT * IN * sizeof(float));
    for (int r = 0; r < 2; r++) { /* r 0: unrounded, 1: rounded */
        float *dx_in = test_gpu_upload(gpu, operands[r][0], (size_t)T * IN * sizeof(float));
        float *ddy_in = test_gpu_upload(gpu, operands[r][1], (size_t)T * OUT * sizeof(float));
        float *d_out[3];
        for (int p = 0; p < 3; p++) d_out[p] = test_gpu_alloc(gpu, counts[p] * sizeof(float));
        CHECK_OK(moe_linear_forward_cuda(gpu, &lt, dx_in, dW_, T, IN, OUT, d_out[0]));
        CHECK_OK(moe_linear_backward_input_cuda(gpu, &lt, ddy_in, dW_, T, IN, OUT, 0, d_out[1]));
        CHECK_OK(moe_linear_backward_weight_cuda(gpu, &lt, ddy_in, dx_in, T, IN, OUT, 0, d_out[2]));
        for (int p = 0; p < 3; p++) {
            got[r][p] = host_floats(counts[p]);
            test_gpu_download(gpu, got[r][p], d_out[p], counts[p] * sizeof(float));
            test_gpu_free(gpu, d_out[p]);
        }
        test_gpu_free(gpu, dx_in), test_gpu_free(gpu, ddy_in);
    }
    for (int p = 0; p < 3; p++) {
        CHECK(memcmp(got[0][p], got[1][p], counts[p] * sizeof(float)) == 0,
              "%s: unrounded token operands give other bits than rounded ones", kProductNames[p]);
        free(got[0][p]), free(got[1][p]);
    }
    printf("unrounded x and dy under bf16: each product the bits of the rounded operands\n");
    test_gpu_free(gpu, dW_);
    free(x), free(dy), free(W), free(xr), free(dyr);
    moe_linear_plan_free(gpu, &lt);
}

/* Kept bf16 weights (kernels/linear.h): one copy of W for forward and backward input, cast again only with a new
 * weights version. */
static void check_kept(moe_gpu *gpu, moe_rng *rng) {
    enum { IN = 200 /* rows padded: 400 bytes */, OUT = 384, T = 77 };
    moe_linear_plan lt;
    CHECK_OK(moe_linear_plan_init(gpu, MOE_LINEAR_LT, 0, 1, 0, &lt));
    if (test_failures) return;
    float *x = inputs(rng, (size_t)T * IN, 1.0, 1), *dy = inputs(rng, (size_t)T * OUT, 1.0, 1);
    float *W[2] = {inputs(rng, (size_t)OUT * IN, 0.05, 1), inputs(rng, (size_t)OUT * IN, 0.05, 1)};
    float *d_x = test_gpu_upload(gpu, x, (size_t)T * IN * sizeof(float));
    float *d_dy = test_gpu_upload(gpu, dy, (size_t)T * OUT * sizeof(float));
    float *d_W = test_gpu_upload(gpu, W[0], (size_t)OUT * IN * sizeof(float));
    float *d_y = test_gpu_alloc(gpu, (size_t)T * OUT * sizeof(float));
    float *d_dx = test_gpu_alloc(gpu, (size_t)T * IN * sizeof(float));
    float *want[2][2], *got[2]; /* [W][forward, backward input] without kept weights */
    const size_t counts[2] = {(size_t)T * OUT, (size_t)T * IN};
    for (int w = 0; w < 2; w++) {
        CHECK_OK(moe_gpu_upload(gpu, d_W, W[w], (size_t)OUT * IN * sizeof(float)));
        CHECK_OK(moe_linear_forward_cuda(gpu, &lt, d_x, d_W, T, IN, OUT, d_y));
        CHECK_OK(moe_linear_backward_input_cuda(gpu, &lt, d_dy, d_W, T, IN, OUT, 0, d_dx));
        for (int p = 0; p < 2; p++) {
            want[w][p] = host_floats(counts[p]);
            test_gpu_download(gpu, want[w][p], p ? d_dx : d_y, counts[p] * sizeof(float));
        }
    }
    for (int p = 0; p < 2; p++) got[p] = host_floats(counts[p]);
    /* (version, the W on the device, which W's results are expected) */
    const struct { unsigned long long version; int on_device, expect; const char *what; } steps[] = {
        {1, 0, 0, "version 1: W kept"},
        {1, 1, 0, "W changed in place, version still 1: the kept copy"},
        {2, 1, 1, "version 2: cast again"},
    };
    for (int i = 0; i < 3; i++) {
        CHECK_OK(moe_gpu_upload(gpu, d_W, W[steps[i].on_device], (size_t)OUT * IN * sizeof(float)));
        moe_linear_plan_set_weights_version(&lt, steps[i].version);
        CHECK_OK(moe_linear_forward_cuda(gpu, &lt, d_x, d_W, T, IN, OUT, d_y));
        CHECK_OK(moe_linear_backward_input_cuda(gpu, &lt, d_dy, d_W, T, IN, OUT, 0, d_dx));
        for (int p = 0; p < 2; p++) {
            test_gpu_download(gpu, got[p], p ? d_dx : d_y, counts[p] * sizeof(float));
            CHECK(memcmp(got[p], want[steps[i].expect][p], counts[p] * sizeof(float)) == 0, "kept weights: %s: %s "
                  "differs", steps[i].what, kProductNames[p]);
        }
    }
    CHECK(moe_linear_plan_kept_weights(&lt) == 1, "kept weights: %d copies of one W (forward and backward input share "
          "one)", moe_linear_plan_kept_weights(&lt));
    printf("kept bf16 weights: one copy for both products, the uncached bits, cast again only at a new version\n");
    for (int w = 0; w < 2; w++) free(want[w][0]), free(want[w][1]), free(W[w]);
    free(got[0]), free(got[1]), free(x), free(dy);
    test_gpu_free(gpu, d_x), test_gpu_free(gpu, d_dy), test_gpu_free(gpu, d_W), test_gpu_free(gpu, d_y);
    test_gpu_free(gpu, d_dx);
    moe_linear_plan_free(gpu, &lt);
}

int main(void) {
    moe_gpu *gpu = test_gpu_require("test_gpu_gemm_lt");
    moe_rng rng = moe_rng_seeded(50);
    static char text[16384];
    for (size_t i = 0; i < sizeof kShapes / sizeof *kShapes; i++) {
        const shape_case *c = &kShapes[i];
        moe_linear_plan lt, sgemm;
        CHECK_OK(moe_linear_plan_init(gpu, MOE_LINEAR_LT, 0, c->bf16, 0, &lt));
        CHECK_OK(moe_linear_plan_init(gpu, MOE_LINEAR_SGEMM, 0, c->bf16, 0, &sgemm));
        if (test_failures) break; /* no plans: nothing below can run */
        for (int product = MOE__LIN_FORWARD; product <= MOE__LIN_BACKWARD_WEIGHT; product++)
            check_product(gpu, c, (moe__lin_product)product, &lt, &sgemm, &rng);
        if (i + 1 == sizeof kShapes / sizeof *kShapes) { /* the context's set: every shape the cases met */
            moe_linear_plan_describe(&lt, text, sizeof text);
            printf("%s", text);
        }
        moe_linear_plan_free(gpu, &lt);
        moe_linear_plan_free(gpu, &sgemm);
    }
    check_unrounded(gpu, &rng);
    check_kept(gpu, &rng);
    moe_gpu_destroy(gpu);
    return test_finish("test_gpu_gemm_lt");
}
