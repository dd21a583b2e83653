/* test_gemm_lt_layout.c — the column-major calls of the pinned cuBLASLt GEMMs (kernels/gemm_lt.h's layouts) for the
 * dense linear's three products (kernels/linear_gemms.h's moe__linear_lt_call, which kernels/linear.cu runs under
 * MOE_LINEAR_LT), run on the CPU: each as one column-major cblas_sgemm with cuBLASLt's operands swapped as
 * gemm_lt.cu swaps them, on A and B stored as moe_gemm_lt_run_f32 stages them (rows padded to 16 bytes of the input
 * type, the pad NaN: a layout that reads it fails), against the product computed from its definition in double,
 * within the "linear" f32 row. This checks every transpose, m/n/k, leading dimension and the padding without a GPU;
 * the cuBLASLt calls themselves are the gpu suite's (tests/test_gpu_gemm_lt.c). Also checked: each layout is one
 * cuBLAS accepts (ld >= the rows as stored; each operand's rows and columns are m, n, k as its op says), the input
 * rows are whole multiples of 16 bytes, and only A's rows under trans_a (a weight gradient's) change with M.
 * Run: meson test -C build test_gemm_lt_layout */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/gemm_lt.h"
#include "kernels/linear_gemms.h"
#include "tests/test_tolerance.h"
#include "tests/test_util.h"

static const char *const kProductNames[] = {"forward", "backward input", "backward weight"};

typedef struct {
    int rows, in, out;
} case_shape;

static const case_shape kShapes[] = {{1, 8, 8}, {37, 100, 36}, {65, 24, 40}, {130, 64, 64}, {3, 5, 7}};

static float *alloc_floats(size_t count) {
    float *p = calloc(count ? count : 1, sizeof(float));
    if (!p) {
        fprintf(stderr, "test_gemm_lt_layout: out of memory\n");
        exit(1);
    }
    return p;
}

/* rows x width dense into rows x ld, the pad NaN */
static float *padded(const float *x, int rows, int width, int ld) {
    float *p = alloc_floats((size_t)rows * ld);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < ld; c++) p[(size_t)r * ld + c] = c < width ? x[(size_t)r * width + c] : NAN;
    return p;
}

/* the layouts' own rules, for one shape at M */
static void check_layout(const moe_gemm_lt_shape *s, int M, const char *label) {
    const moe__gemm_lt_colmajor c = moe__gemm_lt_colmajor_of(s, M);
    CHECK(c.m == s->n && c.n == M && c.k == s->k, "%s: m %d n %d k %d", label, c.m, c.n, c.k);
    CHECK(c.op_first ? (c.first_rows == c.k && c.first_cols == c.m) : (c.first_rows == c.m && c.first_cols == c.k),
          "%s: cuBLASLt's A is %d x %d, op %d, for m %d k %d", label, c.first_rows, c.first_cols, c.op_first, c.m, c.k);
    CHECK(c.op_second ? (c.second_rows == c.n && c.second_cols == c.k) : (c.second_rows == c.k && c.second_cols == c.n),
          "%s: cuBLASLt's B is %d x %d, op %d, for n %d k %d", label, c.second_rows, c.second_cols, c.op_second, c.n,
          c.k);
    CHECK(c.d_rows == c.m && c.d_cols == c.n && c.d_ld == s->n, "%s: D %d x %d ld %d", label, c.d_rows, c.d_cols,
          c.d_ld);
    CHECK(c.first_ld >= c.first_rows && c.second_ld >= c.second_rows && c.d_ld >= c.d_rows,
          "%s: leading dimensions %d %d %d below the rows %d %d %d", label, c.first_ld, c.second_ld, c.d_ld,
          c.first_rows, c.second_rows, c.d_rows);
    const int elem = s->inputs == MOE_GEMM_LT_BF16 ? 2 : 4;
    CHECK(c.first_ld * elem % 16 == 0 && c.second_ld * elem % 16 == 0, "%s: input rows of %d and %d elements", label,
          c.first_ld, c.second_ld);
    CHECK(c.first_ld == moe_gemm_lt_ld_b(s) && c.second_ld == moe_gemm_lt_ld_a(s, M), "%s: lds %d %d, not %d %d",
          label, c.first_ld, c.second_ld, moe_gemm_lt_ld_b(s), moe_gemm_lt_ld_a(s, M));
    const moe__gemm_lt_colmajor more = moe__gemm_lt_colmajor_of(s, M + 1);
    CHECK(more.first_rows == c.first_rows && more.first_cols == c.first_cols && more.first_ld == c.first_ld,
          "%s: B's layout changes with M", label);
    CHECK(s->trans_a || more.second_ld == c.second_ld, "%s: A's rows change with M without trans_a", label);
}

/* one product of one case: the staged column-major call against the definition */
static void check_product(moe__lin_product product, const case_shape *cs, int bf16, float beta, moe_rng *rng) {
    const int T = cs->rows, in = cs->in, out = cs->out;
    char label[160];
    snprintf(label, sizeof label, "%s rows %d in %d out %d %s beta %g", kProductNames[product], T, in, out,
             bf16 ? "bf16" : "fp32", (double)beta);
    const moe__lin_lt_call call = moe__linear_lt_call(product, T, in, out, bf16);
    const moe_gemm_lt_shape *s = &call.shape;
    CHECK(s->inputs == (bf16 ? MOE_GEMM_LT_BF16 : MOE_GEMM_LT_FP32), "%s: inputs %d", label, (int)s->inputs);
    check_layout(s, call.M, label);
    /* the arrays and their [rows, width] */
    const int dims[MOE__LIN_ARRAYS][2] = {[MOE__LIN_X] = {T, in},     [MOE__LIN_W] = {out, in}, [MOE__LIN_Y] = {T, out},
                                          [MOE__LIN_DY] = {T, out},   [MOE__LIN_DX] = {T, in},  [MOE__LIN_DW] = {out, in}};
    float *arr[MOE__LIN_ARRAYS] = {0};
    for (int a = 0; a < MOE__LIN_DW + 1; a++) arr[a] = test_alloc_uniform(rng, (size_t)dims[a][0] * dims[a][1], 1.0);
    const int M = call.M, N = s->n, K = s->k;
    /* the call's operands have the shapes the layouts assume */
    CHECK(dims[call.a][0] == (s->trans_a ? K : M) && dims[call.a][1] == (s->trans_a ? M : K), "%s: A is %d x %d",
          label, dims[call.a][0], dims[call.a][1]);
    CHECK(dims[call.b][0] == (s->trans_b ? N : K) && dims[call.b][1] == (s->trans_b ? K : N), "%s: B is %d x %d",
          label, dims[call.b][0], dims[call.b][1]);
    CHECK(dims[call.d][0] == M && dims[call.d][1] == N, "%s: D is %d x %d", label, dims[call.d][0], dims[call.d][1]);
    /* the definition, in double */
    const size_t dcount = (size_t)M * N;
    float *want = alloc_floats(dcount);
    for (int r = 0; r < M; r++)
        for (int c = 0; c < N; c++) {
            double sum = beta * arr[call.d][(size_t)r * N + c];
            if (product == MOE__LIN_FORWARD)
                for (int i = 0; i < in; i++) sum += (double)arr[MOE__LIN_X][(size_t)r * in + i] * arr[MOE__LIN_W][(size_t)c * in + i];
            else if (product == MOE__LIN_BACKWARD_INPUT)
                for (int o = 0; o < out; o++)
                    sum += (double)arr[MOE__LIN_DY][(size_t)r * out + o] * arr[MOE__LIN_W][(size_t)o * in + c];
            else
                for (int t = 0; t < T; t++)
                    sum += (double)arr[MOE__LIN_DY][(size_t)t * out + r] * arr[MOE__LIN_X][(size_t)t * in + c];
            want[(size_t)r * N + c] = (float)sum;
        }
    /* the call, as gemm_lt.cu makes it: cuBLASLt's A is our B, its B our A, both staged with padded rows */
    const moe__gemm_lt_colmajor cm = moe__gemm_lt_colmajor_of(s, M);
    float *a = padded(arr[call.a], dims[call.a][0], dims[call.a][1], moe_gemm_lt_ld_a(s, M));
    float *b = padded(arr[call.b], dims[call.b][0], dims[call.b][1], moe_gemm_lt_ld_b(s));
    float *got = arr[call.d];
    cblas_sgemm(CblasColMajor, cm.op_first ? CblasTrans : CblasNoTrans, cm.op_second ? CblasTrans : CblasNoTrans, cm.m,
                cm.n, cm.k, 1, b, cm.first_ld, a, cm.second_ld, beta, got, cm.d_ld);
    test_tolerance_check("linear", "f32", got, want, dcount, "%s", label);
    free(a), free(b), free(want);
    for (int i = 0; i < MOE__LIN_DW + 1; i++) free(arr[i]);
}

int main(void) {
    moe_rng rng = moe_rng_seeded(50);
    for (size_t i = 0; i < sizeof kShapes / sizeof *kShapes; i++)
        for (int product = MOE__LIN_FORWARD; product <= MOE__LIN_BACKWARD_WEIGHT; product++)
            for (int bf16 = 0; bf16 < 2; bf16++)
                for (int beta = 0; beta < 2; beta++)
                    check_product((moe__lin_product)product, &kShapes[i], bf16, (float)beta, &rng);
    /* the shapes' text, as the pinned configurations are listed */
    const char *const want[] = {"A B^T n 36 k 100 bf16", "A B n 100 k 36 bf16", "A^T B n 100 k 37 fp32"};
    for (int product = 0; product < 3; product++) {
        const moe__lin_lt_call c = moe__linear_lt_call((moe__lin_product)product, 37, 100, 36, product < 2);
        char text[96];
        moe_gemm_lt_shape_text(&c.shape, text, sizeof text);
        CHECK(!strcmp(text, want[product]), "%s: \"%s\", want \"%s\"", kProductNames[product], text, want[product]);
    }
    return test_finish("test_gemm_lt_layout");
}
