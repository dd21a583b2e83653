/* test_linear_gemms.c — the CUDA linear layer's products (kernels/linear_gemms.h, the list kernels/linear.cu hands to
 * cublasSgemm) run on the CPU: each entry as one column-major cblas_sgemm, padded blocks through zero-padded
 * buffers as linear.cu pads them, compared with the CPU table's linear entries (moe/dense_ops_cpu.c: the row-wise
 * GEMMs of kernels/gemm_rows.h) within the "linear" f32 row. This checks every transpose, m/n/k, leading dimension,
 * offset and the padding without a GPU; the cuBLAS calls themselves are the gpu suite's (test_gpu_dense_table).
 * Also checked, per case: every call's leading dimensions are ones cuBLAS accepts; each token row is written by
 * exactly one call; with row blocks every row-wise call has MOE_GEMM_ROW_BLOCK rows, and a row's result does not
 * depend on how many rows share the product (bitwise against a product over fewer rows: OpenBLAS gives 64-row calls
 * the same bits at every offset, docs/DETERMINISM.md); and a list with one transpose flipped is caught (a square
 * shape, where only the values can tell).
 * Run: meson test -C build test_linear_gemms */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/gemm_rows.h"
#include "kernels/linear_gemms.h"
#include "moe/dense_ops.h"
#include "moe/runtime.h"
#include "tests/test_tolerance.h"
#include "tests/test_util.h"

typedef struct {
    moe__lin_product product;
    const char *name;
} product_case;

static const product_case kProducts[] = {
    {MOE__LIN_FORWARD, "forward"},
    {MOE__LIN_BACKWARD_INPUT, "backward input"},
    {MOE__LIN_BACKWARD_WEIGHT, "backward weight"},
};

static float *alloc_floats(size_t count) {
    float *p = calloc(count ? count : 1, sizeof(float));
    CHECK(p != NULL, "out of memory");
    if (!p) exit(1);
    return p;
}

/* the calls' shapes as cuBLAS checks them (column-major: lda >= rows of A as stored, ...), and which rows they write */
static void check_calls(moe__lin_product product, int rows, int in, int out, int inv, float beta, const char *label) {
    const int count = moe__linear_gemm_count(product, rows, inv);
    int *written = calloc((size_t)rows + 1, sizeof(int));
    CHECK(written != NULL, "out of memory");
    for (int i = 0; i < count; i++) {
        const moe__lin_gemm g = moe__linear_gemm(product, rows, in, out, inv, beta, i);
        CHECK(g.m >= 1 && g.n >= 1 && g.k >= 1, "%s call %d: m %d n %d k %d", label, i, g.m, g.n, g.k);
        CHECK(g.lda >= (g.trans_a ? g.k : g.m) && g.ldb >= (g.trans_b ? g.n : g.k) && g.ldc >= g.m,
              "%s call %d: leading dimensions %d %d %d for m %d n %d k %d", label, i, g.lda, g.ldb, g.ldc, g.m, g.n,
              g.k);
        if (product == MOE__LIN_BACKWARD_WEIGHT) {
            CHECK(g.k == rows && g.beta == beta, "%s: the weight gradient sums all %d rows in one call", label, rows);
            continue;
        }
        CHECK(!inv || g.n == MOE_GEMM_ROW_BLOCK, "%s call %d: %d rows, not a block of %d", label, i, g.n,
              MOE_GEMM_ROW_BLOCK);
        CHECK(g.padded == (g.rows < g.n), "%s call %d: padded %d with %d of %d rows", label, i, g.padded, g.rows, g.n);
        for (int r = g.first_row; r < g.first_row + g.rows && r < rows; r++) written[r]++;
    }
    if (product != MOE__LIN_BACKWARD_WEIGHT)
        for (int r = 0; r < rows; r++) CHECK(written[r] == 1, "%s: row %d written %d times", label, r, written[r]);
    free(written);
}

/* one call as cuBLAS would run it, on the arrays */
static void sgemm(const moe__lin_gemm *g, float *const *arrays) {
    cblas_sgemm(CblasColMajor, g->trans_a ? CblasTrans : CblasNoTrans, g->trans_b ? CblasTrans : CblasNoTrans, g->m,
                g->n, g->k, 1.0f, arrays[g->a] + g->a_off, g->lda, arrays[g->b] + g->b_off, g->ldb, g->beta,
                arrays[g->c] + g->c_off, g->ldc);
}

/* the list of a product, padded blocks as linear.cu runs them; flip_trans_a: a wrong list, for the negative check */
static void run_list(moe__lin_product product, int rows, int in, int out, int inv, float beta, float **arrays,
                     int flip_trans_a) {
    const int count = moe__linear_gemm_count(product, rows, inv);
    for (int i = 0; i < count; i++) {
        moe__lin_gemm g = moe__linear_gemm(product, rows, in, out, inv, beta, i);
        g.trans_a ^= flip_trans_a;
        if (!g.padded) {
            sgemm(&g, arrays);
            continue;
        }
        float *pin = arrays[g.b], *pout = arrays[g.c];
        memset(pin, 0, (size_t)g.n * g.ldb * sizeof(float));
        memset(pout, 0, (size_t)g.n * g.ldc * sizeof(float));
        memcpy(pin, arrays[g.token_in] + (size_t)g.first_row * g.ldb, (size_t)g.rows * g.ldb * sizeof(float));
        if (g.beta != 0)
            memcpy(pout, arrays[g.token_out] + (size_t)g.first_row * g.ldc, (size_t)g.rows * g.ldc * sizeof(float));
        sgemm(&g, arrays);
        memcpy(arrays[g.token_out] + (size_t)g.first_row * g.ldc, pout, (size_t)g.rows * g.ldc * sizeof(float));
    }
}

typedef struct {
    int rows, in, out;
    float *x, *W, *dy, *out_start; /* out_start: what dx and dW hold before an accumulating product */
} shape_inputs;

static size_t output_count(const shape_inputs *s, moe__lin_product product, int rows) {
    return product == MOE__LIN_FORWARD          ? (size_t)rows * s->out
           : product == MOE__LIN_BACKWARD_INPUT ? (size_t)rows * s->in
                                                : (size_t)s->out * s->in;
}

/* the output of product over `rows` rows (beta 1 from out_start, or beta 0), by the list or by the CPU table */
static float *compute(const shape_inputs *s, moe__lin_product product, int rows, int inv, float beta, int by_list,
                      int flip_trans_a, const moe_dense_ops *cpu, moe_dense_state *state) {
    const size_t n = output_count(s, product, rows);
    float *c = alloc_floats(n);
    if (beta != 0) memcpy(c, s->out_start, n * sizeof(float));
    else if (product != MOE__LIN_FORWARD) /* beta 0 must not read C: start it with NaNs */
        for (size_t i = 0; i < n; i++) c[i] = NAN;
    if (by_list) {
        const int width = s->in > s->out ? s->in : s->out;
        float *arrays[MOE__LIN_ARRAYS] = {0};
        arrays[MOE__LIN_X] = s->x, arrays[MOE__LIN_W] = s->W, arrays[MOE__LIN_DY] = s->dy;
        arrays[MOE__LIN_Y] = arrays[MOE__LIN_DX] = arrays[MOE__LIN_DW] = c;
        arrays[MOE__LIN_PAD_IN] = alloc_floats((size_t)MOE_GEMM_ROW_BLOCK * width);
        arrays[MOE__LIN_PAD_OUT] = alloc_floats((size_t)MOE_GEMM_ROW_BLOCK * width);
        run_list(product, rows, s->in, s->out, inv, beta, arrays, flip_trans_a);
        free(arrays[MOE__LIN_PAD_IN]), free(arrays[MOE__LIN_PAD_OUT]);
    } else if (product == MOE__LIN_FORWARD) {
        CHECK_OK(cpu->linear_forward(state, s->x, s->W, rows, s->in, s->out, c));
    } else if (product == MOE__LIN_BACKWARD_INPUT) {
        CHECK_OK(cpu->linear_backward_input(state, s->dy, s->W, rows, s->in, s->out, beta, c));
    } else {
        CHECK_OK(cpu->linear_backward_weight(state, s->dy, s->x, rows, s->in, s->out, c));
    }
    return c;
}

static void check_shape(moe_runtime *rt, int rows, int in, int out) {
    moe_rng rng = moe_rng_seeded((uint64_t)(rows * 1009 + in * 31 + out));
    const int width = in > out ? in : out;
    shape_inputs s = {rows, in, out, test_alloc_uniform(&rng, (size_t)rows * in + 1, 1),
                      test_alloc_uniform(&rng, (size_t)out * in, 1), test_alloc_uniform(&rng, (size_t)rows * out + 1, 1),
                      test_alloc_uniform(&rng, (size_t)(rows > out ? rows : out) * width, 1)};
    const moe_dense_ops *cpu = &moe_dense_ops_cpu;
    for (int inv = 0; inv <= 1; inv++) {
        moe_dense_state *state = NULL;
        CHECK_OK(cpu->create(rt, inv, MOE_PRECISION_FP32, width, &state));
        for (size_t p = 0; p < sizeof kProducts / sizeof *kProducts; p++) {
            const moe__lin_product product = kProducts[p].product;
            /* the table's weight gradient always accumulates; the forward never does */
            for (int b = product == MOE__LIN_BACKWARD_WEIGHT; b <= (product != MOE__LIN_FORWARD); b++) {
                char label[128];
                snprintf(label, sizeof label, "%s, T %d, in %d, out %d, blocks %d, beta %d", kProducts[p].name, rows,
                         in, out, inv, b);
                check_calls(product, rows, in, out, inv, (float)b, label);
                const size_t n = output_count(&s, product, rows);
                float *want = compute(&s, product, rows, inv, (float)b, 0, 0, cpu, state);
                float *got = compute(&s, product, rows, inv, (float)b, 1, 0, cpu, state);
                test_tolerance_check("linear", "f32", got, want, n, "%s", label);
                if (inv && product != MOE__LIN_BACKWARD_WEIGHT && rows > 1) {
                    /* the first rows - 1 rows on their own: their last block is padded where it was not, or the
                     * other way round; each row keeps its bits */
                    float *fewer = compute(&s, product, rows - 1, inv, (float)b, 1, 0, cpu, state);
                    CHECK(!memcmp(fewer, got, output_count(&s, product, rows - 1) * sizeof(float)),
                          "%s: rows differ when the product has %d rows instead of %d", label, rows - 1, rows);
                    free(fewer);
                }
                if (in == out && rows > 0 && product != MOE__LIN_BACKWARD_WEIGHT) {
                    /* op(W) and op(W)^T have the same shape here: only the values tell a flipped transpose */
                    float *wrong = compute(&s, product, rows, inv, (float)b, 1, 1, cpu, state);
                    double worst = 0;
                    for (size_t i = 0; i < n; i++) worst = fmax(worst, fabs((double)wrong[i] - want[i]));
                    CHECK(worst > 1e-2, "%s: a flipped transpose gives the same result (worst diff %g)", label, worst);
                    free(wrong);
                }
                free(want), free(got);
            }
        }
        cpu->destroy(state);
    }
    free(s.x), free(s.W), free(s.dy), free(s.out_start);
}

int main(void) {
    moe_runtime *rt = NULL;
    CHECK_OK(moe_runtime_create_cpu(&rt));
    /* T, in, out: one row, a partial block, exactly one block, a block and a part, several, square (in == out) */
    const int shapes[][3] = {{1, 16, 24}, {37, 24, 16}, {64, 32, 40}, {100, 48, 20}, {130, 20, 48}, {200, 33, 33},
                             {0, 8, 8}};
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) check_shape(rt, shapes[i][0], shapes[i][1], shapes[i][2]);
    moe_runtime_destroy(rt);
    return test_finish("test_linear_gemms");
}
