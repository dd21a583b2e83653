/* test_model_kernels.c — the dense model's CPU kernels, in the float64 build (so tolerances can be tight):
 *  - rmsnorm: a hand-computed value; dx and dw by central finite differences; both accumulate (+=);
 *  - rope: the backward is the exact transpose, <rope(x), y> = <x, rope_backward(y)>; position 0 (of every
 *    sequence) is the identity; a hand-computed rotation; a kept cos/sin table gives the per-call bits;
 *  - attention: dq, dk, dv by finite differences for H = KV, H = 2 KV and KV = 1; a hand-computed case;
 *    GQA equals repeat_kv; the saved probabilities; causality (perturbing a token leaves earlier outputs
 *    and other sequences bitwise unchanged);
 *  - cross_entropy: hand-computed values (also at logits ~1000), log V for uniform logits, gradient by FD;
 *  - embedding: exact gather; the backward adds repeated tokens in token order;
 *  - adamw: one step against the formula written out in double, weight decay 0 and > 0, step 1.
 * FD losses are random linear functionals L = <out, R>. Run: meson test -C build test_model_kernels */
#include <math.h>
#include <string.h>

#include "core/threads.h"
#include "kernels/adamw.h"
#include "kernels/attention.h"
#include "kernels/cross_entropy.h"
#include "kernels/embedding.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "tests/test_util.h"

static const double kEps = 1e-6, kAbsTol = 1e-8, kRelTol = 1e-6;
static double worst; /* largest |analytic - numeric| / tolerance of the last check_fd calls */

static double dot(const moe_real *a, const moe_real *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* Every entry of v: analytic grad[i] against (L(v + eps e_i) - L(v - eps e_i)) / 2 eps. */
static int check_fd(const char *what, double (*loss)(void *), void *ctx, moe_real *v, const moe_real *grad, size_t n) {
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        moe_real saved = v[i];
        v[i] = saved + kEps;
        double up = loss(ctx);
        v[i] = saved - kEps;
        double down = loss(ctx);
        v[i] = saved;
        double num = (up - down) / (2 * kEps), ratio = fabs(grad[i] - num) / (kAbsTol + kRelTol * fabs(num));
        worst = ratio > worst ? ratio : worst;
        if (ratio > 1 && bad++ < 3)
            CHECK(0, "%s[%zu]: analytic %.12g, finite difference %.12g", what, i, grad[i], num);
    }
    return bad;
}

enum { NT = 6, ND = 8 };
typedef struct {
    moe_real x[NT * ND], w[ND], r[NT * ND], y[NT * ND], rstd[NT];
} norm_ctx;
static double norm_loss(void *c) {
    norm_ctx *p = c;
    moe_rmsnorm_forward_cpu(p->x, p->w, NT, ND, 1e-5, p->y, p->rstd);
    return dot(p->y, p->r, NT * ND);
}
static void test_rmsnorm(void) {
    moe_rng rng = moe_rng_seeded(11);
    norm_ctx p;
    moe_real dx[NT * ND], dw[ND], dx0[NT * ND], dw0[ND];
    moe_rng_fill_uniform(&rng, p.x, NT * ND, 2), moe_rng_fill_uniform(&rng, p.w, ND, 1.5);
    moe_rng_fill_uniform(&rng, p.r, NT * ND, 1);
    moe_rng_fill_uniform(&rng, dx0, NT * ND, 1), moe_rng_fill_uniform(&rng, dw0, ND, 1); /* backward adds */
    memcpy(dx, dx0, sizeof dx), memcpy(dw, dw0, sizeof dw);
    norm_loss(&p);
    moe_rmsnorm_backward_cpu(p.x, p.w, p.rstd, p.r, NT, ND, dx, dw);
    for (int i = 0; i < NT * ND; i++) dx[i] -= dx0[i];
    for (int i = 0; i < ND; i++) dw[i] -= dw0[i];
    worst = 0;
    int bad = check_fd("rmsnorm dx", norm_loss, &p, p.x, dx, NT * ND);
    bad += check_fd("rmsnorm dw", norm_loss, &p, p.w, dw, ND);
    /* by hand: x = (3, 4), w = (1, 2), eps = 0.5: rstd = 1 / sqrt((9 + 16) / 2 + 0.5) = 1 / sqrt(13) */
    moe_real hx[2] = {3, 4}, hw[2] = {1, 2}, hy[2], hr;
    moe_rmsnorm_forward_cpu(hx, hw, 1, 2, 0.5, hy, &hr);
    CHECK(fabs(hr - 1 / sqrt(13.0)) < 1e-16 && fabs(hy[0] - 3 / sqrt(13.0)) < 1e-15 &&
          fabs(hy[1] - 8 / sqrt(13.0)) < 1e-15, "hand case: rstd %.17g, y %.17g %.17g", hr, hy[0], hy[1]);
    printf("rmsnorm: T=%d d=%d, FD mismatches %d (worst error/tolerance %.2g)\n", NT, ND, bad, worst);
}

static void test_rope(void) {
    enum { NS = 2, S = 5, H = 3, HD = 8, N = NS * S * H * HD };
    moe_rng rng = moe_rng_seeded(12);
    moe_real x[N], y[N], rx[N], ry[N];
    moe_rng_fill_uniform(&rng, x, N, 1), moe_rng_fill_uniform(&rng, y, N, 1);
    const moe_rope plain = moe_rope_plain(10000), hundred = moe_rope_plain(100), wide = moe_rope_plain(500000);
    /* DeepSeek-V3's YaRN (config.json's rope_scaling: factor 40 over 4096 positions, betas 32 and 1), with an
     * amplitude other than 1 (Qwen3's at factor 4) */
    const moe_rope yarn = {10000, 40, 4096, 32, 1, 1.1386294361119891};
    double lhs = 0, rhs = 0;
    for (int k = 0; k < 2; k++) { /* the backward is the forward's transpose, amplitude and all */
        const moe_rope *r = k ? &yarn : &plain;
        memcpy(rx, x, sizeof x), memcpy(ry, y, sizeof y);
        moe_rope_forward_cpu(rx, NS, S, H, HD, r);
        moe_rope_backward_cpu(ry, NS, S, H, HD, r);
        lhs = dot(rx, y, N), rhs = dot(x, ry, N);
        CHECK(fabs(lhs - rhs) <= 1e-12, "%s: <rope(x), y> = %.17g but <x, rope^T(y)> = %.17g", k ? "yarn" : "plain",
              lhs, rhs);
    }
    memcpy(rx, x, sizeof x), memcpy(ry, y, sizeof y);
    moe_rope_forward_cpu(rx, NS, S, H, HD, &plain);
    /* YaRN's frequencies at head_dim 8, as transformers 5.23's _compute_yarn_parameters gives them for that config:
     * the correction range is [floor(1.31), ceil(2.81)] = [1, 3], so f_0 and f_1 are kept, f_2 = 0.01 (1/40 0.5 + 0.5)
     * and f_3 = 0.001 / 40 */
    const double want_f[4] = {1, 0.1, 0.005125, 2.5e-5};
    for (int i = 0; i < 4; i++)
        CHECK(fabs(moe_rope_frequency(&yarn, i, 8) - want_f[i]) <= 1e-15 * want_f[i] &&
                  moe_rope_frequency(&plain, i, 8) == pow(10000, -2.0 * i / 8),
              "frequency %d: yarn %.17g (want %.17g), plain %.17g", i, moe_rope_frequency(&yarn, i, 8), want_f[i],
              moe_rope_frequency(&plain, i, 8));
    for (int n = 0; n < NS; n++) /* position 0 of each sequence is not rotated */
        CHECK(!memcmp(rx + n * S * H * HD, x + n * S * H * HD, H * HD * sizeof(moe_real)),
              "position 0 of sequence %d was rotated", n);
    CHECK(memcmp(rx + H * HD, x + H * HD, H * HD * sizeof(moe_real)), "position 1 was not rotated");
    /* hd = 4, theta = 100, position 1: f_0 = 1, f_1 = 100^(-1/2) = 0.1 */
    moe_real h[2 * 4] = {9, 9, 9, 9, 1, 2, 3, 4};
    const double c0 = cos(1.0), s0 = sin(1.0), c1 = cos(0.1), s1 = sin(0.1);
    const double want[4] = {1 * c0 - 3 * s0, 2 * c1 - 4 * s1, 3 * c0 + 1 * s0, 4 * c1 + 2 * s1};
    moe_rope_forward_cpu(h, 1, 2, 1, 4, &hundred);
    for (int i = 0; i < 4; i++)
        CHECK(fabs(h[4 + i] - want[i]) <= 1e-14 && h[i] == 9, "hand case [%d]: %.17g, want %.17g", i, h[4 + i],
              want[i]);
    /* with YaRN (theta 100, factor 2 over 4 positions, betas 32 and 1: the range collapses to [0, 0.001], so f_0 = 1
     * is kept and f_1 = 0.1 / 2) and amplitude 1.5, the rotation scaled (position 0 too) */
    const moe_rope small = {100, 2, 4, 32, 1, 1.5};
    moe_real g[2 * 4] = {9, 9, 9, 9, 1, 2, 3, 4};
    const double c2 = cos(0.05), s2 = sin(0.05);
    const double want_g[4] = {1.5 * (1 * c0 - 3 * s0), 1.5 * (2 * c2 - 4 * s2), 1.5 * (3 * c0 + 1 * s0),
                              1.5 * (4 * c2 + 2 * s2)};
    moe_rope_forward_cpu(g, 1, 2, 1, 4, &small);
    for (int i = 0; i < 4; i++)
        CHECK(fabs(g[4 + i] - want_g[i]) <= 1e-14 && g[i] == 13.5, "yarn hand case [%d]: %.17g, want %.17g", i,
              g[4 + i], want_g[i]);
    printf("rope: <rope(x),y> - <x,rope^T(y)> = %.3g\n", lhs - rhs);
    /* a kept table gives the per-call bits, forward and backward; head_dim 1030 also crosses the per-call path's
     * rounds of 512 frequencies */
    enum { TS = 4, TH = 2, WIDE = 1030, TN = 1 * TS * TH * WIDE };
    const moe_rope *ropes[2] = {&wide, &yarn};
    static moe_real t_in[TN], t_call[TN], t_kept[TN], table[TS * WIDE];
    const int dims[] = {HD, WIDE};
    for (int d = 0; d < 2; d++)
        for (int backward = 0; backward < 2; backward++)
            for (int k = 0; k < 2; k++) {
                const int n = TS * TH * dims[d];
                moe_rng_fill_uniform(&rng, t_in, n, 1);
                memcpy(t_call, t_in, n * sizeof(moe_real)), memcpy(t_kept, t_in, n * sizeof(moe_real));
                (backward ? moe_rope_backward_cpu : moe_rope_forward_cpu)(t_call, 1, TS, TH, dims[d], ropes[k]);
                moe_rope_table_cpu(TS, dims[d], ropes[k], table);
                moe_rope_rotate_cpu(t_kept, 1, TS, TH, dims[d], table, backward);
                CHECK(!memcmp(t_call, t_kept, n * sizeof(moe_real)), "rope with a kept table differs (hd %d, %s, %s)",
                      dims[d], backward ? "backward" : "forward", k ? "yarn" : "plain");
            }
}

enum { AN = 3, AS = 5, AH = 4, AHD = 4, AQ = AN * AS * AH * AHD };
typedef struct {
    int kv;
    moe_real q[AQ], k[AQ], v[AQ], r[AQ], out[AQ], att[AN * AH * AS * AS];
} attn_ctx;
static double attn_loss(void *c) {
    attn_ctx *p = c;
    moe_attention_forward_cpu(p->q, p->k, p->v, AN, AS, AH, p->kv, AHD, p->att, p->out);
    return dot(p->out, p->r, AQ);
}
static void test_attention(int kv, uint64_t seed) {
    static attn_ctx p;
    moe_rng rng = moe_rng_seeded(seed);
    const size_t nkv = (size_t)AN * AS * kv * AHD;
    moe_real dq[AQ], dk[AQ], dv[AQ], out0[AQ];
    static moe_real scratch[64 * AS * AS]; /* one [S, S] per thread */
    if (moe_threads_get() > 64) {
        CHECK(0, "%d threads: the attention scratch holds 64", moe_threads_get());
        return;
    }
    p.kv = kv;
    moe_rng_fill_uniform(&rng, p.q, AQ, 1.5), moe_rng_fill_uniform(&rng, p.k, nkv, 1.5);
    moe_rng_fill_uniform(&rng, p.v, nkv, 1), moe_rng_fill_uniform(&rng, p.r, AQ, 1);
    /* garbage: the backward overwrites */
    moe_rng_fill_uniform(&rng, dq, AQ, 7), moe_rng_fill_uniform(&rng, dk, AQ, 7), moe_rng_fill_uniform(&rng, dv, AQ, 7);
    attn_loss(&p);
    for (int b = 0; b < AN * AH; b++)
        for (int i = 0; i < AS; i++) {
            const moe_real *row = p.att + ((size_t)b * AS + i) * AS;
            double sum = 0;
            for (int j = 0; j < AS; j++) sum += row[j];
            CHECK(fabs(sum - 1) < 1e-14, "att block %d row %d sums to %.17g", b, i, sum);
            for (int j = i + 1; j < AS; j++)
                CHECK(row[j] == 0, "att block %d [%d,%d] = %g above the diagonal", b, i, j, row[j]);
        }
    /* GQA is Hugging Face's repeat_kv: the same as H = KV with kv head h / (H / KV) copied to head h */
    static moe_real kx[AQ], vx[AQ], outx[AQ], attx[AN * AH * AS * AS];
    for (int t = 0; t < AN * AS; t++)
        for (int h = 0; h < AH; h++)
            for (int i = 0; i < AHD; i++) {
                kx[(t * AH + h) * AHD + i] = p.k[(t * kv + h / (AH / kv)) * AHD + i];
                vx[(t * AH + h) * AHD + i] = p.v[(t * kv + h / (AH / kv)) * AHD + i];
            }
    moe_attention_forward_cpu(p.q, kx, vx, AN, AS, AH, AH, AHD, attx, outx);
    for (int i = 0; i < AQ; i++)
        CHECK(fabs(outx[i] - p.out[i]) < 1e-14, "kv=%d: out[%d] differs from repeat_kv", kv, i);
    moe_attention_backward_cpu(p.q, p.k, p.v, p.att, p.r, AN, AS, AH, kv, AHD, dq, dk, dv, scratch);
    worst = 0;
    int bad = check_fd("attention dq", attn_loss, &p, p.q, dq, AQ);
    bad += check_fd("attention dk", attn_loss, &p, p.k, dk, nkv);
    bad += check_fd("attention dv", attn_loss, &p, p.v, dv, nkv);
    /* causality: perturb all of token t of sequence 1 (q, k, v); rows before t and other sequences keep
     * their bits, rows from t on in sequence 1 change */
    static moe_real q0[AQ], k0[AQ], v0[AQ];
    attn_loss(&p);
    memcpy(out0, p.out, sizeof out0);
    memcpy(q0, p.q, sizeof q0), memcpy(k0, p.k, sizeof k0), memcpy(v0, p.v, sizeof v0);
    const int qrow = AH * AHD, kvrow = kv * AHD;
    for (int t = 1; t < AS; t++) {
        int tok = AS + t, changed = 0;
        for (int i = 0; i < qrow; i++) p.q[tok * qrow + i] += 0.5;
        for (int i = 0; i < kvrow; i++) p.k[tok * kvrow + i] -= 0.7, p.v[tok * kvrow + i] += 0.9;
        attn_loss(&p);
        for (int row = 0; row < AN * AS; row++) {
            int same = !memcmp(p.out + row * qrow, out0 + row * qrow, qrow * sizeof(moe_real));
            CHECK(same || (row >= tok && row < 2 * AS), "kv=%d: perturbing token %d changed output row %d", kv,
                  tok, row);
            changed += !same;
        }
        CHECK(changed == AS - t, "kv=%d: perturbing token %d changed %d rows, want %d", kv, tok, changed, AS - t);
        memcpy(p.q, q0, sizeof q0), memcpy(p.k, k0, sizeof k0), memcpy(p.v, v0, sizeof v0);
    }
    printf("attention: seqs=%d S=%d H=%d KV=%d hd=%d, FD mismatches %d (worst %.2g)\n", AN, AS, AH, kv, AHD, bad,
           worst);
}

/* One head, S = 2, hd = 4 (scale 1/2): token 1's scores are q1.k0 / 2 = 0.5 and q1.k1 / 2 = 1, so
 * P[1] = (1, e^0.5) / (1 + e^0.5); token 0 attends only to itself. */
static void test_attention_hand(void) {
    const moe_real q[8] = {0, 0, 0, 0, 1, 1, 0, 0}, k[8] = {1, 0, 0, 0, 0, 2, 1, 0};
    const moe_real v[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    moe_real att[4], out[8];
    moe_attention_forward_cpu(q, k, v, 1, 2, 1, 1, 4, att, out);
    const double p10 = 1 / (1 + exp(0.5)), p11 = 1 - p10;
    CHECK(att[0] == 1 && att[1] == 0 && fabs(att[2] - p10) < 1e-15 && fabs(att[3] - p11) < 1e-15,
          "att %.17g %.17g %.17g %.17g, want 1 0 %.17g %.17g", att[0], att[1], att[2], att[3], p10, p11);
    for (int i = 0; i < 4; i++)
        CHECK(out[i] == v[i] && fabs(out[4 + i] - (p10 * v[i] + p11 * v[4 + i])) < 1e-14,
              "hand case out[.][%d]: %.17g %.17g", i, out[i], out[4 + i]);
}

enum { CT = 4, CV = 7 };
typedef struct {
    moe_real logits[CT * CV];
    int targets[CT];
} ce_ctx;
static double ce_loss(void *c) {
    ce_ctx *p = c;
    return moe_cross_entropy_forward_cpu(p->logits, p->targets, CT, CV) / CT;
}
static void test_cross_entropy(void) {
    /* logsumexp(1, 2, 3) - 1 = 2 + log(1 + e^-1 + e^-2), by hand 2.4076059644443806; shifting every logit
     * by 1000 must not change it (a naive exp would overflow) */
    const double want = 2 + log(1 + exp(-1.0) + exp(-2.0));
    moe_real l[2 * 3] = {1, 2, 3, 1001, 1002, 1003};
    int tg[2] = {0, 0};
    CHECK(fabs(want - 2.4076059644443806) < 1e-15, "hand value %.17g", want);
    double one = moe_cross_entropy_forward_cpu(l, tg, 1, 3), two = moe_cross_entropy_forward_cpu(l, tg, 2, 3);
    CHECK(fabs(one - want) < 1e-14, "loss of (1,2,3)/target 0: %.17g, want %.17g", one, want);
    CHECK(fabs(two - 2 * want) < 1e-12, "loss with logits ~1000: %.17g, want %.17g", two, 2 * want);
    moe_cross_entropy_backward_cpu(l, tg, 2, 3, 1); /* shift-invariant too: softmax - onehot of (1, 2, 3) */
    for (int i = 0; i < 3; i++) {
        double want_g = exp(i + 1.0) / (exp(1.0) + exp(2.0) + exp(3.0)) - (i == 0);
        CHECK(fabs(l[i] - want_g) < 1e-15 && fabs(l[3 + i] - want_g) < 1e-15, "dlogits[%d]: %.17g and %.17g, want "
              "%.17g", i, l[i], l[3 + i], want_g);
    }
    /* the row's largest logit in its last column, far above the rest: the max must see every column, the last too
     * (mutation testing, 2026-12-08: a max over V - 1 columns gave Inf; the tests above have no such row) */
    moe_real last[8] = {0, 0, 0, 0, 0, 0, 0, 1000};
    int seven = 7;
    const double at_last = moe_cross_entropy_forward_cpu(last, &seven, 1, 8);
    CHECK(fabs(at_last - 7 * exp(-1000.0)) < 1e-300 && isfinite(at_last), "loss with the max last: %.17g, want ~0",
          at_last);
    moe_real u[CT * CV];
    int ut[CT] = {0, 3, 6, 2}; /* uniform logits: every loss is log V */
    for (int i = 0; i < CT * CV; i++) u[i] = 3.25;
    double lu = moe_cross_entropy_forward_cpu(u, ut, CT, CV);
    CHECK(fabs(lu - CT * log(CV)) < 1e-13, "uniform logits: %.17g, want T log V = %.17g", lu, CT * log(CV));

    moe_rng rng = moe_rng_seeded(13);
    ce_ctx p = {.targets = {4, 0, 6, 4}};
    moe_rng_fill_uniform(&rng, p.logits, CT * CV, 3);
    moe_real grad[CT * CV];
    memcpy(grad, p.logits, sizeof grad);
    moe_cross_entropy_backward_cpu(grad, p.targets, CT, CV, (moe_real)1.0 / CT);
    worst = 0;
    int bad = check_fd("cross_entropy dlogits", ce_loss, &p, p.logits, grad, CT * CV);
    printf("cross_entropy: hand value %.15g, T=%d V=%d, FD mismatches %d (worst %.2g)\n", one, CT, CV, bad,
           worst);
}

static void test_embedding(void) {
    enum { V = 5, D = 3, T = 6 };
    const int tokens[T] = {3, 1, 3, 0, 3, 1};
    moe_rng rng = moe_rng_seeded(14);
    moe_real table[V * D], y[T * D], dy[T * D], dtable[V * D], want[V * D];
    moe_rng_fill_uniform(&rng, table, V * D, 1);
    moe_embedding_forward_cpu(table, tokens, T, D, y);
    for (int t = 0; t < T; t++)
        CHECK(!memcmp(y + t * D, table + tokens[t] * D, D * sizeof(moe_real)), "row %d is not table[%d]", t,
              tokens[t]);
    moe_rng_fill_uniform(&rng, dy, T * D, 1), moe_rng_fill_uniform(&rng, dtable, V * D, 1);
    /* column 0 of token 3 (rows 0, 2, 4): 1e17 + -1e17 + 1 is 1 in this order, 0 in reverse or pairwise */
    dy[0 * D] = 1e17, dy[2 * D] = -1e17, dy[4 * D] = 1, dtable[3 * D] = 0;
    memcpy(want, dtable, sizeof want);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < D; i++) want[tokens[t] * D + i] += dy[t * D + i];
    moe_embedding_backward_cpu(dy, tokens, T, D, dtable);
    CHECK(!memcmp(dtable, want, sizeof want), "embedding backward differs from the in-order sum");
    CHECK(dtable[3 * D] == 1, "token 3, column 0: %g, want 1 (summed in token order)", dtable[3 * D]);
    printf("embedding: gather and in-order scatter-add exact\n");
}

static void test_adamw(void) {
    enum { N = 9 };
    moe_rng rng = moe_rng_seeded(15);
    for (int c = 0; c < 4; c++) {
        const moe_adamw_params hp = {.lr = 3e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                                     .weight_decay = c & 1 ? 0.1f : 0.0f, .step = c < 2 ? 1 : 7};
        moe_real p[N], g[N], m[N], v[N], p0[N], m0[N], v0[N];
        moe_rng_fill_uniform(&rng, p, N, 1), moe_rng_fill_uniform(&rng, g, N, 0.5);
        moe_rng_fill_uniform(&rng, m, N, hp.step == 1 ? 0 : 0.1);
        for (int i = 0; i < N; i++) v[i] = hp.step == 1 ? 0 : 0.01 + 0.01 * fabs(moe_rng_uniform(&rng));
        g[0] = 0; /* a zero gradient at step 1: the update is pure decay */
        memcpy(p0, p, sizeof p), memcpy(m0, m, sizeof m), memcpy(v0, v, sizeof v);
        moe_adamw_update_cpu(p, g, m, v, N, &hp);
        const double b1 = hp.beta1, b2 = hp.beta2, lr = hp.lr, eps = hp.eps, wd = hp.weight_decay;
        int before = test_failures;
        for (int i = 0; i < N; i++) {
            double mm = b1 * m0[i] + (1 - b1) * g[i], vv = b2 * v0[i] + (1 - b2) * g[i] * g[i];
            double mh = mm / (1 - pow(b1, (double)hp.step)), vh = vv / (1 - pow(b2, (double)hp.step));
            double pp = p0[i] - lr * (mh / (sqrt(vh) + eps) + wd * p0[i]);
            if (hp.step == 1) /* the bias-corrected moments are g and g^2: the step is ~lr sign(g) */
                pp = p0[i] - lr * (g[i] / (fabs(g[i]) + eps) + wd * p0[i]);
            CHECK(fabs(p[i] - pp) <= 1e-15, "adamw step %ld wd %g [%d]: p %.17g, want %.17g", hp.step, wd, i,
                  p[i], pp);
            CHECK(fabs(m[i] - mm) <= 1e-16 && fabs(v[i] - vv) <= 1e-16, "adamw moments [%d]: m %.17g (want %.17g) "
                  "v %.17g (want %.17g)", i, m[i], mm, v[i], vv);
        }
        printf("adamw: step %ld weight_decay %g, failed checks %d\n", hp.step, wd, test_failures - before);
    }
}

/* Clipping folded into AdamW (adamw.h): the bits of scaling the gradient first (dense_ops' scale: the product in
 * double, rounded once) and then updating with the scaled gradient; the gradient itself left alone. */
static void test_adamw_clip(void) {
    enum { N = 4099 };
    moe_rng rng = moe_rng_seeded(16);
    static moe_real p[2][N], m[2][N], v[2][N], g[N], scaled[N];
    moe_rng_fill_uniform(&rng, p[0], N, 1), moe_rng_fill_uniform(&rng, g, N, 3.0);
    moe_rng_fill_uniform(&rng, m[0], N, 0.1);
    for (int i = 0; i < N; i++) v[0][i] = 0.01 + 0.01 * fabs(moe_rng_uniform(&rng));
    memcpy(p[1], p[0], sizeof p[0]), memcpy(m[1], m[0], sizeof m[0]), memcpy(v[1], v[0], sizeof v[0]);
    const double factor = 1.0 / 3.7; /* clip / norm: not a power of two, so the products round */
    int rounded = 0;
    for (int i = 0; i < N; i++) scaled[i] = (moe_real)(g[i] * factor), rounded += (double)scaled[i] != g[i] * factor;
    moe_adamw_params hp = {.lr = 3e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .step = 5};
    moe_adamw_update_cpu(p[0], scaled, m[0], v[0], N, &hp); /* the two passes */
    memcpy(scaled, g, sizeof g);
    hp.clip_factor = factor;
    moe_adamw_update_cpu(p[1], g, m[1], v[1], N, &hp); /* fused */
    CHECK(sizeof(moe_real) == sizeof(double) || rounded > N / 2, /* float: the products round (double: exact) */
          "only %d of %d scaled gradients rounded: the case proves little", rounded, N);
    CHECK(!memcmp(p[0], p[1], sizeof p[0]) && !memcmp(m[0], m[1], sizeof m[0]) && !memcmp(v[0], v[1], sizeof v[0]),
          "adamw with clip_factor differs from scaling the gradient first");
    CHECK(!memcmp(g, scaled, sizeof g), "adamw with clip_factor changed the gradient");
    hp.clip_factor = 1.0; /* and 1 (no clipping) is the gradient as it is */
    moe_adamw_update_cpu(p[1], g, m[1], v[1], N, &hp);
    hp.clip_factor = 0.0;
    moe_adamw_update_cpu(p[0], g, m[0], v[0], N, &hp);
    CHECK(!memcmp(p[0], p[1], sizeof p[0]), "adamw with clip_factor 1 differs from 0 (none)");
    printf("adamw: clip factor folded in, the bits of scale-then-update (%d of %d products rounded)\n", rounded, N);
}

int main(void) {
    test_rmsnorm();
    test_rope();
    test_attention_hand();
    test_attention(4, 21);
    test_attention(2, 22);
    test_attention(1, 23);
    test_cross_entropy();
    test_embedding();
    test_adamw();
    test_adamw_clip();
    return test_finish("test_model_kernels");
}
