/* bench_tp_pieces.c — what the fixed pieces of tensor parallelism cost on one rank (tp 1; issue 28, part 3): the six
 * products of tp/linear.h at S = 1, 2, 4, ..., --max-pieces pieces of the split dimension, against the dense table's
 * plain product (moe/dense_ops.h's linear, what the model runs today), on the CPU; and the vocabulary-parallel
 * cross-entropy (tp/vocab_cross_entropy.h) against the whole-vocabulary kernel. Each time is the median of --iters
 * runs after --warmup; the ratio to the plain product is what choosing S costs where tp = 1 (each piece is its own
 * GEMM, 1/S of the split dimension; the two sums add the pieces' products in the tree; a piece's columns are copied
 * between the operands and scratch when S > 1).
 *
 * Default shapes: moe-train's CPU benchmark model (d 512, d_ff 1024, 16 sequences of 128 tokens: T 2048): a column-
 * and a row-parallel linear splitting d (q_proj, o_proj: D = M = d) and splitting d_ff (gate_proj, down_proj: D = d_ff,
 * M = d), and a vocabulary of 32000 for the loss. Last line "json: {...}".
 *
 *   build/bench/bench_tp_pieces [--tokens 2048 --d-model 512 --d-ff 1024 --vocab 32000 --max-pieces 32
 *       --precision bf16 --threads 1 --warmup 2 --iters 9]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_util.h"
#include "core/rng.h"
#include "core/threads.h"
#include "kernels/cross_entropy.h"
#include "moe/dense_ops.h"
#include "tp/linear.h"
#include "tp/vocab_cross_entropy.h"

typedef struct {
    int tokens, d_model, d_ff, vocab, ce_tokens, max_pieces, precision, threads, warmup, iters;
} options;

static const char *const kPrecisions[] = {"fp32", "bf16", NULL};
static const bench_flag kFlags[] = {
    BENCH_INT("--tokens", options, tokens, 1, 1 << 20, "rows of the products (T)"),
    BENCH_INT("--d-model", options, d_model, 2, 65536, "model width: K of o_proj and q_proj, and the products' width"),
    BENCH_INT("--d-ff", options, d_ff, 2, 262144, "FFN width: K of down_proj and gate_proj"),
    BENCH_INT("--vocab", options, vocab, 2, 1 << 22, "vocabulary of the loss"),
    BENCH_INT("--ce-tokens", options, ce_tokens, 1, 1 << 20, "tokens of the loss"),
    BENCH_INT("--max-pieces", options, max_pieces, 1, 1024, "the largest S timed (1, 2, 4, ... up to it)"),
    BENCH_CHOICE("--precision", options, precision, kPrecisions, "GEMM inputs (core/precision.h)"),
    BENCH_INT("--threads", options, threads, 0, 4096, "CPU threads; 0: the CPUs this process may use"),
    BENCH_INT("--warmup", options, warmup, 0, 1000, "untimed runs first"),
    BENCH_INT("--iters", options, iters, 1, 1000, "timed runs (median)"),
};

static void check_options(const void *p) {
    const options *o = p;
    if (o->max_pieces & (o->max_pieces - 1)) bench_usage_errorf("--max-pieces %d is not a power of two", o->max_pieces);
    if (o->d_model % o->max_pieces || o->d_ff % o->max_pieces || o->vocab % o->max_pieces)
        bench_usage_errorf("--max-pieces %d must divide --d-model, --d-ff and --vocab", o->max_pieces);
}

static const bench_cli kCli = {
    .name = "bench_tp_pieces",
    .synopsis = "bench_tp_pieces [flags]",
    .about = "the cost of tensor parallelism's fixed pieces at tp 1: products and the loss at S = 1 .. --max-pieces\n"
             "against the plain product and the whole-vocabulary loss",
    .flags = kFlags,
    .num_flags = sizeof kFlags / sizeof kFlags[0],
    .check = check_options,
};

/* The six products of tp/linear.h, with the split dimension D and the other M: sizes of a (activation), b and out */
typedef enum { COL_FORWARD, COL_BACKWARD_INPUT, COL_BACKWARD_WEIGHT, ROW_FORWARD, ROW_BACKWARD_INPUT,
               ROW_BACKWARD_WEIGHT, NUM_PRODUCTS } product;
static const char *const kProductNames[NUM_PRODUCTS] = {"column forward", "column backward input",
                                                        "column backward weight", "row forward", "row backward input",
                                                        "row backward weight"};

typedef struct {
    moe_runtime *rt;
    const moe_dense_ops *ops;
    moe_dense_state *dense;
    const options *o;
} bench;

/* one run of product p (S 0: the dense table's plain product) over T tokens, split dimension D, other M */
static void run_once(bench *b, moe_tp_linear *l, int S, product p, int D, int M, const moe_real *a, const moe_real *w,
                     moe_real *out) {
    const int T = b->o->tokens;
    moe_dense_state *d = b->dense;
    const moe_dense_ops *ops = b->ops;
    moe_status st = MOE_OK;
    switch (p) {
    case COL_FORWARD: st = S ? moe_tp_column_forward(l, a, w, T, M, D, out) : ops->linear_forward(d, a, w, T, M, D, out);
        break;
    case COL_BACKWARD_INPUT:
        st = S ? moe_tp_column_backward_input(l, a, w, T, M, D, 0, out)
               : ops->linear_backward_input(d, a, w, T, M, D, 0, out);
        break;
    case COL_BACKWARD_WEIGHT:
        st = S ? moe_tp_column_backward_weight(l, a, w, T, M, D, out)
               : ops->linear_backward_weight(d, a, w, T, M, D, out);
        break;
    case ROW_FORWARD: st = S ? moe_tp_row_forward(l, a, w, T, D, M, out) : ops->linear_forward(d, a, w, T, D, M, out);
        break;
    case ROW_BACKWARD_INPUT:
        st = S ? moe_tp_row_backward_input(l, a, w, T, D, M, 0, out)
               : ops->linear_backward_input(d, a, w, T, D, M, 0, out);
        break;
    case ROW_BACKWARD_WEIGHT:
        st = S ? moe_tp_row_backward_weight(l, a, w, T, D, M, out) : ops->linear_backward_weight(d, a, w, T, D, M, out);
        break;
    default: break;
    }
    bench_check(st, kProductNames[p]);
}

/* median ms of product p at S pieces (0: plain) */
static double time_product(bench *b, int S, product p, int D, int M, const moe_real *a, const moe_real *w,
                           moe_real *out) {
    moe_tp_linear l;
    if (S) bench_check(moe_tp_linear_init(&l, b->rt, b->dense, NULL, S), "tp linear");
    const int runs = b->o->warmup + b->o->iters;
    double *ms = malloc(sizeof *ms * runs);
    for (int i = 0; i < runs; i++) {
        const double t0 = bench_now_ms();
        run_once(b, &l, S, p, D, M, a, w, out);
        ms[i] = bench_now_ms() - t0;
    }
    const double median = bench_median(ms + b->o->warmup, b->o->iters);
    free(ms);
    if (S) moe_tp_linear_free(&l);
    return median;
}

/* one row of the table: the plain time, then each S's ratio to it; JSON members appended to json */
static void product_row(bench *b, const char *layer, product p, int D, int M, char *json, size_t json_cap) {
    /* every operand and result fits [T or D, max(D, M)]: a weight [D, M], or activations [T, D or M] (the weight
     * gradients' second operand) */
    const int T = b->o->tokens, big = D > M ? D : M;
    const size_t n = (size_t)(T > D ? T : D) * big;
    moe_rng rng = moe_rng_seeded(28);
    moe_real *a = malloc(sizeof *a * n), *w = malloc(sizeof *w * n), *out = malloc(sizeof *out * n);
    if (!a || !w || !out) bench_fail("out of memory");
    moe_rng_fill_uniform(&rng, a, n, 1);
    moe_rng_fill_uniform(&rng, w, n, 0.05);
    if (b->o->precision) bench_check(b->ops->round_bf16(b->dense, w, n, w), "bf16 copy");
    const double plain = time_product(b, 0, p, D, M, a, w, out);
    char name[80];
    snprintf(name, sizeof name, "%s %s", layer, kProductNames[p]);
    printf("%-34s D %5d  plain %7.2f ms", name, D, plain);
    size_t used = strlen(json);
    used += snprintf(json + used, json_cap - used, "%s\"%s\":{\"D\":%d,\"plain_ms\":%.3f", used > 1 ? "," : "", name,
                     D, plain);
    for (int S = 1; S <= b->o->max_pieces; S *= 2) {
        const double ms = time_product(b, S, p, D, M, a, w, out);
        printf("  S%-2d %5.2fx", S, ms / plain);
        used += snprintf(json + used, json_cap - used, ",\"S%d_ms\":%.3f", S, ms);
    }
    snprintf(json + used, json_cap - used, "}");
    printf("\n");
    free(a), free(w), free(out);
}

static double time_loss(const bench *b, int S, const moe_real *logits, moe_real *work, const int *targets) {
    const options *o = b->o;
    moe_tp_cross_entropy ce;
    if (S > 0) bench_check(moe_tp_cross_entropy_init(&ce, b->rt, b->dense, NULL, S), "cross-entropy");
    const int T = o->ce_tokens, V = o->vocab, runs = o->warmup + o->iters;
    double *ms = malloc(sizeof *ms * runs), loss;
    for (int i = 0; i < runs; i++) {
        memcpy(work, logits, sizeof *work * T * V);
        const double t0 = bench_now_ms();
        if (S == 0) {
            loss = moe_cross_entropy_forward_cpu(work, targets, T, V);
            moe_cross_entropy_backward_cpu(work, targets, T, V, 1.0f / T);
        } else {
            bench_check(moe_tp_cross_entropy_forward(&ce, work, targets, T, V, &loss), "forward");
            bench_check(moe_tp_cross_entropy_backward(&ce, work, targets, T, V, 1.0f / T), "backward");
        }
        ms[i] = bench_now_ms() - t0;
    }
    (void)loss;
    const double median = bench_median(ms + o->warmup, o->iters);
    free(ms);
    if (S > 0) moe_tp_cross_entropy_free(&ce);
    return median;
}

int main(int argc, char **argv) {
    options o = {.tokens = 2048, .d_model = 512, .d_ff = 1024, .vocab = 32000, .ce_tokens = 2048, .max_pieces = 32,
                 .precision = 1, .threads = 1, .warmup = 2, .iters = 9};
    bench_parse_flags(&kCli, argc, argv, &o);
    moe_threads_set(o.threads ? o.threads : moe_threads_default());
    bench b = {.o = &o};
    bench_check(moe_runtime_create_cpu(&b.rt), "runtime");
    b.ops = moe_runtime_dense_ops(b.rt);
    const int width = o.d_ff > o.d_model ? o.d_ff : o.d_model;
    bench_check(b.ops->create(b.rt, 1, o.precision ? MOE_PRECISION_BF16 : MOE_PRECISION_FP32, width, &b.dense),
                "dense state");
    printf("tp 1, T %d, %s GEMM inputs, %d thread(s); times are medians of %d; S columns: time / plain\n", o.tokens,
           kPrecisions[o.precision], moe_threads_get(), o.iters);
    char json[8192] = "{";
    /* the attention's projections split d (q_proj column-parallel, o_proj row-parallel), the FFN's split d_ff */
    for (product p = 0; p < NUM_PRODUCTS; p++)
        product_row(&b, p < ROW_FORWARD ? "q_proj" : "o_proj", p, o.d_model, o.d_model, json, sizeof json);
    for (product p = 0; p < NUM_PRODUCTS; p++)
        product_row(&b, p < ROW_FORWARD ? "gate_proj" : "down_proj", p, o.d_ff, o.d_model, json, sizeof json);
    /* the loss over the whole vocabulary: the kernel, then the pieces */
    const size_t n = (size_t)o.ce_tokens * o.vocab;
    moe_real *logits = malloc(sizeof *logits * n), *work = malloc(sizeof *work * n);
    int *targets = malloc(sizeof *targets * o.ce_tokens);
    if (!logits || !work || !targets) bench_fail("out of memory");
    moe_rng rng = moe_rng_seeded(29);
    moe_rng_fill_uniform(&rng, logits, n, 4);
    for (int t = 0; t < o.ce_tokens; t++) targets[t] = (int)(moe_rng_next(&rng) % o.vocab);
    const double whole = time_loss(&b, 0, logits, work, targets);
    printf("%-34s V %5d  whole %7.2f ms", "cross-entropy fwd+bwd", o.vocab, whole);
    size_t used = strlen(json);
    used += snprintf(json + used, sizeof json - used, ",\"cross_entropy\":{\"whole_ms\":%.3f", whole);
    for (int S = 1; S <= o.max_pieces; S *= 2) {
        const double ms = time_loss(&b, S, logits, work, targets);
        printf("  S%-2d %5.2fx", S, ms / whole);
        used += snprintf(json + used, sizeof json - used, ",\"S%d_ms\":%.3f", S, ms);
    }
    printf("\n");
    printf("json: {\"flags\":{");
    bench_json_flags(&o);
    printf("},\"results\":%s}}\n", json);
    free(logits), free(work), free(targets);
    b.ops->destroy(b.dense);
    moe_runtime_destroy(b.rt);
    return 0;
}
