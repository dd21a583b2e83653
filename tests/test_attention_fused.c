/* test_attention_fused.c — the fused attention's CPU kernels (kernels/attention_fused_cpu.c), in the float64 build:
 *  - against the materialized attention (kernels/attention_cpu.c, itself checked by finite differences in
 *    test_model_kernels): out, and dq, dk, dv, within 1e-12 relative, for S below a tile, one tile exactly, a tile
 *    and a tail, and several tiles; H = KV, H = 2 KV, KV = 1; 2 sequences;
 *  - lse against log(sum_j e^(s_ij)) written out in double;
 *  - dq, dk, dv by central finite differences (S = 70: two tiles, the second a tail);
 *  - causality: perturbing token t leaves every earlier row's output bitwise unchanged (the key tiles after a
 *    query tile are skipped, so this holds by construction, and is checked);
 *  - 1 and 2 threads give the same bits; the backward overwrites dq, dk, dv (they start as garbage);
 *  - bf16 (kernels/attention.h's rounding points): q, k, v and dout are read rounded (their rounded copies give the
 *    same bits), the result is within the rounding of P and dS of the materialized attention of the rounded inputs, and
 *    it differs from the fp32 result (something is rounded).
 * Run: meson test -C build test_attention_fused */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/threads.h"
#include "kernels/attention.h"
#include "kernels/cast.h"
#include "tests/test_util.h"

enum { NS = 2, H = 4, HD = 8 };

typedef struct {
    int S, kv, bf16;
    size_t nq, nkv;
    moe_real *q, *k, *v, *r, *out, *lse, *scratch;
} fused_case;

static moe_real *alloc_reals(size_t n) {
    moe_real *p = calloc(n ? n : 1, sizeof(moe_real));
    if (!p) abort();
    return p;
}

static void setup(fused_case *c, int S, int kv, uint64_t seed) {
    moe_rng rng = moe_rng_seeded(seed);
    c->S = S, c->kv = kv, c->bf16 = 0, c->nq = (size_t)NS * S * H * HD, c->nkv = (size_t)NS * S * kv * HD;
    c->q = alloc_reals(c->nq), c->k = alloc_reals(c->nkv), c->v = alloc_reals(c->nkv), c->r = alloc_reals(c->nq);
    c->out = alloc_reals(c->nq), c->lse = alloc_reals((size_t)NS * H * S);
    c->scratch = alloc_reals(64 * moe_attention_fused_scratch_count(HD));
    moe_rng_fill_uniform(&rng, c->q, c->nq, 1.5), moe_rng_fill_uniform(&rng, c->k, c->nkv, 1.5);
    moe_rng_fill_uniform(&rng, c->v, c->nkv, 1), moe_rng_fill_uniform(&rng, c->r, c->nq, 1);
}

static void release(fused_case *c) {
    free(c->q), free(c->k), free(c->v), free(c->r), free(c->out), free(c->lse), free(c->scratch);
}

static double loss(fused_case *c) { /* L = <out, r> */
    moe_attention_fused_forward_cpu(c->q, c->k, c->v, NS, c->S, H, c->kv, HD, c->bf16, c->lse, c->out, c->scratch);
    double s = 0;
    for (size_t i = 0; i < c->nq; i++) s += c->out[i] * c->r[i];
    return s;
}

static double rel_diff(const moe_real *a, const moe_real *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) num += (a[i] - b[i]) * (a[i] - b[i]), den += b[i] * b[i];
    return sqrt(num / (den > 0 ? den : 1));
}

/* against the materialized attention, and lse written out */
static void test_against_materialized(int S, int kv, uint64_t seed) {
    fused_case c;
    setup(&c, S, kv, seed);
    moe_real *att = alloc_reals((size_t)NS * H * S * S), *out_m = alloc_reals(c.nq);
    moe_real *att_scratch = alloc_reals(64 * (size_t)S * S);
    moe_real *dq[2], *dk[2], *dv[2];
    moe_rng rng = moe_rng_seeded(seed + 1);
    for (int i = 0; i < 2; i++) {
        dq[i] = alloc_reals(c.nq), dk[i] = alloc_reals(c.nkv), dv[i] = alloc_reals(c.nkv);
        moe_rng_fill_uniform(&rng, dq[i], c.nq, 9), moe_rng_fill_uniform(&rng, dk[i], c.nkv, 9); /* garbage */
        moe_rng_fill_uniform(&rng, dv[i], c.nkv, 9);
    }
    loss(&c);
    moe_attention_forward_cpu(c.q, c.k, c.v, NS, S, H, kv, HD, att, out_m);
    moe_attention_fused_backward_cpu(c.q, c.k, c.v, c.out, c.lse, c.r, NS, S, H, kv, HD, 0, dq[0], dk[0], dv[0],
                                     c.scratch);
    moe_attention_backward_cpu(c.q, c.k, c.v, att, c.r, NS, S, H, kv, HD, dq[1], dk[1], dv[1], att_scratch);
    const double e_out = rel_diff(c.out, out_m, c.nq), e_dq = rel_diff(dq[0], dq[1], c.nq),
                 e_dk = rel_diff(dk[0], dk[1], c.nkv), e_dv = rel_diff(dv[0], dv[1], c.nkv);
    CHECK(e_out < 1e-12 && e_dq < 1e-12 && e_dk < 1e-12 && e_dv < 1e-12,
          "S=%d kv=%d: fused vs materialized: out %.2g, dq %.2g, dk %.2g, dv %.2g", S, kv, e_out, e_dq, e_dk, e_dv);
    double worst_lse = 0; /* lse_i = log sum_{j <= i} e^(scale q_i . k_j) */
    const int group = H / kv;
    for (int n = 0; n < NS; n++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < S; i++) {
                double sum = 0;
                for (int j = 0; j <= i; j++) {
                    double s = 0;
                    for (int x = 0; x < HD; x++)
                        s += c.q[(((size_t)n * S + i) * H + h) * HD + x] * c.k[(((size_t)n * S + j) * kv + h / group) * HD + x];
                    sum += exp(s / sqrt((double)HD));
                }
                const double got = c.lse[((size_t)n * H + h) * S + i];
                worst_lse = fmax(worst_lse, fabs(got - log(sum)) / fmax(1, fabs(log(sum))));
            }
    CHECK(worst_lse < 1e-13, "S=%d kv=%d: lse off by %.2g", S, kv, worst_lse);
    printf("S=%-4d kv=%d: fused vs materialized out %.1e dq %.1e dk %.1e dv %.1e; lse %.1e\n", S, kv, e_out, e_dq, e_dk,
           e_dv, worst_lse);
    for (int i = 0; i < 2; i++) free(dq[i]), free(dk[i]), free(dv[i]);
    free(att), free(out_m), free(att_scratch);
    release(&c);
}

/* dq, dk, dv by central differences of L = <out, r> */
static void test_finite_differences(int S, int kv) {
    fused_case c;
    setup(&c, S, kv, 77);
    moe_real *dq = alloc_reals(c.nq), *dk = alloc_reals(c.nkv), *dv = alloc_reals(c.nkv);
    loss(&c);
    moe_attention_fused_backward_cpu(c.q, c.k, c.v, c.out, c.lse, c.r, NS, S, H, kv, HD, 0, dq, dk, dv, c.scratch);
    moe_real *x[3] = {c.q, c.k, c.v}, *g[3] = {dq, dk, dv};
    const size_t n[3] = {c.nq, c.nkv, c.nkv};
    const char *names[3] = {"dq", "dk", "dv"};
    int bad = 0;
    double worst = 0;
    for (int w = 0; w < 3; w++)
        for (size_t i = 0; i < n[w]; i += 7) { /* every 7th element: all rows, tiles and heads are reached */
            const moe_real saved = x[w][i], eps = 1e-6;
            x[w][i] = saved + eps;
            const double up = loss(&c);
            x[w][i] = saved - eps;
            const double down = loss(&c);
            x[w][i] = saved;
            const double numeric = (up - down) / (2 * eps), err = fabs(g[w][i] - numeric) / (1e-8 + 1e-6 * fabs(numeric));
            worst = fmax(worst, err);
            if (err > 1 && bad++ < 5) printf("FAIL %s[%zu]: %.12g, numeric %.12g\n", names[w], i, g[w][i], numeric);
        }
    CHECK(bad == 0, "S=%d kv=%d: %d gradient values off their finite differences", S, kv, bad);
    printf("S=%-4d kv=%d: dq, dk, dv against central differences (every 7th), worst %.2g of the tolerance\n", S, kv,
           worst);
    free(dq), free(dk), free(dv);
    release(&c);
}

/* causality, thread counts, bitwise */
static void test_causal_and_threads(int S) {
    fused_case c;
    setup(&c, S, 2, 99);
    loss(&c);
    moe_real *out0 = alloc_reals(c.nq);
    memcpy(out0, c.out, c.nq * sizeof *out0);
    const int row = H * HD, kvrow = 2 * HD, t = S / 2 + 3; /* a token in the second tile */
    for (int i = 0; i < row; i++) c.q[(size_t)t * row + i] += 0.5;
    for (int i = 0; i < kvrow; i++) c.k[(size_t)t * kvrow + i] -= 0.7, c.v[(size_t)t * kvrow + i] += 0.9;
    loss(&c);
    CHECK(!memcmp(c.out, out0, (size_t)t * row * sizeof *out0), "S=%d: perturbing token %d changed an earlier row", S, t);
    CHECK(!memcmp(c.out + (size_t)S * row, out0 + (size_t)S * row, (size_t)S * row * sizeof *out0),
          "S=%d: perturbing sequence 0 changed sequence 1", S);
    /* 1 and 2 threads: the same bits, forward and backward */
    moe_real *d[2][3];
    const int threads = moe_threads_get();
    for (int run = 0; run < 2; run++) {
        moe_threads_set(run + 1);
        loss(&c);
        d[run][0] = alloc_reals(c.nq), d[run][1] = alloc_reals(c.nkv), d[run][2] = alloc_reals(c.nkv);
        moe_attention_fused_backward_cpu(c.q, c.k, c.v, c.out, c.lse, c.r, NS, S, H, 2, HD, 0, d[run][0], d[run][1],
                                         d[run][2], c.scratch);
        if (run == 0) memcpy(out0, c.out, c.nq * sizeof *out0);
    }
    moe_threads_set(threads);
    CHECK(!memcmp(out0, c.out, c.nq * sizeof *out0) && !memcmp(d[0][0], d[1][0], c.nq * sizeof(moe_real)) &&
              !memcmp(d[0][1], d[1][1], c.nkv * sizeof(moe_real)) && !memcmp(d[0][2], d[1][2], c.nkv * sizeof(moe_real)),
          "S=%d: 1 and 2 threads differ", S);
    for (int run = 0; run < 2; run++)
        for (int i = 0; i < 3; i++) free(d[run][i]);
    free(out0);
    release(&c);
}

/* out, dq, dk, dv of the fused attention at c's precision (dout = c->r) */
static void fused_pass(fused_case *c, moe_real *dq, moe_real *dk, moe_real *dv) {
    loss(c);
    moe_attention_fused_backward_cpu(c->q, c->k, c->v, c->out, c->lse, c->r, NS, c->S, H, c->kv, HD, c->bf16, dq, dk, dv,
                                     c->scratch);
}

static void round_all(moe_real *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = moe_bf16_round((float)x[i]);
}

/* bf16's rounding points (kernels/attention.h) */
static void test_bf16_rounding_points(int S, int kv) {
    fused_case c;
    setup(&c, S, kv, 500 + S);
    moe_real *g[3][3], *out[3]; /* runs: fp32, bf16, bf16 of the rounded inputs; each dq, dk, dv */
    for (int run = 0; run < 3; run++) {
        g[run][0] = alloc_reals(c.nq), g[run][1] = alloc_reals(c.nkv), g[run][2] = alloc_reals(c.nkv);
        out[run] = alloc_reals(c.nq);
        c.bf16 = run > 0;
        if (run == 2) round_all(c.q, c.nq), round_all(c.k, c.nkv), round_all(c.v, c.nkv), round_all(c.r, c.nq);
        fused_pass(&c, g[run][0], g[run][1], g[run][2]);
        memcpy(out[run], c.out, c.nq * sizeof(moe_real));
    }
    const size_t bytes[3] = {c.nq * sizeof(moe_real), c.nkv * sizeof(moe_real), c.nkv * sizeof(moe_real)};
    CHECK(!memcmp(out[1], out[2], bytes[0]) && !memcmp(g[1][0], g[2][0], bytes[0]) &&
              !memcmp(g[1][1], g[2][1], bytes[1]) && !memcmp(g[1][2], g[2][2], bytes[2]),
          "S=%d kv=%d bf16: q, k, v, dout and their rounded copies give different bits (an unrounded read)", S, kv);
    /* the materialized attention (double) of the rounded inputs: bf16's result up to its rounding of P and dS, each
     * 2^-9 relative per term of sums over up to S random-signed terms: 1e-2 of the rms (3e-3 measured) */
    moe_real *att = alloc_reals((size_t)NS * H * S * S), *ref[4], *att_scratch = alloc_reals(64 * (size_t)S * S);
    ref[0] = alloc_reals(c.nq), ref[1] = alloc_reals(c.nq), ref[2] = alloc_reals(c.nkv), ref[3] = alloc_reals(c.nkv);
    moe_attention_forward_cpu(c.q, c.k, c.v, NS, S, H, kv, HD, att, ref[0]);
    moe_attention_backward_cpu(c.q, c.k, c.v, att, c.r, NS, S, H, kv, HD, ref[1], ref[2], ref[3], att_scratch);
    const double e[4] = {rel_diff(out[1], ref[0], c.nq), rel_diff(g[1][0], ref[1], c.nq),
                         rel_diff(g[1][1], ref[2], c.nkv), rel_diff(g[1][2], ref[3], c.nkv)};
    const double moved = rel_diff(out[1], out[0], c.nq); /* from the fp32 result: the inputs' rounding, ~2^-9 */
    CHECK(e[0] < 1e-2 && e[1] < 1e-2 && e[2] < 1e-2 && e[3] < 1e-2,
          "S=%d kv=%d bf16 vs the materialized attention of the rounded inputs: out %.2g dq %.2g dk %.2g dv %.2g", S,
          kv, e[0], e[1], e[2], e[3]);
    CHECK(moved > 1e-5 && moved < 2e-2, "S=%d kv=%d: bf16's out moved %.2g from fp32's (expected ~2^-9)", S, kv, moved);
    printf("S=%-4d kv=%d bf16: vs the rounded inputs' attention out %.1e dq %.1e dk %.1e dv %.1e; vs fp32 %.1e\n", S,
           kv, e[0], e[1], e[2], e[3], moved);
    for (int run = 0; run < 3; run++) free(g[run][0]), free(g[run][1]), free(g[run][2]), free(out[run]);
    for (int i = 0; i < 4; i++) free(ref[i]);
    free(att), free(att_scratch);
    release(&c);
}

int main(void) {
    const int lengths[] = {5, 64, 70, 130, 200};
    for (size_t i = 0; i < sizeof lengths / sizeof lengths[0]; i++)
        for (int kv = H; kv >= 1; kv /= 2) test_against_materialized(lengths[i], kv, 100 + i * 7 + kv);
    test_finite_differences(70, 2);
    test_finite_differences(5, 1);
    test_causal_and_threads(130);
    test_bf16_rounding_points(70, 2);
    test_bf16_rounding_points(200, 1);
    return test_finish("test_attention_fused");
}
