/* test_gpu_dense_ops_a.cu — the CUDA versions of a first group of the dense table's ops (moe/dense_ops.h)
 * against the CPU table (moe_dense_ops_cpu, on a CPU runtime: the oracle the trainer uses):
 *   embedding forward:   bitwise (data only moves); T = 1 and 1000, d = 1, 7, 256, 300;
 *   embedding backward:  bitwise (each table row gets its tokens' dy rows added in token order, as on the
 *                        CPU): tokens from the lower half of the vocabulary (repeats, rows never used, which
 *                        must stay as they were), one token repeated 3000 times, a table that starts non-zero;
 *   add, scale:          bitwise; n = 1, 255, 257, 100003 (not multiples of the block), add in place;
 *   round_bf16:          bitwise on random bit patterns (NaNs, Infs, subnormals among them) and ties;
 *   bias_add:            bitwise; the sigmoid row gate (forward, dy, dg) within row "gate_rows"; T = 1 and 1000;
 *   find_nonfinite:      the exact index (and the CPU's): none, NaN first, Inf last, -Inf in the middle, two
 *                        (the lower wins), n = 0, 1, 1000, 2^20 + 3;
 *   sum_squares:         bitwise the CPU's (the same lanes and tree, core/threads.h), whole and as ranges, twice;
 *                        n = 0, 1, 63, 64, 65, 1000, 2^24 + 7. It keeps the CPU's chunks and order, so it is
 *                        bitwise where the CPU does not contract t += x * x into an FMA (printed);
 *   adamw:               row "adamw" for param, m, v after 3 steps (weight decay 0 and 0.1); bitwise where the
 *                        CPU does not contract (printed); n = 0, 1, 1000, 100003.
 * Outputs are poisoned (0xFF: NaN) before each run. Exit 77 (skip) when no GPU is present.
 * Run: meson test -C build --suite gpu */
#include <math.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "kernels/adamw.h"
#include "kernels/cast.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/nonfinite.h"
#include "moe/dense_ops.h"
#include "moe/runtime.h"
#include "tests/test_gpu_util.h"
#include "tests/test_tolerance.h"
}

static const moe_dense_ops *cpu = &moe_dense_ops_cpu;

static float *dev_upload(moe_gpu *gpu, const float *host, size_t n) {
    return (float *)test_gpu_upload(gpu, host, (n ? n : 1) * sizeof(float));
}

static float *host_download(moe_gpu *gpu, const float *dev, size_t n) {
    float *h = (float *)malloc((n ? n : 1) * sizeof(float));
    test_gpu_download(gpu, h, dev, n * sizeof(float));
    return h;
}

static int same_bits(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof(float)) == 0; }

static void test_embedding(moe_gpu *gpu, moe_dense_state *s, int T, int V, int d, int used, int one_token,
                           moe_rng *rng) {
    char name[96];
    snprintf(name, sizeof name, "embedding T=%d V=%d d=%d%s", T, V, d, one_token ? " one token" : "");
    int *tokens = (int *)malloc((size_t)T * sizeof(int));
    for (int t = 0; t < T; t++) tokens[t] = one_token ? V / 3 : (int)(moe_rng_next(rng) % (uint64_t)used);
    const size_t tn = (size_t)V * d, yn = (size_t)T * d;
    float *table = test_alloc_uniform(rng, tn, 1.0), *dy = test_alloc_uniform(rng, yn, 1.0);
    float *y_want = (float *)malloc(yn * sizeof(float)), *dtable_want = (float *)malloc(tn * sizeof(float));
    memcpy(dtable_want, table, tn * sizeof(float)); /* the gradient accumulates into a non-zero table */
    CHECK_OK(cpu->embedding_forward(s, table, tokens, T, d, 0, V, y_want));
    CHECK_OK(cpu->embedding_backward(s, dy, tokens, T, d, 0, V, dtable_want));

    int *d_tokens = (int *)test_gpu_upload(gpu, tokens, (size_t)T * sizeof(int));
    float *d_table = dev_upload(gpu, table, tn), *d_dy = dev_upload(gpu, dy, yn);
    float *d_y = (float *)test_gpu_alloc(gpu, yn * sizeof(float));
    test_gpu_poison(gpu, d_y, yn * sizeof(float));
    CHECK_OK(moe_embedding_forward_cuda(gpu, d_table, d_tokens, T, d, d_y));
    float *y = host_download(gpu, d_y, yn);
    CHECK(same_bits(y, y_want, yn), "%s: forward not bitwise equal to the CPU", name);
    /* backward twice from the same start: the CPU's bits both times */
    for (int run = 0; run < 2; run++) {
        CHECK_OK(moe_gpu_upload(gpu, d_table, table, tn * sizeof(float)));
        CHECK_OK(moe_embedding_backward_cuda(gpu, d_dy, d_tokens, T, d, d_table));
        float *dtable = host_download(gpu, d_table, tn);
        size_t bad = 0;
        for (size_t i = 0; i < tn; i++) bad += memcmp(&dtable[i], &dtable_want[i], sizeof(float)) != 0;
        CHECK(bad == 0, "%s: backward run %d: %zu of %zu table elements differ from the CPU", name, run, bad, tn);
        if (run == 0) printf("%-44s forward %s, backward %zu mismatches\n", name, same_bits(y, y_want, yn) ? "bitwise" : "DIFFERS", bad);
        free(dtable);
    }
    CHECK_OK(moe_embedding_backward_cuda(gpu, d_dy, d_tokens, 0, d, d_table)); /* no tokens: nothing to do */
    free(tokens), free(table), free(dy), free(y_want), free(dtable_want), free(y);
    test_gpu_free(gpu, d_tokens), test_gpu_free(gpu, d_table), test_gpu_free(gpu, d_dy), test_gpu_free(gpu, d_y);
}

static void test_add_scale(moe_gpu *gpu, moe_dense_state *s, size_t n, moe_rng *rng) {
    float *a = test_alloc_uniform(rng, n, 3.0), *b = test_alloc_uniform(rng, n, 1e-3);
    float *want = (float *)malloc(n * sizeof(float));
    float *d_a = dev_upload(gpu, a, n), *d_b = dev_upload(gpu, b, n);
    float *d_y = (float *)test_gpu_alloc(gpu, n * sizeof(float));

    CHECK_OK(cpu->add(s, a, b, n, want));
    test_gpu_poison(gpu, d_y, n * sizeof(float));
    CHECK_OK(moe_add_cuda(gpu, d_a, d_b, n, d_y));
    float *got = host_download(gpu, d_y, n);
    CHECK(same_bits(got, want, n), "add n=%zu: not bitwise equal to the CPU", n);
    free(got);
    CHECK_OK(moe_add_cuda(gpu, d_a, d_b, n, d_a)); /* in place, as the model calls it */
    got = host_download(gpu, d_a, n);
    CHECK(same_bits(got, want, n), "add in place n=%zu: not bitwise equal to the CPU", n);
    free(got);

    const double factors[] = {1.0 / 3.0, 0.7071067811865476, 1e-30};
    for (int f = 0; f < 3; f++) {
        memcpy(want, a, n * sizeof(float));
        CHECK_OK(cpu->scale(s, want, n, factors[f]));
        CHECK_OK(moe_gpu_upload(gpu, d_y, a, n * sizeof(float)));
        CHECK_OK(moe_scale_cuda(gpu, d_y, n, factors[f]));
        got = host_download(gpu, d_y, n);
        CHECK(same_bits(got, want, n), "scale n=%zu factor %g: not bitwise equal to the CPU", n, factors[f]);
        free(got);
    }
    printf("add, scale n=%-8zu checked bitwise\n", n);
    free(a), free(b), free(want);
    test_gpu_free(gpu, d_a), test_gpu_free(gpu, d_b), test_gpu_free(gpu, d_y);
}

static void test_round_bf16(moe_gpu *gpu, moe_dense_state *s, moe_rng *rng) {
    const uint32_t special[] = {0x3F808000u, 0x3F818000u, 0x3F807FFFu, 0x7F7FFFFFu, 0x00000001u, 0x80008000u,
                                0x7F800000u, 0xFF800000u, 0x7FC00000u, 0xFFA12345u, 0x80000000u, 0x00000000u};
    const size_t ns = sizeof special / sizeof special[0], n = ns + 100003;
    uint32_t *bits = (uint32_t *)malloc(n * sizeof(uint32_t));
    for (size_t i = 0; i < n; i++) bits[i] = i < ns ? special[i] : (uint32_t)(moe_rng_next(rng) >> 32);
    float *src = (float *)bits, *want = (float *)malloc(n * sizeof(float));
    CHECK_OK(cpu->round_bf16(s, src, n, want));
    float *d_src = dev_upload(gpu, src, n), *d_dst = (float *)test_gpu_alloc(gpu, n * sizeof(float));
    test_gpu_poison(gpu, d_dst, n * sizeof(float));
    CHECK_OK(moe_bf16_round_cuda(gpu, d_src, n, d_dst));
    float *got = host_download(gpu, d_dst, n);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += memcmp(&got[i], &want[i], sizeof(float)) != 0;
    CHECK(bad == 0, "round_bf16: %zu of %zu values differ from the CPU", bad, n);
    printf("round_bf16 n=%-8zu %zu mismatches\n", n, bad);
    free(bits), free(want), free(got);
    test_gpu_free(gpu, d_src), test_gpu_free(gpu, d_dst);
}

static void test_find_nonfinite(moe_gpu *gpu, moe_dense_state *s, size_t n, moe_rng *rng) {
    float *a = test_alloc_uniform(rng, n ? n : 1, 1e30);
    float *d_a = (float *)test_gpu_alloc(gpu, (n ? n : 1) * sizeof(float));
    /* where to put non-finite values: none, NaN first, Inf last, -Inf in the middle, two (the lower wins) */
    struct {
        const char *what;
        size_t at[2];
        int count;
        long long want;
    } cases[] = {
        {"none", {0, 0}, 0, -1},
        {"NaN first", {0, 0}, 1, 0},
        {"Inf last", {n - 1, 0}, 1, (long long)n - 1},
        {"-Inf middle", {n / 2, 0}, 1, (long long)(n / 2)},
        {"two", {n - 1, n / 3}, 2, (long long)(n / 3)},
    };
    const float values[] = {NAN, INFINITY, -INFINITY};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        if (n == 0 && c > 0) break;
        float *x = (float *)malloc((n ? n : 1) * sizeof(float));
        memcpy(x, a, (n ? n : 1) * sizeof(float));
        for (int j = 0; j < cases[c].count; j++) x[cases[c].at[j]] = values[(c + j) % 3];
        long long want = 12345, got = 12345;
        CHECK_OK(cpu->find_nonfinite(s, x, n, &want));
        CHECK_OK(moe_gpu_upload(gpu, d_a, x, (n ? n : 1) * sizeof(float)));
        CHECK_OK(moe_find_nonfinite_cuda(gpu, d_a, n, &got));
        CHECK(want == cases[c].want, "find_nonfinite n=%zu %s: CPU says %lld, expected %lld", n, cases[c].what, want,
              cases[c].want);
        CHECK(got == cases[c].want, "find_nonfinite n=%zu %s: GPU says %lld, expected %lld", n, cases[c].what, got,
              cases[c].want);
        free(x);
    }
    printf("find_nonfinite n=%-8zu checked exactly\n", n);
    free(a);
    test_gpu_free(gpu, d_a);
}

static void test_sum_squares(moe_gpu *gpu, moe_dense_state *s, size_t n, moe_rng *rng) {
    float *a = test_alloc_uniform(rng, n ? n : 1, 2.0);
    float *d_a = dev_upload(gpu, a, n);
    /* the whole vector, then three ranges of it (a 1M-value atom's size among them when n allows) */
    const size_t whole[2] = {0, n}, cut = n > ((size_t)1 << 20) ? (size_t)1 << 20 : n / 2;
    const size_t ranges[4] = {0, cut, cut + (n - cut) / 3, n};
    const size_t *bounds[2] = {whole, ranges}, counts[2] = {1, 3};
    for (int l = 0; l < 2; l++) {
        double want[3] = {NAN, NAN, NAN}, got[2][3] = {{NAN, NAN, NAN}, {NAN, NAN, NAN}};
        CHECK_OK(cpu->sum_squares(s, a, bounds[l], counts[l], want));
        for (int run = 0; run < 2; run++) CHECK_OK(moe_sum_squares_cuda(gpu, d_a, bounds[l], counts[l], got[run]));
        CHECK(memcmp(got[0], want, counts[l] * sizeof(double)) == 0, "sum_squares n=%zu over %zu range(s): %.17g, the "
              "CPU %.17g", n, counts[l], got[0][0], want[0]);
        CHECK(memcmp(got[0], got[1], counts[l] * sizeof(double)) == 0, "sum_squares n=%zu: two runs differ", n);
    }
    printf("sum_squares n=%-8zu checked against the CPU bitwise\n", n);
    free(a);
    test_gpu_free(gpu, d_a);
}

static void test_adamw(moe_gpu *gpu, moe_dense_state *s, size_t n, float wd, moe_rng *rng) {
    float *p = test_alloc_uniform(rng, n ? n : 1, 1.0);
    float *m = (float *)calloc(n ? n : 1, sizeof(float)), *v = (float *)calloc(n ? n : 1, sizeof(float));
    float *d_p = dev_upload(gpu, p, n), *d_m = dev_upload(gpu, m, n), *d_v = dev_upload(gpu, v, n);
    float *d_g = (float *)test_gpu_alloc(gpu, (n ? n : 1) * sizeof(float));
    moe_adamw_params hp = {1e-3f, 0.9f, 0.95f, 1e-8f, wd, 0, 0.0};
    for (int step = 1; step <= 3; step++) {
        hp.step = step;
        hp.clip_factor = step == 3 ? 1.0 / 3.7 : 0.0; /* clipping folded in at the last step */
        float *g = test_alloc_uniform(rng, n ? n : 1, step == 2 ? 1e-6 : 1.0); /* a tiny gradient: v << eps^2 */
        CHECK_OK(cpu->adamw_update(s, p, g, m, v, n, &hp));
        CHECK_OK(moe_gpu_upload(gpu, d_g, g, (n ? n : 1) * sizeof(float)));
        CHECK_OK(moe_adamw_update_cuda(gpu, d_p, d_g, d_m, d_v, n, &hp));
        free(g);
    }
    float *gp = host_download(gpu, d_p, n), *gm = host_download(gpu, d_m, n), *gv = host_download(gpu, d_v, n);
    if (n > 0) {
        test_tolerance_check("adamw", "f32", gp, p, n, "adamw param n=%zu wd=%g", n, wd);
        test_tolerance_check("adamw", "f32", gm, m, n, "adamw m n=%zu wd=%g", n, wd);
        test_tolerance_check("adamw", "f32", gv, v, n, "adamw v n=%zu wd=%g", n, wd);
    }
    printf("adamw n=%-8zu wd=%-4g %s the CPU\n", n, wd,
           same_bits(gp, p, n) && same_bits(gm, m, n) && same_bits(gv, v, n) ? "bitwise equal to" : "within tolerance of");
    free(p), free(m), free(v), free(gp), free(gm), free(gv);
    test_gpu_free(gpu, d_p), test_gpu_free(gpu, d_m), test_gpu_free(gpu, d_v), test_gpu_free(gpu, d_g);
}

/* bias_add bitwise; the sigmoid row gate forward and backward within row "gate_rows" (CUDA's expf) */
static void test_bias_gate(moe_gpu *gpu, moe_dense_state *s, int T, int d, moe_rng *rng) {
    const size_t n = (size_t)T * d;
    float *x = test_alloc_uniform(rng, n, 2.0), *b = test_alloc_uniform(rng, (size_t)d, 1.0);
    float *g = test_alloc_uniform(rng, (size_t)T, 4.0), *y = test_alloc_uniform(rng, n, 1.0);
    float *dout = test_alloc_uniform(rng, n, 1.0);
    float *want = (float *)malloc(n * sizeof(float)), *want_dy = (float *)malloc(n * sizeof(float));
    float *want_dg = (float *)malloc((size_t)T * sizeof(float));
    memcpy(want, x, n * sizeof(float));
    CHECK_OK(cpu->bias_add(s, want, b, T, d));
    float *d_x = dev_upload(gpu, x, n), *d_b = dev_upload(gpu, b, (size_t)d), *d_g = dev_upload(gpu, g, (size_t)T);
    float *d_y = dev_upload(gpu, y, n), *d_dout = dev_upload(gpu, dout, n);
    float *d_dy = (float *)test_gpu_alloc(gpu, n * sizeof(float)), *d_dg = (float *)test_gpu_alloc(gpu, T * sizeof(float));
    CHECK_OK(moe_bias_add_cuda(gpu, d_x, d_b, T, d));
    float *got = host_download(gpu, d_x, n);
    CHECK(same_bits(got, want, n), "bias_add T=%d n=%d: not bitwise equal to the CPU", T, d);
    free(got);
    memcpy(want, x, n * sizeof(float));
    CHECK_OK(cpu->gate_rows_forward(s, g, y, T, d, want));
    CHECK_OK(moe_gpu_upload(gpu, d_x, x, n * sizeof(float)));
    CHECK_OK(moe_gate_rows_forward_cuda(gpu, d_g, d_y, T, d, d_x));
    got = host_download(gpu, d_x, n);
    test_tolerance_check("gate_rows", "f32", got, want, n, "gate_rows forward T=%d d=%d", T, d);
    free(got);
    CHECK_OK(cpu->gate_rows_backward(s, g, y, dout, T, d, want_dy, want_dg));
    test_gpu_poison(gpu, d_dy, n * sizeof(float)), test_gpu_poison(gpu, d_dg, T * sizeof(float));
    CHECK_OK(moe_gate_rows_backward_cuda(gpu, d_g, d_y, d_dout, T, d, d_dy, d_dg));
    got = host_download(gpu, d_dy, n);
    test_tolerance_check("gate_rows", "f32", got, want_dy, n, "gate_rows dy T=%d d=%d", T, d);
    free(got);
    got = host_download(gpu, d_dg, (size_t)T);
    test_tolerance_check("gate_rows", "f32", got, want_dg, (size_t)T, "gate_rows dg T=%d d=%d", T, d);
    free(got);
    free(x), free(b), free(g), free(y), free(dout), free(want), free(want_dy), free(want_dg);
    test_gpu_free(gpu, d_x), test_gpu_free(gpu, d_b), test_gpu_free(gpu, d_g), test_gpu_free(gpu, d_y);
    test_gpu_free(gpu, d_dout), test_gpu_free(gpu, d_dy), test_gpu_free(gpu, d_dg);
}

int main(void) {
    moe_gpu *gpu = test_gpu_require("test_gpu_dense_ops_a");
    moe_runtime *rt = NULL;
    moe_dense_state *s = NULL;
    CHECK_OK(moe_runtime_create_cpu(&rt));
    CHECK_OK(cpu->create(rt, 0, MOE_PRECISION_FP32, 1024, &s));
    if (!rt || !s) return test_finish("test_gpu_dense_ops_a");
    moe_rng rng = moe_rng_seeded(14);

    const int widths[] = {1, 7, 256, 300};
    for (int w = 0; w < 4; w++) {
        test_embedding(gpu, s, 1, 50, widths[w], 25, 0, &rng);
        test_embedding(gpu, s, 1000, 50, widths[w], 25, 0, &rng);
    }
    test_embedding(gpu, s, 3000, 50, 64, 25, 1, &rng);
    test_embedding(gpu, s, 4096, 5000, 96, 5000, 0, &rng);

    const size_t sizes[] = {1, 255, 257, 100003};
    for (int i = 0; i < 4; i++) test_add_scale(gpu, s, sizes[i], &rng);
    test_round_bf16(gpu, s, &rng);
    test_bias_gate(gpu, s, 1, 7, &rng);
    test_bias_gate(gpu, s, 1000, 300, &rng);

    const size_t nf_sizes[] = {0, 1, 1000, ((size_t)1 << 20) + 3};
    for (int i = 0; i < 4; i++) test_find_nonfinite(gpu, s, nf_sizes[i], &rng);

    const size_t ss_sizes[] = {0, 1, 63, 64, 65, 1000, ((size_t)1 << 24) + 7};
    for (int i = 0; i < 7; i++) test_sum_squares(gpu, s, ss_sizes[i], &rng);

    const size_t aw_sizes[] = {0, 1, 1000, 100003};
    for (int i = 0; i < 4; i++) {
        test_adamw(gpu, s, aw_sizes[i], 0.0f, &rng);
        test_adamw(gpu, s, aw_sizes[i], 0.1f, &rng);
    }

    cpu->destroy(s);
    moe_runtime_destroy(rt);
    moe_gpu_destroy(gpu);
    return test_finish("test_gpu_dense_ops_a");
}
