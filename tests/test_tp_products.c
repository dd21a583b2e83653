/* test_tp_products.c — the six products of tp/linear.h checked at every tensor-parallel size (test_tp_products.h). */
#include "tests/test_tp_products.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/gemm_rows.h"
#include "moe/dense_ops.h"
#include "tests/test_mpi.h"
#include "tp/linear.h"
#include "tp/vocab_cross_entropy.h"

enum { T = 37, D = 64, M = 24, SEED = 28, CE_T = 29, CE_V = 1024 };

moe_real *test_tp_operand(uint64_t seed, size_t count, double scale, int mixed) {
    moe_rng rng = moe_rng_seeded(seed);
    moe_real *a = test_alloc_uniform(&rng, count, scale);
    for (size_t i = 0; mixed && i < count; i += 7) a[i] *= 100;
    return a;
}

moe_real *test_tp_column_block(const moe_real *m, int rows, int cols, int part, int parts) {
    const int w = cols / parts;
    moe_real *b = malloc((size_t)rows * w * sizeof *b);
    if (!b) abort();
    for (int r = 0; r < rows; r++) memcpy(b + (size_t)r * w, m + (size_t)r * cols + (size_t)part * w, w * sizeof *b);
    return b;
}

size_t test_tp_count_diff(const moe_real *a, const moe_real *b, size_t n) {
    size_t d = 0;
    for (size_t i = 0; i < n; i++) d += memcmp(&a[i], &b[i], sizeof *a) != 0;
    return d;
}

double test_tp_max_rel_err(const moe_real *a, const moe_real *b, size_t n) {
    double scale = 0, err = 0;
    for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs((double)b[i]));
    for (size_t i = 0; i < n; i++) err = fmax(err, fabs((double)a[i] - (double)b[i]));
    return err / (scale > 0 ? scale : 1);
}

/* Each operand and the result: whole on every rank, or split: COLS, a [rows, D]'s block of columns; ROWS, a
 * [D, cols]'s block of rows. acc: what the result starts from (NONE: overwritten; BETA: beta 0 and 1 both run;
 * ALWAYS: += ). */
typedef enum { WHOLE, COLS, ROWS } split;
typedef enum { NONE, BETA, ALWAYS } accumulation;
typedef enum { COL_FORWARD, COL_BACKWARD_INPUT, COL_BACKWARD_WEIGHT, ROW_FORWARD, ROW_BACKWARD_INPUT,
               ROW_BACKWARD_WEIGHT, NUM_PRODUCTS } product;
typedef struct {
    int rows, cols;
    split how;
} shape;
static const struct {
    const char *name;
    shape a, b, out;
    accumulation acc;
    int is_sum;        /* the pieces are added (over the group), not concatenated */
    int b_is_weight;   /* b is a weight: its bf16 copy is made first under bf16 */
} kProducts[NUM_PRODUCTS] = {
    [COL_FORWARD] = {"column forward", {T, M, WHOLE}, {D, M, ROWS}, {T, D, COLS}, NONE, 0, 1},
    [COL_BACKWARD_INPUT] = {"column backward input", {T, D, COLS}, {D, M, ROWS}, {T, M, WHOLE}, BETA, 1, 1},
    [COL_BACKWARD_WEIGHT] = {"column backward weight", {T, D, COLS}, {T, M, WHOLE}, {D, M, ROWS}, ALWAYS, 0, 0},
    [ROW_FORWARD] = {"row forward", {T, D, COLS}, {M, D, COLS}, {T, M, WHOLE}, NONE, 1, 1},
    [ROW_BACKWARD_INPUT] = {"row backward input", {T, M, WHOLE}, {M, D, COLS}, {T, D, COLS}, BETA, 0, 1},
    [ROW_BACKWARD_WEIGHT] = {"row backward weight", {T, M, WHOLE}, {T, D, COLS}, {M, D, COLS}, ALWAYS, 0, 0},
};

static size_t count_of(shape o) { return (size_t)o.rows * o.cols; }
static size_t part_count(shape o, int parts) { return count_of(o) / (o.how == WHOLE ? 1 : parts); }

/* this rank's part of a whole host operand, malloc'ed */
static moe_real *part_of(const moe_real *m, shape o, int part, int parts) {
    if (o.how == COLS) return test_tp_column_block(m, o.rows, o.cols, part, parts);
    const size_t n = part_count(o, parts);
    moe_real *p = malloc(sizeof *p * n);
    if (!p) abort();
    return memcpy(p, m + (o.how == ROWS ? (size_t)part * n : 0), sizeof *p * n); /* ROWS: a contiguous block */
}

/* tp/linear.h's call (runtime memory) */
static moe_status call(moe_tp_linear *l, product p, const moe_real *a, const moe_real *b, moe_real beta, moe_real *out) {
    switch (p) {
    case COL_FORWARD: return moe_tp_column_forward(l, a, b, T, M, D, out);
    case COL_BACKWARD_INPUT: return moe_tp_column_backward_input(l, a, b, T, M, D, beta, out);
    case COL_BACKWARD_WEIGHT: return moe_tp_column_backward_weight(l, a, b, T, M, D, out);
    case ROW_FORWARD: return moe_tp_row_forward(l, a, b, T, D, M, out);
    case ROW_BACKWARD_INPUT: return moe_tp_row_backward_input(l, a, b, T, D, M, beta, out);
    case ROW_BACKWARD_WEIGHT: return moe_tp_row_backward_weight(l, a, b, T, D, M, out);
    default: return MOE_ERR_INVALID_ARG;
    }
}

/* the dense table's plain product on the whole operands (runtime memory) */
static moe_status plain_call(const moe_dense_ops *ops, moe_dense_state *d, product p, const moe_real *a,
                             const moe_real *b, moe_real beta, moe_real *out) {
    switch (p) {
    case COL_FORWARD: return ops->linear_forward(d, a, b, T, M, D, out);
    case COL_BACKWARD_INPUT: return ops->linear_backward_input(d, a, b, T, M, D, beta, out);
    case COL_BACKWARD_WEIGHT: return ops->linear_backward_weight(d, a, b, T, M, D, out);
    case ROW_FORWARD: return ops->linear_forward(d, a, b, T, D, M, out);
    case ROW_BACKWARD_INPUT: return ops->linear_backward_input(d, a, b, T, D, M, beta, out);
    case ROW_BACKWARD_WEIGHT: return ops->linear_backward_weight(d, a, b, T, D, M, out);
    default: return MOE_ERR_INVALID_ARG;
    }
}

/* host bytes into a new runtime buffer */
static void *upload_bytes(moe_runtime *rt, const void *host, size_t nbytes) {
    void *dev;
    test_mpi_require(moe_runtime_alloc(rt, nbytes ? nbytes : 1, &dev), "runtime buffer");
    test_mpi_require(moe_runtime_upload(rt, dev, host, nbytes), "upload");
    return dev;
}

static moe_real *upload(moe_runtime *rt, const moe_real *host, size_t n) {
    return upload_bytes(rt, host, sizeof(moe_real) * n);
}

typedef struct {
    const test_tp_setup *s;
    moe_dense_state *dense;
    product p;
    const moe_real *a, *b, *out0; /* host, whole */
    moe_real beta;
} product_case;

/* The product at S pieces (S 0: the plain product) on the group (tp 1: none) into out (host: this rank's part of
 * the result, from out0's part) */
static void run(const product_case *c, int S, int on_group, moe_real *out) {
    moe_runtime *rt = c->s->rt;
    const int parts = on_group ? c->s->tp : 1, part = on_group ? c->s->rank : 0;
    moe_real *host[3] = {part_of(c->a, kProducts[c->p].a, part, parts), part_of(c->b, kProducts[c->p].b, part, parts),
                         part_of(c->out0, kProducts[c->p].out, part, parts)};
    const size_t n[3] = {part_count(kProducts[c->p].a, parts), part_count(kProducts[c->p].b, parts),
                         part_count(kProducts[c->p].out, parts)};
    moe_real *dev[3];
    for (int i = 0; i < 3; i++) dev[i] = upload(rt, host[i], n[i]);
    if (S == 0) {
        test_mpi_require(plain_call(moe_runtime_dense_ops(rt), c->dense, c->p, dev[0], dev[1], c->beta, dev[2]),
                         "plain product");
    } else {
        moe_tp_linear l;
        test_mpi_require(moe_tp_linear_init(&l, rt, c->dense, on_group ? c->s->group : NULL, S), "tp linear");
        test_mpi_require(call(&l, c->p, dev[0], dev[1], c->beta, dev[2]), kProducts[c->p].name);
        moe_tp_linear_free(&l);
    }
    test_mpi_require(moe_runtime_download(rt, out, dev[2], sizeof *out * n[2]), "download");
    for (int i = 0; i < 3; i++) moe_runtime_free(rt, dev[i]), free(host[i]);
}

static void check_case(const product_case *c, const char *what) {
    const test_tp_setup *s = c->s;
    const shape o = kProducts[c->p].out;
    const size_t n = count_of(o);
    moe_real *want = malloc(sizeof *want * n), *got = malloc(sizeof *got * n), *plain = malloc(sizeof *plain * n);
    run(c, 0, 0, plain);
    run(c, 1, 0, want);
    CHECK(test_tp_count_diff(want, plain, n) == 0, "%s: one piece is not the plain product bit for bit", what);
    const int sizes[] = {s->tp, 8, 16};
    for (int i = 0; i < 3; i++) {
        const int S = sizes[i];
        if (S < s->tp || (i > 0 && S == s->tp)) continue;
        run(c, S, 0, want);
        run(c, S, 1, got);
        moe_real *want_part = part_of(want, o, s->rank, s->tp);
        const size_t np = part_count(o, s->tp), diff = test_tp_count_diff(got, want_part, np);
        CHECK(diff == 0, "%s, S %d: tp %d differs from tp 1 in %zu of %zu values", what, S, s->tp, diff, np);
        free(want_part);
        const double err = test_tp_max_rel_err(want, plain, n);
        CHECK(err < s->plain_tolerance, "%s, S %d: %g from the plain product", what, S, err);
        if (S == 8 && kProducts[c->p].is_sum && c->beta == 0)
            CHECK(test_tp_count_diff(want, plain, n) > 0, "%s: 8 pieces give the plain product's bits everywhere: the "
                  "data cannot tell the orders apart", what);
        if (S == 8 && !kProducts[c->p].is_sum && s->rank == 0 && s->tp == 1)
            printf("%s: 8 pieces of the split dimension against one call: %zu of %zu values differ\n", what,
                   test_tp_count_diff(want, plain, n), n);
    }
    free(want), free(got), free(plain);
}

void test_tp_check_products(const test_tp_setup *s, moe_precision precision) {
    const moe_dense_ops *ops = moe_runtime_dense_ops(s->rt);
    moe_dense_state *dense;
    test_mpi_require(ops->create(s->rt, 1, precision, D, &dense), "dense state");
    for (product p = 0; p < NUM_PRODUCTS; p++) {
        const size_t na = count_of(kProducts[p].a), nb = count_of(kProducts[p].b), no = count_of(kProducts[p].out);
        moe_real *a = test_tp_operand(SEED + 10 * p, na, 1, 1), *b = test_tp_operand(SEED + 10 * p + 1, nb, 0.1, 1);
        moe_real *out0 = test_tp_operand(SEED + 10 * p + 2, no, 1, 1);
        if (precision == MOE_PRECISION_BF16 && kProducts[p].b_is_weight) /* the weights' bf16 copies, on the host */
            moe_round_bf16_cpu(b, nb, b);
        for (int beta = 0; beta <= (kProducts[p].acc == BETA); beta++) {
            char what[96];
            snprintf(what, sizeof what, "%s%s, %s", kProducts[p].name,
                     kProducts[p].acc == BETA ? (beta ? " (beta 1)" : " (beta 0)") : "", moe_precision_name(precision));
            const product_case c = {.s = s, .dense = dense, .p = p, .a = a, .b = b, .out0 = out0, .beta = beta};
            check_case(&c, what);
        }
        free(a), free(b), free(out0);
    }
    ops->destroy(dense);
}

/* ---- the vocabulary-parallel cross-entropy ---- */

/* the loss, the softmax denominators Z_t (white box: the tree's sums, which the loss and the gradient, rounded
 * further, rarely show) and this rank's gradient columns at S pieces, on the group or alone (the whole vocabulary);
 * S 0: the runtime's whole-vocabulary kernel (no denominators) */
static void run_cross_entropy(const test_tp_setup *s, moe_dense_state *dense, int S, int on_group,
                              const moe_real *logits, const int *targets, double *loss, double z[CE_T],
                              moe_real *grad) {
    const int parts = on_group ? s->tp : 1, cols = CE_V / parts;
    moe_real *block = test_tp_column_block(logits, CE_T, CE_V, on_group ? s->rank : 0, parts);
    moe_real *l = upload_bytes(s->rt, block, sizeof *l * CE_T * cols);
    int *tg = upload_bytes(s->rt, targets, sizeof *tg * CE_T);
    const moe_real scale = (moe_real)(1.0 / CE_T);
    if (S == 0) {
        const moe_dense_ops *ops = moe_runtime_dense_ops(s->rt);
        test_mpi_require(ops->cross_entropy_forward(dense, l, tg, CE_T, CE_V, loss), "the whole-vocabulary forward");
        test_mpi_require(ops->cross_entropy_backward(dense, l, tg, CE_T, CE_V, scale), "its backward");
    } else {
        moe_tp_cross_entropy ce;
        test_mpi_require(moe_tp_cross_entropy_init(&ce, s->rt, dense, on_group ? s->group : NULL, S), "cross-entropy");
        test_mpi_require(moe_tp_cross_entropy_forward(&ce, l, tg, CE_T, CE_V, loss), "forward");
        test_mpi_require(moe_tp_cross_entropy_backward(&ce, l, tg, CE_T, CE_V, scale), "backward");
        memcpy(z, ce.z, sizeof *z * CE_T);
        moe_tp_cross_entropy_free(&ce);
    }
    test_mpi_require(moe_runtime_download(s->rt, grad, l, sizeof *grad * CE_T * cols), "download");
    moe_runtime_free(s->rt, l), moe_runtime_free(s->rt, tg);
    free(block);
}

void test_tp_check_cross_entropy(const test_tp_setup *s) {
    const moe_dense_ops *ops = moe_runtime_dense_ops(s->rt);
    moe_dense_state *dense;
    test_mpi_require(ops->create(s->rt, 1, MOE_PRECISION_FP32, CE_V, &dense), "dense state");
    moe_real *logits = test_tp_operand(SEED + 3, (size_t)CE_T * CE_V, 16, 0);
    int targets[CE_T];
    moe_rng rng = moe_rng_seeded(SEED + 4);
    for (int t = 0; t < CE_T; t++) targets[t] = (int)(moe_rng_next(&rng) % CE_V);
    const size_t n = (size_t)CE_T * CE_V;
    moe_real *want = malloc(n * sizeof *want), *got = malloc(n * sizeof *got), *plain = malloc(n * sizeof *plain);
    double loss_plain, loss_want, loss_got, z_plain[CE_T], z_want[CE_T], z_got[CE_T];
    run_cross_entropy(s, dense, 0, 0, logits, targets, &loss_plain, NULL, plain);
    run_cross_entropy(s, dense, 1, 0, logits, targets, &loss_want, z_plain, want);
    const double one_piece_err = fabs(loss_want - loss_plain) / fabs(loss_plain);
    CHECK(s->one_piece_loss_tolerance ? one_piece_err <= s->one_piece_loss_tolerance
                                      : memcmp(&loss_want, &loss_plain, sizeof loss_want) == 0,
          "cross-entropy, one piece: loss %.17g vs the whole-vocabulary kernel's %.17g", loss_want, loss_plain);
    CHECK(test_tp_count_diff(want, plain, n) == 0, "cross-entropy, one piece: %zu gradient values differ from the "
          "whole-vocabulary kernel's", test_tp_count_diff(want, plain, n));
    const int sizes[] = {s->tp, 8, 16};
    for (int i = 0; i < 3; i++) {
        const int S = sizes[i];
        if (S < s->tp || (i > 0 && S == s->tp)) continue;
        run_cross_entropy(s, dense, S, 0, logits, targets, &loss_want, z_want, want);
        run_cross_entropy(s, dense, S, 1, logits, targets, &loss_got, z_got, got);
        CHECK(memcmp(&loss_got, &loss_want, sizeof loss_got) == 0, "cross-entropy, S %d: tp %d loss %.17g, tp 1 %.17g",
              S, s->tp, loss_got, loss_want);
        CHECK(memcmp(z_got, z_want, sizeof z_got) == 0, "cross-entropy, S %d: tp %d's denominators differ from tp 1's",
              S, s->tp);
        moe_real *want_local = test_tp_column_block(want, CE_T, CE_V, s->rank, s->tp);
        const size_t diff = test_tp_count_diff(got, want_local, n / s->tp);
        CHECK(diff == 0, "cross-entropy, S %d: tp %d's gradient differs from tp 1's in %zu of %zu values", S, s->tp,
              diff, n / s->tp);
        free(want_local);
        CHECK(fabs(loss_want - loss_plain) < 1e-9 * fabs(loss_plain) && test_tp_max_rel_err(want, plain, n) < 1e-5,
              "cross-entropy, S %d: loss %.17g vs the kernel's %.17g", S, loss_want, loss_plain);
        if (S == 8)
            CHECK(memcmp(z_want, z_plain, sizeof z_want) != 0, "cross-entropy: 8 pieces give the whole-vocabulary "
                  "sums' bits for every token: the data cannot tell the orders apart");
    }
    free(logits), free(want), free(got), free(plain);
    ops->destroy(dense);
}
