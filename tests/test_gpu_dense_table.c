/* test_gpu_dense_table.c — every entry of the CUDA dense table (moe/dense_ops_cuda.c, on a CUDA runtime) against
 * the CPU table (moe/dense_ops_cpu.c: the oracle) on the same inputs, through the tables themselves, as
 * models/model.c calls them. Three table configurations: fp32 without row blocks, fp32 with them
 * (layout_invariant), bf16 precision with them; two shapes: 2 sequences of 37 tokens (74 rows: a full row block and
 * a padded one) with GQA (4 query heads, 2 kv heads), and a single token.
 *   bitwise:        embedding forward and backward (the whole vocabulary and a block of it), add, scale, round_bf16,
 *                   find_nonfinite (the exact index)
 *   per-op rows of tests/test_tolerance.c: RMSNorm, linear (all three products, beta 0 and 1), RoPE, attention
 *                   (materialized; fused also at 2 sequences of 150 tokens),
 *                   the dense SwiGLU (and its elementwise part alone), cross-entropy (and the vocabulary-parallel
 *                   one's per-row parts: the maxima and target logits bitwise), AdamW, the sum of squares; "f32"
 *                   or "bf16" by precision
 *   every entry:    a second GPU run from the same start gives the same bits (no atomics)
 *   layout_invariant: a linear product over the first 10 rows gives those rows the bits of the 74-row product (a
 *                   padded block against a full one)
 *   bf16:           the fused attention at head_dim 32, 64 and 128 too, the tensor-core flash kernels' (kernels/
 *                   attention_flash.cu) against the CPU's fused tiles, and a sequence's bits alone and among two
 *                   neighbours (forward and backward, bitwise)
 * Outputs the GPU overwrites are poisoned (0xFF: NaN) before each run; outputs an entry accumulates into or works
 * on in place start from the same values on both sides. Backward entries take the CPU forward's saved values (rstd,
 * att, h1, h3, act) on both sides. Under bf16 the weights hold bf16 values, as the model's copies do.
 * Exit 77 (skip) without a GPU. Run: meson test -C build test_gpu_dense_table */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/attention.h"
#include "kernels/cast.h"
#include "moe/dense_ops.h"
#include "moe/runtime.h"
#include "tests/test_gpu_util.h"
#include "tests/test_tolerance.h"

enum { CPU_SIDE, GPU_SIDE, MAX_OUTPUTS = 4 };

typedef struct {
    const moe_dense_ops *ops[2];
    moe_dense_state *state[2];
    moe_gpu *gpu;
    const char *dtype; /* the tolerance rows' dtype: the precision both tables run */
    int layout_invariant, bf16;
    moe_rng rng;
} tables;

/* values on both sides: h the CPU table's (host), d the GPU table's (device) */
typedef struct {
    float *h, *d;
    size_t n;
} pair;

typedef struct {
    int *h, *d;
} int_pair;

#define AT(side, p) ((side) == GPU_SIDE ? (p)->d : (p)->h)

static float *host_floats(size_t n) {
    float *p = malloc((n ? n : 1) * sizeof(float));
    if (!p) {
        fprintf(stderr, "test_gpu_dense_table: out of memory\n");
        exit(1);
    }
    return p;
}

static pair pair_of(tables *t, float *host, size_t n) {
    return (pair){host, test_gpu_upload(t->gpu, host, (n ? n : 1) * sizeof(float)), n};
}

static pair pair_random(tables *t, size_t n, double scale) { return pair_of(t, test_alloc_uniform(&t->rng, n, scale), n); }

/* a weight: under bf16 its bf16 copy, as models/model.c hands the GEMMs */
static pair pair_weight(tables *t, size_t n, double scale) {
    float *w = test_alloc_uniform(&t->rng, n, scale);
    if (t->bf16) moe_bf16_round_n(w, n, w);
    return pair_of(t, w, n);
}

static void pair_free(tables *t, pair *p) {
    free(p->h);
    test_gpu_free(t->gpu, p->d);
    *p = (pair){0};
}

static int_pair ints_random(tables *t, size_t n, int below) {
    int *h = malloc(n * sizeof(int));
    CHECK(h != NULL, "out of memory");
    for (size_t i = 0; i < n; i++) h[i] = (int)(moe_rng_next(&t->rng) % (uint64_t)below);
    return (int_pair){h, test_gpu_upload(t->gpu, h, n * sizeof(int))};
}

static float *download(tables *t, const pair *p) {
    float *h = host_floats(p->n);
    test_gpu_download(t->gpu, h, p->d, p->n * sizeof(float));
    return h;
}

/* an output of an entry: compared under tolerance row `row` (NULL: bitwise); kept: the entry reads it (accumulates
 * or works in place), so both sides start from its values, else the GPU's is poisoned */
typedef struct {
    pair *p;
    const char *name, *row;
    int kept;
} output;

typedef moe_status (*entry_run)(tables *t, int side, void *ctx);

/* the dtype of a tolerance row: the tables' precision for the entries it changes (GEMM inputs), else "f32" */
static const char *row_dtype(const tables *t, const char *row) {
    static const char *const by_precision[] = {"linear", "dense swiglu", "dense swiglu backward", "attention fused",
                                               "attention fused backward", "attention fused backward, one key"};
    for (size_t i = 0; i < sizeof by_precision / sizeof *by_precision; i++)
        if (!strcmp(row, by_precision[i])) return t->dtype;
    return "f32";
}

static void compare(tables *t, const output *o, const float *got, const char *label) {
    if (o->row) {
        test_tolerance_check(o->row, row_dtype(t, o->row), got, o->p->h, o->p->n, "%s: %s", label, o->name);
        return;
    }
    size_t bad = 0;
    for (size_t i = 0; i < o->p->n; i++) bad += memcmp(&got[i], &o->p->h[i], sizeof(float)) != 0;
    printf("%-28s %-4s %-44s n=%-8zu bitwise: %zu differ\n", label, t->dtype, o->name, o->p->n, bad);
    CHECK(bad == 0, "%s: %s: %zu of %zu values differ from the CPU table", label, o->name, bad, o->p->n);
}

/* Runs an entry on the CPU table, then twice on the GPU table from the same start; compares each output with the
 * CPU's, and the second GPU run's with the first's bitwise. */
static void check_entry(tables *t, const char *label, entry_run run, void *ctx, const output *outs, int num_outs) {
    float *start[MAX_OUTPUTS], *first[MAX_OUTPUTS];
    for (int i = 0; i < num_outs; i++) {
        start[i] = host_floats(outs[i].p->n);
        memcpy(start[i], outs[i].p->h, outs[i].p->n * sizeof(float));
    }
    CHECK_OK(run(t, CPU_SIDE, ctx));
    for (int rep = 0; rep < 2; rep++) {
        for (int i = 0; i < num_outs; i++) {
            const size_t nbytes = outs[i].p->n * sizeof(float);
            if (outs[i].kept) CHECK_OK(moe_gpu_upload(t->gpu, outs[i].p->d, start[i], nbytes));
            else test_gpu_poison(t->gpu, outs[i].p->d, nbytes ? nbytes : 1);
        }
        CHECK_OK(run(t, GPU_SIDE, ctx));
        for (int i = 0; i < num_outs; i++) {
            float *got = download(t, outs[i].p);
            if (rep == 0) {
                compare(t, &outs[i], got, label);
                first[i] = got;
                continue;
            }
            CHECK(!memcmp(got, first[i], outs[i].p->n * sizeof(float)), "%s: %s: a second GPU run gives other bits",
                  label, outs[i].name);
            free(got), free(first[i]), free(start[i]);
        }
    }
}

/* ---- the entries, each run on one side ---- */

typedef struct {
    int T, d, V, first, rows; /* the table holds the rows of ids [first, first + rows) */
    pair *table, *y, *dy, *dtable;
    int_pair *tokens;
} embedding_ctx;

static moe_status run_embedding_forward(tables *t, int side, void *c) {
    embedding_ctx *e = c;
    return t->ops[side]->embedding_forward(t->state[side], AT(side, e->table), AT(side, e->tokens), e->T, e->d,
                                           e->first, e->rows, AT(side, e->y));
}

static moe_status run_embedding_backward(tables *t, int side, void *c) {
    embedding_ctx *e = c;
    return t->ops[side]->embedding_backward(t->state[side], AT(side, e->dy), AT(side, e->tokens), e->T, e->d,
                                            e->first, e->rows, AT(side, e->dtable));
}

/* rows < V: a vocabulary-parallel block, ids [first, first + rows) (the others read -0.0 and add nothing) */
static void test_embedding(tables *t, const char *label, int T, int d, int V, int first, int rows) {
    pair table = pair_random(t, (size_t)rows * d, 1), y = pair_random(t, (size_t)T * d, 1);
    pair dy = pair_random(t, (size_t)T * d, 1), dtable = pair_random(t, (size_t)rows * d, 1);
    int_pair tokens = ints_random(t, (size_t)T, V / 2); /* repeats, and rows that no token touches */
    embedding_ctx e = {T, d, V, first, rows, &table, &y, &dy, &dtable, &tokens};
    check_entry(t, label, run_embedding_forward, &e, &(output){&y, "embedding forward", NULL, 0}, 1);
    check_entry(t, label, run_embedding_backward, &e, &(output){&dtable, "embedding backward", NULL, 1}, 1);
    pair_free(t, &table), pair_free(t, &y), pair_free(t, &dy), pair_free(t, &dtable);
    free(tokens.h), test_gpu_free(t->gpu, tokens.d);
}

typedef struct {
    int T, d;
    float eps;
    pair *x, *w, *y, *rstd, *dy, *dx, *dw;
} rmsnorm_ctx;

static moe_status run_rmsnorm_forward(tables *t, int side, void *c) {
    rmsnorm_ctx *r = c;
    return t->ops[side]->rmsnorm_forward(t->state[side], AT(side, r->x), AT(side, r->w), r->T, r->d, r->eps,
                                         AT(side, r->y), AT(side, r->rstd));
}

static moe_status run_rmsnorm_backward(tables *t, int side, void *c) {
    rmsnorm_ctx *r = c;
    return t->ops[side]->rmsnorm_backward(t->state[side], AT(side, r->x), AT(side, r->w), AT(side, r->rstd),
                                          AT(side, r->dy), r->T, r->d, AT(side, r->dx), AT(side, r->dw));
}

static void test_rmsnorm(tables *t, const char *label, int T, int d) {
    pair x = pair_random(t, (size_t)T * d, 2), w = pair_random(t, (size_t)d, 1), y = pair_random(t, (size_t)T * d, 1);
    pair rstd = pair_random(t, (size_t)T, 1), dy = pair_random(t, (size_t)T * d, 1);
    pair dx = pair_random(t, (size_t)T * d, 1), dw = pair_random(t, (size_t)d, 1);
    rmsnorm_ctx r = {T, d, 1e-5f, &x, &w, &y, &rstd, &dy, &dx, &dw};
    const output fwd[] = {{&y, "rmsnorm y", "rmsnorm", 0}, {&rstd, "rmsnorm rstd", "rmsnorm", 0}};
    check_entry(t, label, run_rmsnorm_forward, &r, fwd, 2);
    CHECK_OK(moe_gpu_upload(t->gpu, rstd.d, rstd.h, rstd.n * sizeof(float))); /* the CPU's rstd on both sides */
    const output bwd[] = {{&dx, "rmsnorm dx", "rmsnorm backward", 1}, {&dw, "rmsnorm dw", "rmsnorm backward", 1}};
    check_entry(t, label, run_rmsnorm_backward, &r, bwd, 2);
    pair *all[] = {&x, &w, &y, &rstd, &dy, &dx, &dw};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) pair_free(t, all[i]);
}

typedef struct {
    int T, in, out;
    float beta;
    pair *x, *W, *y, *dy, *dx, *dW;
} linear_ctx;

static moe_status run_linear_forward(tables *t, int side, void *c) {
    linear_ctx *l = c;
    return t->ops[side]->linear_forward(t->state[side], AT(side, l->x), AT(side, l->W), l->T, l->in, l->out,
                                        AT(side, l->y));
}

static moe_status run_linear_backward_input(tables *t, int side, void *c) {
    linear_ctx *l = c;
    return t->ops[side]->linear_backward_input(t->state[side], AT(side, l->dy), AT(side, l->W), l->T, l->in, l->out,
                                               l->beta, AT(side, l->dx));
}

static moe_status run_linear_backward_weight(tables *t, int side, void *c) {
    linear_ctx *l = c;
    return t->ops[side]->linear_backward_weight(t->state[side], AT(side, l->dy), AT(side, l->x), l->T, l->in, l->out,
                                                AT(side, l->dW));
}

/* With row blocks: the first `rows` rows of a GPU product over all l->T rows against a product over those rows
 * alone, bitwise; both start from the same out (the CPU's result, for beta 1). */
static void check_fewer_rows(tables *t, const char *label, entry_run run, linear_ctx *l, pair *out, int width,
                             int rows) {
    if (!t->layout_invariant || rows >= l->T) return;
    const int T = l->T;
    float *result[2];
    for (int k = 0; k < 2; k++) {
        CHECK_OK(moe_gpu_upload(t->gpu, out->d, out->h, out->n * sizeof(float)));
        l->T = k ? rows : T;
        CHECK_OK(run(t, GPU_SIDE, l));
        result[k] = download(t, out);
    }
    l->T = T;
    float *all = result[0], *fewer = result[1];
    const size_t n = (size_t)rows * width;
    CHECK(!memcmp(fewer, all, n * sizeof(float)), "%s: the first %d rows differ from a product over %d rows", label,
          rows, T);
    printf("%-28s %-4s the first %d rows alone: %s\n", label, t->dtype, rows,
           memcmp(fewer, all, n * sizeof(float)) ? "DIFFER" : "bitwise");
    free(all), free(fewer);
}

static void test_linear(tables *t, const char *label, int T, int in, int out) {
    pair x = pair_random(t, (size_t)T * in, 1), W = pair_weight(t, (size_t)out * in, 0.3);
    pair y = pair_random(t, (size_t)T * out, 1), dy = pair_random(t, (size_t)T * out, 1);
    pair dx = pair_random(t, (size_t)T * in, 1), dW = pair_random(t, (size_t)out * in, 1);
    linear_ctx l = {T, in, out, 0, &x, &W, &y, &dy, &dx, &dW};
    check_entry(t, label, run_linear_forward, &l, &(output){&y, "linear y", "linear", 0}, 1);
    check_fewer_rows(t, label, run_linear_forward, &l, &y, out, 10);
    for (int beta = 0; beta <= 1; beta++) {
        l.beta = (float)beta;
        check_entry(t, label, run_linear_backward_input, &l,
                    &(output){&dx, beta ? "linear dx (+=)" : "linear dx", "linear", beta}, 1);
        check_fewer_rows(t, label, run_linear_backward_input, &l, &dx, in, 10);
    }
    check_entry(t, label, run_linear_backward_weight, &l, &(output){&dW, "linear dW (+=)", "linear", 1}, 1);
    pair *all[] = {&x, &W, &y, &dy, &dx, &dW};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) pair_free(t, all[i]);
}

typedef struct {
    int num_seqs, S, H, KV, hd;
    pair *x;
    moe_rope rope;
} rope_ctx;

static moe_status run_rope_forward(tables *t, int side, void *c) {
    rope_ctx *r = c;
    return t->ops[side]->rope_forward(t->state[side], AT(side, r->x), r->num_seqs, r->S, r->H, r->hd, &r->rope);
}

static moe_status run_rope_backward(tables *t, int side, void *c) {
    rope_ctx *r = c;
    return t->ops[side]->rope_backward(t->state[side], AT(side, r->x), r->num_seqs, r->S, r->H, r->hd, &r->rope);
}

typedef struct {
    int num_seqs, S, H, KV, hd;
    pair *q, *k, *v, *att, *out, *dout, *dq, *dk, *dv;
} attention_ctx;

static moe_status run_attention_forward(tables *t, int side, void *c) {
    attention_ctx *a = c;
    return t->ops[side]->attention_forward(t->state[side], AT(side, a->q), AT(side, a->k), AT(side, a->v),
                                           a->num_seqs, a->S, a->H, a->KV, a->hd, AT(side, a->att), AT(side, a->out));
}

static moe_status run_attention_backward(tables *t, int side, void *c) {
    attention_ctx *a = c;
    return t->ops[side]->attention_backward(t->state[side], AT(side, a->q), AT(side, a->k), AT(side, a->v),
                                            AT(side, a->att), AT(side, a->dout), a->num_seqs, a->S, a->H, a->KV, a->hd,
                                            AT(side, a->dq), AT(side, a->dk), AT(side, a->dv));
}

/* The fused pair keeps lse [num_seqs, H, S] in att's place; its backward also reads out. */
static moe_status run_attention_fused_forward(tables *t, int side, void *c) {
    attention_ctx *a = c;
    return t->ops[side]->attention_fused_forward(t->state[side], AT(side, a->q), AT(side, a->k), AT(side, a->v),
                                                 a->num_seqs, a->S, a->H, a->KV, a->hd, AT(side, a->att),
                                                 AT(side, a->out));
}

static moe_status run_attention_fused_backward(tables *t, int side, void *c) {
    attention_ctx *a = c;
    return t->ops[side]->attention_fused_backward(t->state[side], AT(side, a->q), AT(side, a->k), AT(side, a->v),
                                                  AT(side, a->out), AT(side, a->att), AT(side, a->dout), a->num_seqs,
                                                  a->S, a->H, a->KV, a->hd, AT(side, a->dq), AT(side, a->dk),
                                                  AT(side, a->dv));
}

/* The fused attention: forward (lse, out), then backward from the CPU's lse and out on both sides. */
static void test_attention_fused(tables *t, const char *label, int num_seqs, int S, int H, int KV, int hd) {
    const size_t nq = (size_t)num_seqs * S * H * hd, nkv = (size_t)num_seqs * S * KV * hd;
    const size_t nlse = (size_t)num_seqs * H * S;
    pair q = pair_random(t, nq, 1), k = pair_random(t, nkv, 1), v = pair_random(t, nkv, 1);
    pair lse = pair_random(t, nlse, 1), out = pair_random(t, nq, 1), dout = pair_random(t, nq, 1);
    pair dq = pair_random(t, nq, 1), dk = pair_random(t, nkv, 1), dv = pair_random(t, nkv, 1);
    attention_ctx a = {num_seqs, S, H, KV, hd, &q, &k, &v, &lse, &out, &dout, &dq, &dk, &dv};
    const output fwd[] = {{&lse, "attention fused lse", "attention fused", 0},
                          {&out, "attention fused out", "attention fused", 0}};
    check_entry(t, label, run_attention_fused_forward, &a, fwd, 2);
    CHECK_OK(moe_gpu_upload(t->gpu, lse.d, lse.h, nlse * sizeof(float))); /* the CPU's statistics and output */
    CHECK_OK(moe_gpu_upload(t->gpu, out.d, out.h, nq * sizeof(float)));
    const char *dqk_row = S == 1 ? "attention fused backward, one key" : "attention fused backward";
    const output bwd[] = {{&dq, "attention fused dq", dqk_row, 0},
                          {&dk, "attention fused dk", dqk_row, 0},
                          {&dv, "attention fused dv", "attention fused backward", 0}};
    check_entry(t, label, run_attention_fused_backward, &a, bwd, 3);
    pair *all[] = {&q, &k, &v, &lse, &out, &dout, &dq, &dk, &dv};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) pair_free(t, all[i]);
}

/* The fused attention of sequence 1 of 3, and of it alone: the same bits (GPU only). */
static void test_attention_neighbours(tables *t, const char *label, int S, int H, int KV, int hd) {
    const size_t nq = (size_t)S * H * hd, nkv = (size_t)S * KV * hd, nlse = (size_t)H * S;
    pair q = pair_random(t, 3 * nq, 1), k = pair_random(t, 3 * nkv, 1), v = pair_random(t, 3 * nkv, 1);
    pair dout = pair_random(t, 3 * nq, 1);
    pair all[2][5]; /* [3 sequences, sequence 1 alone]: lse, out, dq, dk, dv */
    for (int run = 0; run < 2; run++) {
        const size_t seqs = run == 0 ? 3 : 1;
        all[run][0] = pair_random(t, seqs * nlse, 1), all[run][1] = pair_random(t, seqs * nq, 1);
        all[run][2] = pair_random(t, seqs * nq, 1), all[run][3] = pair_random(t, seqs * nkv, 1);
        all[run][4] = pair_random(t, seqs * nkv, 1);
        const size_t first = run == 0 ? 0 : 1; /* the inputs' sequence */
        const moe_dense_ops *ops = t->ops[GPU_SIDE];
        CHECK_OK(ops->attention_fused_forward(t->state[GPU_SIDE], q.d + first * nq, k.d + first * nkv,
                                              v.d + first * nkv, (int)seqs, S, H, KV, hd, all[run][0].d,
                                              all[run][1].d));
        CHECK_OK(ops->attention_fused_backward(t->state[GPU_SIDE], q.d + first * nq, k.d + first * nkv,
                                               v.d + first * nkv, all[run][1].d, all[run][0].d, dout.d + first * nq,
                                               (int)seqs, S, H, KV, hd, all[run][2].d, all[run][3].d, all[run][4].d));
    }
    const size_t per_seq[5] = {nlse, nq, nq, nkv, nkv};
    const char *names[5] = {"lse", "out", "dq", "dk", "dv"};
    const int flash = moe_attention_flash_applies(hd);
    for (int o = 0; o < 5; o++) {
        float *among = download(t, &all[0][o]), *alone = download(t, &all[1][o]);
        const int same = !memcmp(among + per_seq[o], alone, per_seq[o] * sizeof(float));
        printf("%-28s %-4s attention %s %s (S %d, hd %d): sequence 1 of 3 vs alone: %s\n", label, t->dtype,
               flash ? "flash" : "plain", names[o], S, hd, same ? "bitwise" : "DIFFER");
        CHECK(same, "%s: hd %d: attention %s of a sequence among neighbours differs from it alone", label, hd, names[o]);
        free(among), free(alone);
    }
    for (int run = 0; run < 2; run++)
        for (int o = 0; o < 5; o++) pair_free(t, &all[run][o]);
    pair_free(t, &q), pair_free(t, &k), pair_free(t, &v), pair_free(t, &dout);
}

static void test_rope_attention(tables *t, const char *label, int num_seqs, int S, int H, int KV, int hd) {
    const size_t nq = (size_t)num_seqs * S * H * hd, nkv = (size_t)num_seqs * S * KV * hd;
    const size_t natt = (size_t)num_seqs * H * S * S;
    pair q = pair_random(t, nq, 1), k = pair_random(t, nkv, 1), v = pair_random(t, nkv, 1);
    pair att = pair_random(t, natt, 1), out = pair_random(t, nq, 1), dout = pair_random(t, nq, 1);
    pair dq = pair_random(t, nq, 1), dk = pair_random(t, nkv, 1), dv = pair_random(t, nkv, 1);
    rope_ctx r = {num_seqs, S, H, KV, hd, &q, moe_rope_plain(1e4)};
    check_entry(t, label, run_rope_forward, &r, &(output){&q, "rope forward (in place)", "rope", 1}, 1);
    check_entry(t, label, run_rope_backward, &r, &(output){&q, "rope backward (in place)", "rope", 1}, 1);
    CHECK_OK(moe_gpu_upload(t->gpu, q.d, q.h, nq * sizeof(float))); /* q as the CPU left it, on both sides */
    attention_ctx a = {num_seqs, S, H, KV, hd, &q, &k, &v, &att, &out, &dout, &dq, &dk, &dv};
    const output fwd[] = {{&att, "attention att", "attention", 0}, {&out, "attention out", "attention", 0}};
    check_entry(t, label, run_attention_forward, &a, fwd, 2);
    CHECK_OK(moe_gpu_upload(t->gpu, att.d, att.h, natt * sizeof(float))); /* the CPU's probabilities */
    const output bwd[] = {{&dq, "attention dq", "attention backward", 0},
                          {&dk, "attention dk", "attention backward", 0},
                          {&dv, "attention dv", "attention backward", 0}};
    check_entry(t, label, run_attention_backward, &a, bwd, 3);
    pair *all[] = {&q, &k, &v, &att, &out, &dout, &dq, &dk, &dv};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) pair_free(t, all[i]);
}

typedef struct {
    int T, d, d_ff;
    moe_layer_weights w[2], g[2]; /* views per side */
    pair *x, *h1, *h3, *act, *y, *dy, *dx;
} swiglu_ctx;

static moe_status run_swiglu_forward(tables *t, int side, void *c) {
    swiglu_ctx *f = c;
    return t->ops[side]->swiglu_forward(t->state[side], &f->w[side], f->T, f->d, f->d_ff, AT(side, f->x),
                                        AT(side, f->h1), AT(side, f->h3), AT(side, f->act), AT(side, f->y));
}

static moe_status run_swiglu_backward(tables *t, int side, void *c) {
    swiglu_ctx *f = c;
    return t->ops[side]->swiglu_backward(t->state[side], &f->w[side], &f->g[side], f->T, f->d, f->d_ff,
                                         AT(side, f->x), AT(side, f->h1), AT(side, f->h3), AT(side, f->act),
                                         AT(side, f->dy), AT(side, f->dx));
}

/* the elementwise part alone (a tensor-parallel dense FFN's, models/ffn.c): act from h1, h3; dh1 (dact on entry),
 * dh3 */
typedef struct {
    size_t n;
    pair *h1, *h3, *act, *dh1, *dh3;
} swiglu_act_ctx;

static moe_status run_swiglu_act_forward(tables *t, int side, void *c) {
    swiglu_act_ctx *f = c;
    return t->ops[side]->swiglu_act_forward(t->state[side], AT(side, f->h1), AT(side, f->h3), f->n, AT(side, f->act));
}

static moe_status run_swiglu_act_backward(tables *t, int side, void *c) {
    swiglu_act_ctx *f = c;
    return t->ops[side]->swiglu_act_backward(t->state[side], AT(side, f->h1), AT(side, f->h3), f->n, AT(side, f->dh1),
                                             AT(side, f->dh3));
}

static void test_swiglu_act(tables *t, const char *label, size_t n) {
    pair h1 = pair_random(t, n, 2), h3 = pair_random(t, n, 1), act = pair_random(t, n, 1);
    pair dh1 = pair_random(t, n, 1), dh3 = pair_random(t, n, 1);
    swiglu_act_ctx f = {n, &h1, &h3, &act, &dh1, &dh3};
    check_entry(t, label, run_swiglu_act_forward, &f, &(output){&act, "swiglu act alone", "dense swiglu", 0}, 1);
    const output bwd[] = {{&dh1, "swiglu act backward dh1 (in place)", "dense swiglu backward", 1},
                          {&dh3, "swiglu act backward dh3", "dense swiglu backward", 0}};
    check_entry(t, label, run_swiglu_act_backward, &f, bwd, 2);
    pair *all[] = {&h1, &h3, &act, &dh1, &dh3};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) pair_free(t, all[i]);
}

static void test_swiglu(tables *t, const char *label, int T, int d, int d_ff) {
    const size_t nw = (size_t)d_ff * d, nx = (size_t)T * d, nf = (size_t)T * d_ff;
    pair w1 = pair_weight(t, nw, 0.3), w2 = pair_weight(t, nw, 0.3), w3 = pair_weight(t, nw, 0.3);
    pair g1 = pair_random(t, nw, 1), g2 = pair_random(t, nw, 1), g3 = pair_random(t, nw, 1);
    pair x = pair_random(t, nx, 1), y = pair_random(t, nx, 1), dy = pair_random(t, nx, 1), dx = pair_random(t, nx, 1);
    pair h1 = pair_random(t, nf, 1), h3 = pair_random(t, nf, 1), act = pair_random(t, nf, 1);
    swiglu_ctx f = {T, d, d_ff, .x = &x, .h1 = &h1, .h3 = &h3, .act = &act, .y = &y, .dy = &dy, .dx = &dx};
    for (int side = 0; side < 2; side++) {
        f.w[side] = (moe_layer_weights){.w1 = AT(side, &w1), .w2 = AT(side, &w2), .w3 = AT(side, &w3)};
        f.g[side] = (moe_layer_weights){.w1 = AT(side, &g1), .w2 = AT(side, &g2), .w3 = AT(side, &g3)};
    }
    const output fwd[] = {{&h1, "swiglu h1", "dense swiglu", 0}, {&h3, "swiglu h3", "dense swiglu", 0},
                          {&act, "swiglu act", "dense swiglu", 0}, {&y, "swiglu y", "dense swiglu", 0}};
    check_entry(t, label, run_swiglu_forward, &f, fwd, 4);
    pair *saved[] = {&h1, &h3, &act}; /* the CPU's, on both sides */
    for (int i = 0; i < 3; i++) CHECK_OK(moe_gpu_upload(t->gpu, saved[i]->d, saved[i]->h, nf * sizeof(float)));
    const output bwd[] = {{&dx, "swiglu dx", "dense swiglu backward", 0},
                          {&g1, "swiglu dW1 (+=)", "dense swiglu backward", 1},
                          {&g2, "swiglu dW2 (+=)", "dense swiglu backward", 1},
                          {&g3, "swiglu dW3 (+=)", "dense swiglu backward", 1}};
    check_entry(t, label, run_swiglu_backward, &f, bwd, 4);
    pair *all[] = {&w1, &w2, &w3, &g1, &g2, &g3, &x, &y, &dy, &dx, &h1, &h3, &act};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) pair_free(t, all[i]);
}

typedef struct {
    size_t n;
    double factor;
    pair *a, *b, *y, *m, *v;
    moe_adamw_params hp;
} vector_ctx;

static moe_status run_add(tables *t, int side, void *c) {
    vector_ctx *e = c;
    return t->ops[side]->add(t->state[side], AT(side, e->a), AT(side, e->b), e->n, AT(side, e->y));
}

static moe_status run_scale(tables *t, int side, void *c) {
    vector_ctx *e = c;
    return t->ops[side]->scale(t->state[side], AT(side, e->y), e->n, e->factor);
}

static moe_status run_round_bf16(tables *t, int side, void *c) {
    vector_ctx *e = c;
    return t->ops[side]->round_bf16(t->state[side], AT(side, e->a), e->n, AT(side, e->y));
}

/* param e->y, grad e->b, moments e->m and e->v */
static moe_status run_adamw(tables *t, int side, void *c) {
    vector_ctx *e = c;
    return t->ops[side]->adamw_update(t->state[side], AT(side, e->y), AT(side, e->b), AT(side, e->m), AT(side, e->v),
                                      e->n, &e->hp);
}

/* add, scale, round_bf16, AdamW, and the entries that return host values: sum_squares, find_nonfinite */
static void test_vectors(tables *t, const char *label, size_t n) {
    pair a = pair_random(t, n, 3), b = pair_random(t, n, 1e-2), y = pair_random(t, n, 1);
    pair m = pair_random(t, n, 1e-3), v = pair_random(t, n, 1e-3);
    for (size_t i = 0; i < n; i++) v.h[i] = fabsf(v.h[i]); /* second moments are not negative */
    CHECK_OK(moe_gpu_upload(t->gpu, v.d, v.h, n * sizeof(float)));
    vector_ctx e = {n, 1.0 / 3.0, &a, &b, &y, &m, &v, {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, 1.0 / 3.0}}; /* clipped */
    check_entry(t, label, run_add, &e, &(output){&y, "add", NULL, 0}, 1);
    check_entry(t, label, run_scale, &e, &(output){&y, "scale (in place)", NULL, 1}, 1);
    check_entry(t, label, run_round_bf16, &e, &(output){&y, "round_bf16", NULL, 0}, 1);
    const output adamw[] = {{&y, "adamw param", "adamw", 1}, {&m, "adamw m", "adamw", 1}, {&v, "adamw v", "adamw", 1}};
    check_entry(t, label, run_adamw, &e, adamw, 3);

    /* the gradient norm's sums: the whole vector, and it cut into ranges (an empty one among them) in one call:
     * bitwise the CPU's (the same lanes and tree, core/threads.h), and the same again */
    const size_t cuts[] = {0, n, 0, n / 3, n / 3, n / 2, n};
    const size_t *lists[2] = {cuts, cuts + 2};
    const size_t counts[2] = {1, 4};
    for (int l = 0; l < 2; l++) {
        double want[4] = {0}, got[2][4] = {{0}};
        CHECK_OK(t->ops[CPU_SIDE]->sum_squares(t->state[CPU_SIDE], a.h, lists[l], counts[l], want));
        for (int rep = 0; rep < 2; rep++)
            CHECK_OK(t->ops[GPU_SIDE]->sum_squares(t->state[GPU_SIDE], a.d, lists[l], counts[l], got[rep]));
        CHECK(!memcmp(got[0], want, counts[l] * sizeof(double)), "%s: sum_squares over %zu range(s): %.17g, the CPU "
              "%.17g", label, counts[l], got[0][0], want[0]);
        CHECK(!memcmp(got[0], got[1], counts[l] * sizeof(double)), "%s: sum_squares: a second GPU run gives other bits",
              label);
    }

    /* non-finite values: none; a NaN; an Inf after it (the NaN's index wins); -Inf at 0 */
    const size_t at[] = {n / 2, n - 1, 0};
    const float bad[] = {NAN, INFINITY, -INFINITY};
    for (int c = 0; c <= 3; c++) {
        if (c > 0) a.h[at[c - 1]] = bad[c - 1];
        CHECK_OK(moe_gpu_upload(t->gpu, a.d, a.h, n * sizeof(float)));
        long long first_cpu = -2, first_gpu = -2;
        CHECK_OK(t->ops[CPU_SIDE]->find_nonfinite(t->state[CPU_SIDE], a.h, n, &first_cpu));
        CHECK_OK(t->ops[GPU_SIDE]->find_nonfinite(t->state[GPU_SIDE], a.d, n, &first_gpu));
        CHECK(first_gpu == first_cpu, "%s: find_nonfinite case %d: GPU %lld, CPU %lld", label, c, first_gpu, first_cpu);
    }
    printf("%-28s %-4s sum_squares, find_nonfinite n=%zu checked\n", label, t->dtype, n);
    pair *all[] = {&a, &b, &y, &m, &v};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) pair_free(t, all[i]);
}

typedef struct {
    int T, V;
    float scale;
    pair *logits;
    int_pair *targets;
} xent_ctx;

static moe_status run_xent_backward(tables *t, int side, void *c) {
    xent_ctx *x = c;
    return t->ops[side]->cross_entropy_backward(t->state[side], AT(side, x->logits), AT(side, x->targets), x->T, x->V,
                                                x->scale);
}

static void test_cross_entropy(tables *t, const char *label, int T, int V) {
    pair logits = pair_random(t, (size_t)T * V, 4);
    int_pair targets = ints_random(t, (size_t)T, V);
    double want = 0, got[2] = {0, 0};
    CHECK_OK(t->ops[CPU_SIDE]->cross_entropy_forward(t->state[CPU_SIDE], logits.h, targets.h, T, V, &want));
    for (int rep = 0; rep < 2; rep++)
        CHECK_OK(t->ops[GPU_SIDE]->cross_entropy_forward(t->state[GPU_SIDE], logits.d, targets.d, T, V, &got[rep]));
    test_tolerance_check_scalar("cross entropy loss", "f32", got[0], want, "%s: cross entropy forward", label);
    CHECK(!memcmp(&got[0], &got[1], sizeof(double)), "%s: cross entropy: a second GPU run gives other bits", label);
    xent_ctx x = {T, V, 1.0f / (float)T, &logits, &targets};
    check_entry(t, label, run_xent_backward, &x,
                &(output){&logits, "cross entropy backward (in place)", "cross entropy backward", 1}, 1);
    pair_free(t, &logits);
    free(targets.h), test_gpu_free(t->gpu, targets.d);
}

/* The vocabulary-parallel cross-entropy's per-row parts (kernels/vocab_cross_entropy.h) on columns [first, first +
 * width) of a vocabulary of V, pieces of `piece` columns: the row maxima bitwise; from the CPU's maxima on both sides,
 * the piece sums (double sums of expf: the loss's row, at the worst element) and the target logits (bitwise); from the
 * CPU's maxima and denominators, backward in place under the cross-entropy backward's row. */
typedef struct {
    int T, width, piece, first;
    float scale;
    pair *logits, *max;
    int_pair *targets;
    double *z[2]; /* each side's denominators: the CPU's piece sums added */
} vocab_ctx;

static moe_status run_vocab_row_max(tables *t, int side, void *c) {
    vocab_ctx *v = c;
    return t->ops[side]->vocab_row_max(t->state[side], AT(side, v->logits), v->T, v->width, AT(side, v->max));
}

static moe_status run_vocab_backward(tables *t, int side, void *c) {
    vocab_ctx *v = c;
    return t->ops[side]->vocab_backward(t->state[side], AT(side, v->logits), AT(side, v->max), v->z[side],
                                        AT(side, v->targets), v->T, v->width, v->first, v->scale);
}

static void test_vocab_cross_entropy(tables *t, const char *label, int T, int V, int first, int width, int piece) {
    pair logits = pair_random(t, (size_t)T * width, 4), max = pair_random(t, (size_t)T, 1);
    int_pair targets = ints_random(t, (size_t)T, V);
    vocab_ctx v = {T, width, piece, first, 1.0f / (float)T, &logits, &max, &targets, {NULL, NULL}};
    check_entry(t, label, run_vocab_row_max, &v, &(output){&max, "vocab row max", NULL, 0}, 1);
    CHECK_OK(moe_gpu_upload(t->gpu, max.d, max.h, (size_t)T * sizeof(float)));
    const size_t ns = (size_t)T * (width / piece), nbytes = (ns + (size_t)T) * sizeof(double);
    double *cpu = calloc(ns + (size_t)T, sizeof(double)), *gpu = calloc(ns + (size_t)T, sizeof(double));
    CHECK(cpu && gpu, "out of memory");
    double *dev = test_gpu_upload(t->gpu, gpu, nbytes); /* [sums | target] */
    CHECK_OK(t->ops[CPU_SIDE]->vocab_piece_sums(t->state[CPU_SIDE], logits.h, max.h, targets.h, T, width, piece, first,
                                                cpu, cpu + ns));
    CHECK_OK(t->ops[GPU_SIDE]->vocab_piece_sums(t->state[GPU_SIDE], logits.d, max.d, targets.d, T, width, piece,
                                                first, dev, dev + ns));
    test_gpu_download(t->gpu, gpu, dev, nbytes);
    size_t worst = 0;
    for (size_t i = 1; i < ns; i++)
        if (fabs(gpu[i] - cpu[i]) / cpu[i] > fabs(gpu[worst] - cpu[worst]) / cpu[worst]) worst = i;
    test_tolerance_check_scalar("cross entropy loss", "f32", gpu[worst], cpu[worst],
                                "%s: vocab piece sum (the worst of %zu)", label, ns);
    CHECK(!memcmp(gpu + ns, cpu + ns, (size_t)T * sizeof(double)), "%s: vocab target logits differ", label);
    double *z = calloc((size_t)T, sizeof(double));
    CHECK(z != NULL, "out of memory");
    for (int tok = 0; tok < T; tok++)
        for (int j = 0; j < width / piece; j++) z[tok] += cpu[(size_t)j * T + tok];
    v.z[CPU_SIDE] = z, v.z[GPU_SIDE] = test_gpu_upload(t->gpu, z, (size_t)T * sizeof(double));
    check_entry(t, label, run_vocab_backward, &v,
                &(output){&logits, "vocab backward (in place)", "cross entropy backward", 1}, 1);
    test_gpu_free(t->gpu, dev), test_gpu_free(t->gpu, v.z[GPU_SIDE]);
    free(cpu), free(gpu), free(z);
    pair_free(t, &logits), pair_free(t, &max);
    free(targets.h), test_gpu_free(t->gpu, targets.d);
}

/* ---- the configurations ---- */

typedef struct {
    int num_seqs, S, d, H, KV, d_ff, V;
} model_shape;

static void test_configuration(moe_runtime *cpu_rt, moe_runtime *gpu_rt, moe_precision precision,
                               int layout_invariant, const model_shape *m) {
    const int hd = m->d / m->H, T = m->num_seqs * m->S;
    const int widest = m->V > m->d_ff ? m->V : m->d_ff;
    const int bf16 = precision == MOE_PRECISION_BF16;
    tables t = {{&moe_dense_ops_cpu, &moe_dense_ops_cuda}, {NULL, NULL}, moe_runtime_gpu(gpu_rt), bf16 ? "bf16" : "f32",
                layout_invariant, bf16, moe_rng_seeded((uint64_t)(1000 * T + 10 * precision + layout_invariant))};
    CHECK_OK(t.ops[CPU_SIDE]->create(cpu_rt, layout_invariant, precision, widest, &t.state[CPU_SIDE]));
    CHECK_OK(t.ops[GPU_SIDE]->create(gpu_rt, layout_invariant, precision, widest, &t.state[GPU_SIDE]));
    if (!t.state[CPU_SIDE] || !t.state[GPU_SIDE]) return;
    char label[96];
    snprintf(label, sizeof label, "T %d %s blocks %d", T, moe_precision_name(precision), layout_invariant);
    test_embedding(&t, label, T, m->d, m->V, 0, m->V);
    test_embedding(&t, label, T, m->d, m->V, m->V / 8, m->V / 4); /* a block of the vocabulary */
    test_rmsnorm(&t, label, T, m->d);
    test_linear(&t, label, T, m->d, m->H * hd);      /* q */
    test_linear(&t, label, T, m->d, m->KV * hd);     /* k, v */
    test_linear(&t, label, T, m->d, m->V);           /* lm_head */
    test_rope_attention(&t, label, m->num_seqs, m->S, m->H, m->KV, hd);
    test_attention_fused(&t, label, m->num_seqs, m->S, m->H, m->KV, hd);
    test_attention_fused(&t, label, 2, 150, m->H, m->KV, hd); /* several tiles of keys and of rows, and tails */
    if (bf16)
        for (int flash_hd = 32; flash_hd <= 128; flash_hd *= 2) { /* the tensor-core kernels' tile plans */
            test_attention_fused(&t, label, 2, 150, 4, 2, flash_hd);
            test_attention_fused(&t, label, 1, 300, 2, 1, flash_hd);
            test_attention_neighbours(&t, label, 200, 4, 2, flash_hd);
        }
    test_swiglu(&t, label, T, m->d, m->d_ff);
    test_swiglu_act(&t, label, (size_t)T * m->d_ff);
    test_cross_entropy(&t, label, T, m->V);
    test_vocab_cross_entropy(&t, label, T, m->V, 0, m->V, m->V / 4);         /* the whole vocabulary, 4 pieces */
    test_vocab_cross_entropy(&t, label, T, m->V, m->V / 4, m->V / 4, m->V / 20); /* a rank's block, 5 pieces */
    test_vectors(&t, label, (size_t)100003);
    t.ops[CPU_SIDE]->destroy(t.state[CPU_SIDE]);
    t.ops[GPU_SIDE]->destroy(t.state[GPU_SIDE]);
}

int main(void) {
    if (test_gpu_device_count("test_gpu_dense_table") == 0) {
        printf("test_gpu_dense_table: skip: no CUDA device on this machine\n");
        return TEST_SKIP;
    }
    moe_runtime *cpu_rt = NULL, *gpu_rt = NULL;
    CHECK_OK(moe_runtime_create_cpu(&cpu_rt));
    CHECK_OK(moe_runtime_create_cuda(0, &gpu_rt));
    if (!cpu_rt || !gpu_rt) return test_finish("test_gpu_dense_table");
    CHECK(moe_runtime_dense_ops(gpu_rt) == &moe_dense_ops_cuda, "the CUDA runtime does not hand out the CUDA table");
    const model_shape shapes[] = {{2, 37, 48, 4, 2, 80, 100}, {1, 1, 48, 4, 2, 80, 100}};
    const struct {
        moe_precision precision;
        int layout_invariant;
    } configs[] = {{MOE_PRECISION_FP32, 0}, {MOE_PRECISION_FP32, 1}, {MOE_PRECISION_BF16, 1}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (size_t c = 0; c < sizeof configs / sizeof *configs; c++)
            test_configuration(cpu_rt, gpu_rt, configs[c].precision, configs[c].layout_invariant, &shapes[s]);
    moe_runtime_destroy(gpu_rt);
    moe_runtime_destroy(cpu_rt);
    return test_finish("test_gpu_dense_table");
}
