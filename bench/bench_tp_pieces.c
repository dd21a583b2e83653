/* bench_tp_pieces.c — what the fixed pieces of tensor parallelism's sums cost on one rank (tp 1; issue 28, part 3):
 * the row-parallel forward y = x W^T and the column-parallel input gradient dx = dy W of tp/piece_sum.h at S = 1, 2,
 * 4, ..., --max-pieces pieces of K, against the dense table's plain product (moe/dense_ops.h's linear, what the model
 * runs today), on the CPU; and the vocabulary-parallel cross-entropy (tp/vocab_cross_entropy.h) against the
 * whole-vocabulary kernel. Each time is the median of --iters runs after --warmup; the ratio to the plain product is
 * what choosing S costs where tp = 1 (the pieces' GEMMs are K / S deep, their partial products are added in the tree,
 * and the pieces' columns are copied out when S > 1).
 *
 * Default shapes: moe-train's CPU benchmark model (d 512, d_ff 1024, 16 sequences of 128 tokens: T 2048), the row
 * products of o_proj (K = d) and a dense FFN's down_proj (K = d_ff), the column product of q_proj's input gradient
 * (K = d) and gate_proj's (K = d_ff), and a vocabulary of 32000 for the loss. Last line "json: {...}".
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
#include "tp/piece_sum.h"
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

typedef enum { PLAIN_ROW, PLAIN_COLUMN, PIECES_ROW, PIECES_COLUMN } kind;

typedef struct {
    moe_runtime *rt;
    const moe_dense_ops *ops;
    moe_dense_state *dense;
    const options *o;
} bench;

/* median ms of one product: y[T, n] from a[T, K] and W ([n, K] row, [K, n] column) */
static double time_product(bench *b, kind k, int S, int K, int n, const moe_real *a, const moe_real *W,
                           moe_real *y) {
    moe_tp_piece_sum s;
    if (k >= PIECES_ROW) bench_check(moe_tp_piece_sum_init(&s, b->rt, b->dense, NULL, S), "piece sum");
    const int T = b->o->tokens, runs = b->o->warmup + b->o->iters;
    double *ms = malloc(sizeof *ms * runs);
    for (int i = 0; i < runs; i++) {
        const double t0 = bench_now_ms();
        switch (k) {
        case PLAIN_ROW: bench_check(b->ops->linear_forward(b->dense, a, W, T, K, n, y), "linear"); break;
        case PLAIN_COLUMN:
            bench_check(b->ops->linear_backward_input(b->dense, a, W, T, n, K, 0, y), "linear dx");
            break;
        case PIECES_ROW: bench_check(moe_tp_row_parallel_forward(&s, a, W, T, K, n, y), "row"); break;
        case PIECES_COLUMN: bench_check(moe_tp_column_parallel_backward_input(&s, a, W, T, n, K, 0, y), "column"); break;
        }
        ms[i] = bench_now_ms() - t0;
    }
    const double median = bench_median(ms + b->o->warmup, b->o->iters);
    free(ms);
    if (k >= PIECES_ROW) moe_tp_piece_sum_free(&s);
    return median;
}

/* one product's row of the table: the plain time, then each S's ratio to it; JSON members into json */
static void product_row(bench *b, const char *name, int column, int K, int n, char *json, size_t json_cap) {
    const int T = b->o->tokens;
    moe_rng rng = moe_rng_seeded(28);
    moe_real *a = malloc(sizeof *a * T * K), *W = malloc(sizeof *W * K * n), *y = malloc(sizeof *y * T * (K > n ? K : n));
    if (!a || !W || !y) bench_fail("out of memory");
    moe_rng_fill_uniform(&rng, a, (size_t)T * K, 1);
    moe_rng_fill_uniform(&rng, W, (size_t)K * n, 0.05);
    if (b->o->precision) bench_check(b->ops->round_bf16(b->dense, W, (size_t)K * n, W), "bf16 copy");
    const double plain = time_product(b, column ? PLAIN_COLUMN : PLAIN_ROW, 1, K, n, a, W, y);
    printf("%-26s K %5d  plain %8.2f ms", name, K, plain);
    size_t used = strlen(json);
    used += snprintf(json + used, json_cap - used, "%s\"%s\":{\"K\":%d,\"plain_ms\":%.3f", used > 1 ? "," : "", name,
                     K, plain);
    for (int S = 1; S <= b->o->max_pieces; S *= 2) {
        const double ms = time_product(b, column ? PIECES_COLUMN : PIECES_ROW, S, K, n, a, W, y);
        printf("  S%-2d %5.2fx", S, ms / plain);
        used += snprintf(json + used, json_cap - used, ",\"S%d_ms\":%.3f", S, ms);
    }
    snprintf(json + used, json_cap - used, "}");
    printf("\n");
    free(a), free(W), free(y);
}

static double time_loss(const options *o, int S, const moe_real *logits, moe_real *work, const int *targets) {
    moe_tp_cross_entropy ce;
    if (S > 0) bench_check(moe_tp_cross_entropy_init(&ce, NULL, S), "cross-entropy");
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
    char json[4096] = "{";
    product_row(&b, "o_proj (row)", 0, o.d_model, o.d_model, json, sizeof json);
    product_row(&b, "down_proj (row)", 0, o.d_ff, o.d_model, json, sizeof json);
    product_row(&b, "q_proj dx (column)", 1, o.d_model, o.d_model, json, sizeof json);
    product_row(&b, "gate_proj dx (column)", 1, o.d_ff, o.d_model, json, sizeof json);
    /* the loss over the whole vocabulary: the kernel, then the pieces */
    const size_t n = (size_t)o.ce_tokens * o.vocab;
    moe_real *logits = malloc(sizeof *logits * n), *work = malloc(sizeof *work * n);
    int *targets = malloc(sizeof *targets * o.ce_tokens);
    if (!logits || !work || !targets) bench_fail("out of memory");
    moe_rng rng = moe_rng_seeded(29);
    moe_rng_fill_uniform(&rng, logits, n, 4);
    for (int t = 0; t < o.ce_tokens; t++) targets[t] = (int)(moe_rng_next(&rng) % o.vocab);
    const double whole = time_loss(&o, 0, logits, work, targets);
    printf("%-26s V %5d  whole %8.2f ms", "cross-entropy fwd+bwd", o.vocab, whole);
    size_t used = strlen(json);
    used += snprintf(json + used, sizeof json - used, ",\"cross_entropy\":{\"whole_ms\":%.3f", whole);
    for (int S = 1; S <= o.max_pieces; S *= 2) {
        const double ms = time_loss(&o, S, logits, work, targets);
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
