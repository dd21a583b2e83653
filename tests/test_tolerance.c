/* test_tolerance.c — the one tolerance table of the tests and the comparison that reads it (see test_tolerance.h).
 *
 * Units behind the sizes: the unit roundoff of fp32 is 2^-24 ~ 6e-8; a bf16 value has 8 significant bits, so
 * one rounding to bf16 moves a value by at most half an ulp, 2^-8 ~ 3.9e-3 of it at the bottom of a binade
 * and 2^-9 ~ 2e-3 at the top; one whole ulp is 2^-7 ~ 7.8e-3 at most. A rounding error spread uniformly over
 * half an ulp has a mean square of about (2^-8.5)^2 / 3 ~ 2.5e-6 of w^2: the NMSE of one bf16 rounding.
 * A sum of n terms taken in another order (cuBLAS against OpenBLAS, a block reduction against a loop) moves
 * by about sqrt(n) roundings of its terms.
 * The sizes are those the gpu tests used before they shared this table; the comments say why each is of
 * its order. Not here: tests/test_torch_reference.c (the CPU layer against PyTorch) bounds each element by
 * a fraction of max|ref| and has no NMSE, a form this table does not have; it keeps its own constants. */
#include "tests/test_tolerance.h"

#include <math.h>
#include <stdarg.h>
#include <string.h>

#include "tests/test_util.h"

/* op, dtype, max_nmse, atol, atol_rms, rtol */
static const test_tolerance kTolerance[] = {
    /* ---- router ops, fp32 on both sides (tests/test_gpu_router.cu) ----
     * cuBLAS's and OpenBLAS's GEMMs, or a warp reduction against a loop: sums of up to ~1000 terms in
     * another order differ by ~sqrt(1000) * 6e-8 ~ 2e-6 of their scale; rtol 1e-4 leaves ~50x, atol covers
     * the elements that cancel to near 0, nmse 1e-10 is (1e-5)^2: an rms relative error of 1e-5. */
    {"router logits", "f32", 1e-10, 1e-5, 0, 1e-4},
    {"router logits backward", "f32", 1e-10, 1e-5, 0, 1e-4},
    /* scores and gates lie in [0, 1] (+ a bias of 0.1): a tenth of the logits' absolute bound */
    {"router scores", "f32", 1e-10, 1e-6, 0, 1e-4},
    {"router gates", "f32", 1e-10, 1e-6, 0, 1e-4},
    /* gradients: as the logits (O(1) values, sums over E <= 1000 or k terms) */
    {"router scores backward", "f32", 1e-10, 1e-5, 0, 1e-4},
    {"router gates backward", "f32", 1e-10, 1e-5, 0, 1e-4},
    {"router load balance backward", "f32", 1e-10, 1e-5, 0, 1e-4},
    {"router z-loss backward", "f32", 1e-10, 1e-5, 0, 1e-4},
    /* the losses: double scalars summed over T * E terms in another order; relative 1e-6, no NMSE */
    {"router load balance loss", "f32", INFINITY, 0, 0, 1e-6},
    {"router z loss", "f32", INFINITY, 0, 0, 1e-6},

    /* ---- the SwiGLU experts, bf16 path against fp32 on the same bf16 inputs (tests/test_gpu_experts.cu) ----
     * one bf16 rounding of an fp32 value: <= 2^-8 relative; rtol 8e-3 ~ 2^-7 also allows the neighbouring
     * bf16 value (the GPU's expf may put the fp32 value on the other side of a rounding boundary); nmse 1e-5
     * is 4x that of one rounding. atol_rms 1e-30: in effect a purely relative bound. */
    {"swiglu act", "bf16", 1e-5, 0, 1e-30, 8e-3},
    {"swiglu dh13", "bf16", 1e-5, 0, 1e-30, 8e-3},
    /* H13 = X W13: one rounding of an fp32 GEMM; 1e-3 rms covers elements that cancel to near 0, where the
     * two fp32 sum orders differ by more than 8e-3 of the element */
    {"expert_ffn h13", "bf16", 1e-5, 0, 1e-3, 8e-3},
    /* chains of bf16 roundings (H13 -> act -> Y; dA -> dH13 -> dX): 2 to 4 roundings, each <= 2^-8, give
     * 2e-2 relative (~5 half-ulps) and nmse 1e-4; y and dxp are dots over f or 2f terms that cancel, so
     * their absolute part is 5e-2 of their rms (act, an elementwise product, 2e-2) */
    {"expert_ffn act", "bf16", 1e-4, 0, 2e-2, 2e-2},
    {"expert_ffn y", "bf16", 1e-4, 0, 5e-2, 2e-2},
    {"expert_ffn dxp", "bf16", 1e-4, 0, 5e-2, 2e-2},
    /* fp32 weight-gradient increments from bf16 operands (dH13 rounded on the GPU, fp32 on the CPU): one
     * rounding per term, averaged over the rows of a sum, so nmse 1e-5 with 2e-2 rms / 2e-2 relative */
    {"expert_ffn dW1", "bf16", 1e-5, 0, 2e-2, 2e-2},
    {"expert_ffn dW3", "bf16", 1e-5, 0, 2e-2, 2e-2},
    {"expert_ffn dW2", "bf16", 1e-5, 0, 2e-2, 2e-2},
    /* grouped against per-expert GEMMs: the same math, possibly other cuBLAS kernels; a value whose fp32 sums
     * straddle a rounding boundary lands one ulp (<= 2^-7 ~ 7.8e-3) away: 1e-2; rare, so nmse 1e-6 */
    {"expert_ffn modes", "bf16", 1e-6, 0, 1e-2, 1e-2},

    /* ---- the layer on the GPU against the CPU layer on bf16-rounded inputs and weights (tests/test_gpu_layer.c)
     * out and dx are O(1): the bf16 chain H13 -> act -> y -> dy (4 roundings ~ 4 * 2^-8 ~ 1.6e-2) gives 5e-2
     * relative, 2e-2 absolute (2% of the scale) for elements that cancel, nmse 1e-4 as the expert chains */
    {"layer out", "bf16", 1e-4, 2e-2, 0, 5e-2},
    {"layer dx", "bf16", 1e-4, 2e-2, 0, 5e-2},
    /* the router's gradient comes through dgate = dout . y (bf16 y) and the softmax backward, which subtracts
     * a weighted mean: it cancels most, so nmse 1e-3. An element is a sum over every token of x dlogit, so its
     * error is a random walk over all the tokens' dgate errors, sized by the gradient's rms rather than by the
     * element: 5% of rms (on an H100, 2026-11-26, a fixed 5e-2 failed 3 of 2048 elements of the dropless case at
     * T 1024: worst |diff| 0.074 among values up to 8.5, nmse 1.6e-5, so errors ~0.4% of rms, 4 sigma ~1.6%) */
    {"layer drouter_w", "bf16", 1e-3, 0, 5e-2, 5e-2},
    {"layer dexperts", "bf16", 1e-4, 5e-2, 0, 5e-2},
    /* the losses: the router is fp32 on both sides, on the same routes; sums in another order: relative 1e-5,
     * and 1e-7 absolute for a loss near 0 */
    {"layer aux loss", "f32", INFINITY, 1e-7, 0, 1e-5},
    {"layer z loss", "f32", INFINITY, 1e-7, 0, 1e-5},

    /* ---- the dense table's ops, fp32 on both sides (tests/test_gpu_dense_ops_a.cu) ----
     * The GPU does the CPU's operations in its order, each rounded once: bitwise, unless the CPU build contracts
     * a * b + c into an FMA (gcc does where the target has FMA: aarch64, or x86-64 with -march=native). Then:
     * AdamW's m, v and param move by an ulp or two (~1.2e-7 each) of an intermediate: rtol 1e-6 (~8 ulps),
     * 1e-6 of the rms for an m that cancels to near 0, nmse 1e-12 (an rms relative error of 1e-6); */
    {"adamw", "f32", 1e-12, 0, 1e-6, 1e-6},
    /* the sigmoid row gate (Qwen2-MoE's shared expert): CUDA's expf against the CPU's moe__exp (each within 2 ulp)
     * moves the gate by a few ulps, which every output inherits; the dot product keeps the CPU's order in double:
     * rtol 1e-6 (~8 ulps), 1e-6 of the rms for a dg that cancels to near 0 */
    {"gate_rows", "f32", 1e-12, 0, 1e-6, 1e-6},

    /* ---- the GPU layer across ranks against one GPU rank (tests/test_gpu_ep_layer.c) ----
     * the same kernels on other row counts per GEMM, where cuBLAS may choose another kernel: a bf16 output
     * lands at most one ulp (<= 7.8e-3) away, rarely: 1e-2, nmse 1e-6 */
    {"ep_layer out", "bf16", 1e-6, 1e-2, 0, 1e-2},
    {"ep_layer dx", "bf16", 1e-6, 1e-2, 0, 1e-2},
    /* fp32 gradients summed in another order (per rank, then across ranks): ~1e-6 of their scale; 1e-4 */
    {"ep_layer drouter_w", "bf16", 1e-8, 1e-4, 0, 1e-4},
    {"ep_layer dexperts", "bf16", 1e-8, 1e-4, 0, 1e-4},

    /* ---- combine on bf16 rows (tests/test_gpu_permute.cu) ----
     * sum_j gate_j y_j in fp32 in the same j order as the CPU: equal unless a compiler contracts to FMA, one
     * fp32 rounding (6e-8) per term: 1e-6 */
    {"combine", "bf16", 1e-12, 1e-6, 0, 1e-6},
    /* dgate = dout . y: a block reduction of d <= 4096 terms against the CPU's loop, ~sqrt(d) * 6e-8 ~ 4e-6
     * relative: 1e-4 */
    {"combine backward dgate", "bf16", 1e-10, 1e-4, 0, 1e-4},
    /* ---- dense-model kernels, fp32 on both sides (tests/test_gpu_dense_ops_b.cu) ----
     * rmsnorm: row sums in double on both sides, the element products the same float operations (no FMA):
     * y and rstd differ only where the double sums, taken in another order, round rstd to another float
     * (1 ulp, 6e-8 relative): 1e-5 relative, 1e-6 absolute */
    {"rmsnorm", "f32", 1e-12, 1e-6, 0, 1e-5},
    /* dx: a double dot, then float terms; dw: the CPU adds T float terms in float, the GPU in double: the
     * CPU's own error, up to ~T * 6e-8 of a term; terms cancel, so the bound is 1e-5 of rms(want) + 1e-5 |w| */
    {"rmsnorm backward", "f32", 1e-10, 0, 1e-5, 1e-5},
    /* the same float rotation with cos/sin from CUDA's double pow/cos/sin (<= 2 ulp in double) against
     * glibc's: a float rounds differently only rarely, by 1 ulp (6e-8); O(1) values: 1e-6 */
    {"rope", "f32", 1e-12, 1e-6, 0, 1e-6},
    /* a double sum of token losses (~log V each) from CUDA's expf (<= 2 ulp) against glibc's, in another
     * order: ~1e-7 relative; 1e-6 relative, 1e-6 absolute for a loss near 0 */
    {"cross entropy loss", "f32", INFINITY, 1e-6, 0, 1e-6},
    /* scale (softmax - onehot): each element one expf (2 ulp) and two roundings: 1e-5 relative, 1e-5 of rms */
    {"cross entropy backward", "f32", 1e-10, 0, 1e-5, 1e-5},
    /* cuBLAS against OpenBLAS over hd or S <= 130 terms (~sqrt(130) * 6e-8 ~ 1e-6 of the scale), through
     * expf: as the router's GEMM rows, 1e-4 relative, with 1e-5 of rms(want) for elements that cancel */
    {"attention", "f32", 1e-10, 0, 1e-5, 1e-4},
    {"attention backward", "f32", 1e-10, 0, 1e-5, 1e-4},
    /* the fused kernels against the CPU's fused tiles: another order of additions (per key on the GPU, per tile in
     * the CPU's GEMMs) and expf against the CPU's exp, the same bounds as the materialized pair */
    {"attention fused", "f32", 1e-10, 0, 1e-5, 1e-4},
    {"attention fused backward", "f32", 1e-10, 0, 1e-5, 1e-4},
    /* dq and dk of a one-token sequence: zero in exact arithmetic (a softmax over one key has no gradient), so
     * both sides give rounding noise or 0 (dP - D, D = rowsum(dO o O), cancels exactly or to ~1e-8 of the O(1)
     * inputs): an absolute bound alone, no nmse against a reference that is all noise */
    {"attention fused backward, one key", "f32", INFINITY, 1e-6, 0, 0},
    /* under bf16 both sides round q, k, v, dout, P and dS (kernels/attention.h), but P is rounded relative to each
     * side's running row maximum, whose tiles differ (the CPU's 64 keys, the GPU's 64 or 128): every P element then
     * carries its own 2^-9 rounding on each side, ~3e-3 of rms(want) over a row's sums (tests/test_attention_fused.c
     * measures 1-3e-3 against the rounded inputs' attention). nmse 1e-4, elements 3e-2 (forward) and 5e-2
     * (backward, dS rounded too) of rms(want) plus as much of |want|; a one-key row's dq and dk stay noise (D takes
     * the rounded dout as dP does) */
    {"attention fused", "bf16", 1e-4, 0, 3e-2, 3e-2},
    {"attention fused backward", "bf16", 1e-4, 0, 5e-2, 5e-2},
    {"attention fused backward, one key", "bf16", INFINITY, 1e-6, 0, 0},
    /* ---- the dense table's linear layer and dense SwiGLU: the list of cuBLAS products run by cblas on the CPU
     * (tests/test_linear_gemms.c, "f32"), and the CUDA table against the CPU table (tests/test_gpu_dense_table.c)
     * under fp32 ("f32") and under bf16 precision ("bf16": both tables round the same inputs to bf16) ----
     * linear: sums of up to ~100 terms in another order, ~sqrt(100) * 6e-8 of the scale; bf16 inputs change
     * nothing here (their products are exact in fp32): as the router's GEMM rows, 1e-4 relative, 1e-5 of
     * rms(want) for elements that cancel */
    {"linear", "f32", 1e-10, 0, 1e-5, 1e-4},
    {"linear", "bf16", 1e-10, 0, 1e-5, 1e-4},
    /* the dense SwiGLU in fp32: three GEMMs in a chain through expf (CUDA's against core/real.h's, each <= 2 ulp):
     * as linear, with the chain's few roundings more */
    {"dense swiglu", "f32", 1e-10, 0, 2e-5, 1e-4},
    {"dense swiglu backward", "f32", 1e-10, 0, 2e-5, 1e-4},
    /* under bf16 an intermediate (act; dH1, dH3) that the two sides compute ~1e-6 apart is rounded to bf16 before
     * the next GEMM, and lands on the other bf16 neighbour when it sits at a rounding boundary (~1e-6 / 2^-8, a few
     * in 1e4 elements): one term of a sum moves by up to 2^-7 of itself, ~2^-7 / sqrt(d_ff) ~ 1e-3 of the sum's
     * rms; 5e-3 of rms(want), and nmse 1e-7 (an rms relative error ~3e-4: the flips are rare) */
    {"dense swiglu", "bf16", 1e-7, 0, 5e-3, 1e-4},
    {"dense swiglu backward", "bf16", 1e-7, 0, 5e-3, 1e-4},
    /* ---- the CPU's bf16 precision against its fp32 (tests/test_precision.c; dtype "cpu-bf16") ----
     * a GEMM of rounded inputs against the same products in double: only the order of the fp32 sums differs,
     * ~sqrt(k) * 6e-8 of the scale: 1e-5 of rms(want) */
    {"gemm rows exact", "cpu-bf16", 1e-10, 0, 1e-5, 1e-5},
    /* against fp32 inputs: each input keeps 8 bits (relative 2^-9 ~ 2e-3 each, two per product), sums of k
     * random-signed products: nmse ~ 2 * (2^-9)^2 * a few ~ 1e-5; elements 2% of rms(want) */
    {"gemm rows", "cpu-bf16", 1e-4, 0, 2e-2, 2e-2},
    /* the layer (experts in bf16, router fp32: the same routes): out and dx go through three bf16 GEMMs and
     * SwiGLU, the expert gradients through two: like the GPU rows above */
    {"layer out", "cpu-bf16", 1e-4, 0, 3e-2, 5e-2},
    {"layer dx", "cpu-bf16", 1e-4, 0, 3e-2, 5e-2},
    {"layer dexperts", "cpu-bf16", 1e-4, 0, 5e-2, 5e-2},
    /* the router's weight gradient: fp32 products, but of a dgate made from bf16 expert outputs; cancels */
    {"layer drouter_w", "cpu-bf16", 1e-3, 0, 5e-2, 5e-2},
    /* the model's loss (a mean of token cross-entropies, O(1)): bf16 dense and expert GEMMs over a few layers */
    {"model loss", "cpu-bf16", INFINITY, 0, 0, 2e-3},
};

const test_tolerance *test_tolerance_table(size_t *count) {
    *count = sizeof kTolerance / sizeof kTolerance[0];
    return kTolerance;
}

static const test_tolerance *find(const char *op, const char *dtype) {
    for (size_t i = 0; i < sizeof kTolerance / sizeof kTolerance[0]; i++)
        if (!strcmp(kTolerance[i].op, op) && !strcmp(kTolerance[i].dtype, dtype)) return &kTolerance[i];
    return NULL;
}

/* float or double values (exactly one pointer set) */
typedef struct {
    const float *f;
    const double *d;
} values;

static double at(values v, size_t i) { return v.f ? v.f[i] : v.d[i]; }

static int compare(const char *op, const char *dtype, values got, values want, size_t count, const char *label) {
    const test_tolerance *t = find(op, dtype);
    if (!t) {
        CHECK(t != NULL, "%s: no tolerance row for op \"%s\" dtype \"%s\" (tests/test_tolerance.c)", label, op, dtype);
        return 0;
    }
    double rms = 0;
    if (t->atol_rms != 0) {
        double sum2 = 0;
        for (size_t i = 0; i < count; i++) sum2 += at(want, i) * at(want, i);
        rms = count ? sqrt(sum2 / count) : 0;
    }
    /* atol + atol_rms * rms with the unused term left out, so that neither form picks up a rounding */
    const double abs_bound = t->atol_rms != 0 ? t->atol + t->atol_rms * rms : t->atol;
    double err2 = 0, ref2 = 0, worst = 0;
    size_t worst_i = 0, bad = 0;
    for (size_t i = 0; i < count; i++) {
        double g = at(got, i), w = at(want, i), e = fabs(g - w);
        if (isnan(g) || isnan(w)) e = INFINITY;
        err2 += e * e, ref2 += w * w;
        if (!(e <= abs_bound + t->rtol * fabs(w))) bad++;
        if (!(e <= worst)) worst = e, worst_i = i;
    }
    double nmse = ref2 > 0 ? err2 / ref2 : err2;
    int ok = bad == 0 && nmse <= t->max_nmse;
    printf("%-28s %-4s %-44s n=%-8zu nmse %.2e (max %.0e)  worst |diff| %.3g at %zu (got %.9g want %.9g)  "
           "%zu outside %.3g+%.0e|w|\n",
           op, dtype, label, count, nmse, t->max_nmse, worst, worst_i, count ? at(got, worst_i) : 0.0,
           count ? at(want, worst_i) : 0.0, bad, abs_bound, t->rtol);
    CHECK(ok, "%s %s %s: outside tolerance", op, dtype, label);
    return ok;
}

int test_tolerance_check(const char *op, const char *dtype, const float *got, const float *want, size_t count,
                         const char *label_format, ...) {
    char label[256];
    va_list ap;
    va_start(ap, label_format);
    vsnprintf(label, sizeof label, label_format, ap);
    va_end(ap);
    return compare(op, dtype, (values){got, NULL}, (values){want, NULL}, count, label);
}

int test_tolerance_check_scalar(const char *op, const char *dtype, double got, double want, const char *label_format,
                                ...) {
    char label[256];
    va_list ap;
    va_start(ap, label_format);
    vsnprintf(label, sizeof label, label_format, ap);
    va_end(ap);
    return compare(op, dtype, (values){NULL, &got}, (values){NULL, &want}, 1, label);
}
