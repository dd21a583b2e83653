/* test_gpu_permute.cu — moe_permute_rows_cuda, moe_combine_rows_cuda and moe_combine_rows_backward_cuda against
 * kernels/permute_cpu.c. Routings: T tokens, k distinct experts each, ~10% of assignments dropped (slot -1),
 * rows in expert-major then token order (the dispatch layout's). Widths d = 8 and 4096 take the 16-byte
 * path, d = 12 and pointers offset by one element the scalar path; k = 1, 2, 8; gates and unit gates.
 *   permute:   bitwise equal to moe_bf16_round of the CPU gather (data only moves);
 *   combine:   unit gates bitwise (sums of exact products in the same j order); gates within the row
 *              "combine" of tests/test_tolerance.c (same operations; only a CPU that contracts to FMA
 *              could differ);
 *   backward:  dy bitwise equal to bf16 of the CPU's gate * dout; dgate (a block reduction against the
 *              CPU's sequential dot) within the row "combine backward dgate", dropped ones exactly 0; a
 *              sentinel row past the last stays untouched; a second run is bitwise equal to the first.
 * The CPU references run on the bf16-rounded y. Outputs are poisoned before each run. Exit 77 (skip)
 * when no GPU is present. Run: meson test -C build --suite gpu */
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "kernels/cast.h"
#include "kernels/permute.h"
#include "tests/test_gpu_util.h"
#include "tests/test_tolerance.h"
}

typedef struct {
    int T, E, k, d;
    int gated;    /* 0: gate = NULL (unit gates) */
    int misalign; /* 1: device pointers one element past a 16-byte boundary (scalar path) */
} pcase;

typedef struct {
    int *slot;       /* [T*k] row or -1 */
    int *perm_token; /* [rows] */
    int rows;
} routing;

static routing make_routing(const pcase *c, moe_rng *rng) {
    routing r;
    int T = c->T, k = c->k, E = c->E;
    int *expert = (int *)malloc((size_t)T * k * sizeof(int)), *count = (int *)calloc(E + 1, sizeof(int));
    int *pick = (int *)malloc(E * sizeof(int));
    r.slot = (int *)malloc((size_t)T * k * sizeof(int));
    for (int t = 0; t < T; t++) {
        for (int e = 0; e < E; e++) pick[e] = e;
        for (int j = 0; j < k; j++) { /* k distinct experts: a partial Fisher-Yates shuffle */
            int s = j + (int)(moe_rng_next(rng) % (uint64_t)(E - j)), tmp = pick[j];
            pick[j] = pick[s], pick[s] = tmp;
            int kept = moe_rng_uniform(rng) > -0.8; /* ~90% */
            expert[t * k + j] = kept ? pick[j] : -1;
            if (kept) count[pick[j] + 1]++;
        }
    }
    for (int e = 0; e < E; e++) count[e + 1] += count[e]; /* now offsets */
    r.rows = count[E];
    r.perm_token = (int *)malloc((r.rows ? r.rows : 1) * sizeof(int));
    for (int t = 0; t < T; t++)
        for (int j = 0; j < k; j++) {
            int e = expert[t * k + j];
            if (e < 0) {
                r.slot[t * k + j] = -1;
                continue;
            }
            int row = count[e]++;
            r.slot[t * k + j] = row, r.perm_token[row] = t;
        }
    free(expert), free(count), free(pick);
    return r;
}

/* A device buffer of n elements of `esize` bytes (plus one for the offset), and the pointer to use. */
typedef struct {
    void *base;
    void *ptr;
} dbuf;

static dbuf dev_alloc(moe_gpu *gpu, size_t n, size_t esize, int misalign) {
    dbuf b;
    b.base = test_gpu_alloc(gpu, (n + 1) * esize);
    b.ptr = (char *)b.base + (misalign ? esize : 0);
    return b;
}

static dbuf dev_upload(moe_gpu *gpu, const void *host, size_t n, size_t esize, int misalign) {
    dbuf b = dev_alloc(gpu, n, esize, misalign);
    CHECK_OK(moe_gpu_upload(gpu, b.ptr, host, n * esize));
    return b;
}

static void run_case(moe_gpu *gpu, const pcase *c, moe_rng *rng) {
    const int T = c->T, k = c->k, d = c->d, m = c->misalign;
    char name[128];
    snprintf(name, sizeof name, "T=%d k=%d d=%d %s%s", T, k, d, c->gated ? "gated" : "unit gates",
             m ? " misaligned" : "");
    routing r = make_routing(c, rng);
    const int rows = r.rows;
    const size_t xn = (size_t)T * d, yn = (size_t)rows * d, an = (size_t)T * k;

    float *x = test_alloc_uniform(rng, xn, 2.0);
    float *gate = test_alloc_uniform(rng, an, 0.5), *ones = (float *)malloc(an * sizeof(float));
    for (size_t i = 0; i < an; i++) gate[i] += 0.5f, ones[i] = 1.0f;
    float *yf = test_alloc_uniform(rng, yn, 1.0), *dout = test_alloc_uniform(rng, xn, 1.0);
    uint16_t *y = (uint16_t *)malloc((yn ? yn : 1) * sizeof(uint16_t));
    for (size_t i = 0; i < yn; i++) y[i] = moe_bf16_from_float(yf[i]), yf[i] = moe_bf16_to_float(y[i]);

    dbuf d_x = dev_upload(gpu, x, xn, sizeof(float), m), d_y = dev_upload(gpu, y, yn, sizeof(uint16_t), m);
    dbuf d_dout = dev_upload(gpu, dout, xn, sizeof(float), m);
    int *d_perm = (int *)test_gpu_upload(gpu, r.perm_token, (rows ? rows : 1) * sizeof(int));
    int *d_slot = (int *)test_gpu_upload(gpu, r.slot, an * sizeof(int));
    float *d_gate = c->gated ? (float *)test_gpu_upload(gpu, gate, an * sizeof(float)) : NULL;
    dbuf d_xp = dev_alloc(gpu, yn, sizeof(uint16_t), m), d_out = dev_alloc(gpu, xn, sizeof(float), m);
    dbuf d_dy = dev_alloc(gpu, yn + d, sizeof(uint16_t), m); /* + a sentinel row nobody may write */
    float *d_dgate = (float *)test_gpu_alloc(gpu, an * sizeof(float));

    /* permute: exact */
    uint16_t *xp = (uint16_t *)malloc((yn ? yn : 1) * sizeof(uint16_t));
    float *xp_want = (float *)malloc((yn ? yn : 1) * sizeof(float));
    moe_permute_rows_cpu(x, r.perm_token, rows, d, xp_want);
    test_gpu_poison(gpu, d_xp.base, (yn + 1) * sizeof(uint16_t));
    CHECK_OK(moe_permute_rows_cuda(gpu, (const float *)d_x.ptr, d_perm, rows, d, (moe_bf16 *)d_xp.ptr));
    test_gpu_download(gpu, xp, d_xp.ptr, yn * sizeof(uint16_t));
    size_t bad = 0;
    for (size_t i = 0; i < yn; i++) bad += xp[i] != moe_bf16_from_float(xp_want[i]);
    CHECK(bad == 0, "%s: permute: %zu of %zu elements differ", name, bad, yn);
    printf("%-40s permute %zu rows: %zu mismatches\n", name, (size_t)rows, bad);

    /* combine */
    float *out = (float *)malloc(xn * sizeof(float)), *out_want = (float *)malloc(xn * sizeof(float));
    moe_combine_rows_cpu(yf, r.slot, c->gated ? gate : NULL, T, k, d, out_want);
    test_gpu_poison(gpu, d_out.base, (xn + 1) * sizeof(float));
    CHECK_OK(moe_combine_rows_cuda(gpu, (const moe_bf16 *)d_y.ptr, d_slot, d_gate, T, k, d, (float *)d_out.ptr));
    test_gpu_download(gpu, out, d_out.ptr, xn * sizeof(float));
    if (c->gated) {
        test_tolerance_check("combine", "bf16", out, out_want, xn, "%s", name);
    } else {
        CHECK(memcmp(out, out_want, xn * sizeof(float)) == 0, "%s combine: not bitwise equal to the CPU", name);
        printf("%-40s combine (unit gates): %s\n", name, memcmp(out, out_want, xn * sizeof(float)) ? "DIFFERS" : "bitwise equal");
    }

    /* combine backward, twice */
    float *dy_want = (float *)calloc(yn ? yn : 1, sizeof(float)), *dgate_want = (float *)malloc(an * sizeof(float));
    moe_combine_rows_backward_cpu(dout, yf, r.slot, c->gated ? gate : ones, T, k, d, dy_want, dgate_want);
    uint16_t *dy[2];
    float *dgate[2];
    for (int run = 0; run < 2; run++) {
        dy[run] = (uint16_t *)malloc((yn + d) * sizeof(uint16_t));
        dgate[run] = (float *)malloc(an * sizeof(float));
        test_gpu_poison(gpu, d_dy.base, (yn + d + 1) * sizeof(uint16_t));
        test_gpu_poison(gpu, d_dgate, an * sizeof(float));
        CHECK_OK(moe_combine_rows_backward_cuda(gpu, (const float *)d_dout.ptr, (const moe_bf16 *)d_y.ptr, d_slot, d_gate,
                                            T, k, d, (moe_bf16 *)d_dy.ptr, d_dgate));
        test_gpu_download(gpu, dy[run], d_dy.ptr, (yn + d) * sizeof(uint16_t));
        test_gpu_download(gpu, dgate[run], d_dgate, an * sizeof(float));
    }
    bad = 0;
    for (size_t i = 0; i < yn; i++) bad += dy[0][i] != moe_bf16_from_float(dy_want[i]);
    CHECK(bad == 0, "%s: backward dy: %zu of %zu elements differ", name, bad, yn);
    size_t touched = 0;
    for (int i = 0; i < d; i++) touched += dy[0][yn + i] != 0xFFFF;
    CHECK(touched == 0, "%s: backward wrote %zu elements past the last row", name, touched);
    size_t dropped_bad = 0;
    for (size_t a = 0; a < an; a++) dropped_bad += r.slot[a] < 0 && dgate[0][a] != 0.0f;
    CHECK(dropped_bad == 0, "%s: %zu dropped assignments got a non-zero dgate", name, dropped_bad);
    test_tolerance_check("combine backward dgate", "bf16", dgate[0], dgate_want, an, "%s", name);
    CHECK(memcmp(dy[0], dy[1], (yn + d) * sizeof(uint16_t)) == 0 && memcmp(dgate[0], dgate[1], an * sizeof(float)) == 0,
          "%s: backward run twice differs", name);
    printf("%-40s backward dy: %zu mismatches; two runs %s\n", name, bad,
           memcmp(dgate[0], dgate[1], an * sizeof(float)) ? "DIFFER" : "bitwise equal");

    for (int run = 0; run < 2; run++) free(dy[run]), free(dgate[run]);
    free(x), free(gate), free(ones), free(yf), free(dout), free(y), free(xp), free(xp_want), free(out);
    free(out_want), free(dy_want), free(dgate_want), free(r.slot), free(r.perm_token);
    void *dev[] = {d_x.base, d_y.base, d_dout.base, d_perm, d_slot, d_gate, d_xp.base, d_out.base, d_dy.base, d_dgate};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) test_gpu_free(gpu, dev[i]);
}

int main(void) {
    moe_gpu *gpu = test_gpu_require("test_gpu_permute");
    moe_rng rng = moe_rng_seeded(8);
    const int widths[] = {8, 12, 4096}, ks[] = {1, 2, 8};
    for (int w = 0; w < 3; w++)
        for (int ki = 0; ki < 3; ki++)
            for (int gated = 0; gated <= 1; gated++) {
                pcase c = {widths[w] == 4096 ? 300 : 2000, 16, ks[ki], widths[w], gated, 0};
                run_case(gpu, &c, &rng);
            }
    const pcase misaligned[] = {{300, 16, 2, 4096, 1, 1}, {2000, 16, 8, 8, 0, 1}, {500, 16, 2, 12, 1, 1}};
    for (size_t i = 0; i < sizeof misaligned / sizeof misaligned[0]; i++) run_case(gpu, &misaligned[i], &rng);
    moe_gpu_destroy(gpu);
    return test_finish("test_gpu_permute");
}
