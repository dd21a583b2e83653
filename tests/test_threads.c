/* test_threads.c — the thread count never changes a bit (core/threads.h, docs/DETERMINISM.md). Every
 * threaded CPU kernel (router scores, top-k, gates and their backward, the aux and z-loss backward, permute,
 * combine and its backward, RMSNorm, RoPE, attention, cross-entropy, embedding, AdamW, the non-finite search)
 * and the whole MoE layer forward and backward run on the same inputs with 1, 2 and 3 OpenMP threads; every
 * output is compared with memcmp. Sizes are above MOE__PAR_MIN_ELEMS so that the loops do split.
 * Run: meson test -C build test_threads (suite unit). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/threads.h"
#include "kernels/adamw.h"
#include "kernels/attention.h"
#include "kernels/cross_entropy.h"
#include "kernels/embedding.h"
#include "kernels/nonfinite.h"
#include "kernels/permute.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "moe/layer_internal.h"
#include "router/aux_loss.h"
#include "router/gates.h"
#include "router/scores.h"
#include "router/topk.h"
#include "tests/test_util.h"

enum { T = 4096, D = 64, E = 16, K = 2, V = 96, SEQS = 8, S = 512 / SEQS, H = 4, KV = 2, HD = 16 };
enum { LT = 1024, LD = 64, LF = 256, LE = 8 }; /* the layer: experts get ~256 rows of 256 */

/* Outputs go to one zeroed arena, in the same order on every run, so one memcmp compares them all. */
typedef struct {
    unsigned char *base;
    size_t used, cap;
} arena;
static void *take(arena *a, size_t nbytes) {
    nbytes = (nbytes + 63) / 64 * 64;
    if (a->used + nbytes > a->cap) abort();
    void *p = a->base + a->used;
    a->used += nbytes;
    return p;
}
#define TAKE(a, type, count) ((type *)take(a, (size_t)(count) * sizeof(type)))

typedef struct {
    moe_real *x, *logits, *w, *dy, *q, *k, *v, *dout, *table, *grad, *param, *lx, *ldout;
    int *tokens, *perm, *targets;
} inputs;

static void kernels(const inputs *in, arena *a) {
    /* router */
    moe_real *scores = TAKE(a, moe_real, T * E), *dscores = TAKE(a, moe_real, T * E);
    moe_real *dlogits = TAKE(a, moe_real, T * E), *expert_score = TAKE(a, moe_real, T * K);
    moe_real *gate = TAKE(a, moe_real, T * K), *dgate = TAKE(a, moe_real, T * K);
    int *expert = TAKE(a, int, T * K), num_selected[E] = {0};
    moe_router_scores_cpu(MOE_SCORE_SOFTMAX, in->logits, T, E, scores);
    moe_router_topk_cpu(scores, T, E, K, expert);
    for (int i = 0; i < T * K; i++) num_selected[expert[i]]++, dgate[i] = in->dy[i];
    moe_router_gates_cpu(scores, expert, T, E, K, 1, 1, expert_score, gate);
    moe_router_gates_backward_cpu(scores, expert, dgate, T, E, K, 1, 1, dscores);
    moe_router_load_balance_loss_backward_cpu(MOE_SCORE_SIGMOID, scores, num_selected, T, T, E, K, 0.01f, dscores);
    moe_router_scores_backward_cpu(MOE_SCORE_SOFTMAX, scores, dscores, T, E, dlogits);
    moe_router_z_loss_backward_cpu(in->logits, T, T, E, 0.001f, dlogits);
    /* permute and combine: slot t * K + j holds assignment (t, j); every fifth one dropped */
    int *slot = TAKE(a, int, T * K);
    for (int i = 0; i < T * K; i++) slot[i] = i % 5 == 3 ? -1 : i;
    moe_real *xp = TAKE(a, moe_real, (size_t)T * K * D), *out = TAKE(a, moe_real, (size_t)T * D);
    moe_real *dyp = TAKE(a, moe_real, (size_t)T * K * D), *dg = TAKE(a, moe_real, T * K);
    moe_permute_rows_cpu(in->x, in->perm, T * K, D, xp);
    moe_combine_rows_cpu(xp, slot, gate, T, K, D, out);
    moe_combine_rows_backward_cpu(in->dy, xp, slot, gate, T, K, D, dyp, dg);
    /* norms, rope, attention (on the first 512 tokens), losses, embedding, AdamW */
    moe_real *y = TAKE(a, moe_real, (size_t)T * D), *rstd = TAKE(a, moe_real, T);
    moe_real *dx = TAKE(a, moe_real, (size_t)T * D), *dw = TAKE(a, moe_real, D);
    moe_rmsnorm_forward_cpu(in->x, in->w, T, D, 1e-5f, y, rstd);
    moe_rmsnorm_backward_cpu(in->x, in->w, rstd, in->dy, T, D, dx, dw);
    const size_t nq = (size_t)SEQS * S * H * HD, nkv = (size_t)SEQS * S * KV * HD;
    moe_real *q = TAKE(a, moe_real, nq), *att = TAKE(a, moe_real, (size_t)SEQS * H * S * S);
    moe_real *ao = TAKE(a, moe_real, nq), *dq = TAKE(a, moe_real, nq), *dk = TAKE(a, moe_real, nkv);
    moe_real *dv = TAKE(a, moe_real, nkv), *scratch = malloc((size_t)moe_threads_get() * S * S * sizeof(moe_real));
    memcpy(q, in->q, nq * sizeof(moe_real));
    const moe_rope rope = {10000, 4, 64, 32, 1, 1.1386}; /* YaRN's (Qwen3's factor 4 and its amplitude) */
    moe_rope_forward_cpu(q, SEQS, S, H, HD, &rope);
    moe_attention_forward_cpu(q, in->k, in->v, SEQS, S, H, KV, HD, att, ao);
    moe_attention_backward_cpu(q, in->k, in->v, att, in->dout, SEQS, S, H, KV, HD, dq, dk, dv, scratch);
    moe_rope_backward_cpu(dq, SEQS, S, H, HD, &rope);
    free(scratch);
    double *loss = TAKE(a, double, 1);
    moe_real *l = TAKE(a, moe_real, (size_t)T * V);
    memcpy(l, in->table, (size_t)T * V * sizeof(moe_real));
    *loss = moe_cross_entropy_forward_cpu(l, in->targets, T, V);
    moe_cross_entropy_backward_cpu(l, in->targets, T, V, 1.0f / T);
    moe_real *emb = TAKE(a, moe_real, (size_t)T * D), *dtable = TAKE(a, moe_real, (size_t)V * D);
    moe_embedding_forward_cpu(in->table, in->tokens, T, D, emb);
    moe_embedding_backward_cpu(in->dy, in->tokens, T, D, dtable);
    const size_t np = (size_t)T * D;
    moe_real *param = TAKE(a, moe_real, np), *m = TAKE(a, moe_real, np), *v = TAKE(a, moe_real, np);
    memcpy(param, in->param, np * sizeof(moe_real));
    const moe_adamw_params hp = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                                 .weight_decay = 0.1f, .step = 3};
    for (int step = 0; step < 2; step++) moe_adamw_update_cpu(param, in->grad, m, v, np, &hp);
    long long *first = TAKE(a, long long, 2);
    first[0] = moe_find_nonfinite_cpu(in->x, np);
    param[np - 7] = param[np / 3] = NAN;
    first[1] = moe_find_nonfinite_cpu(param, np);
    CHECK(first[0] == -1 && first[1] == (long long)(np / 3), "non-finite search: %lld, %lld", first[0], first[1]);
}

static void layer(const moe_config *cfg, const test_weights *tw, const inputs *in, arena *a) {
    moe_layer *L;
    CHECK_OK(moe_layer_create(cfg, NULL, NULL, &L));
    test_weights g = test_weights_zero(cfg, 1);
    moe_real *out = TAKE(a, moe_real, (size_t)LT * LD), *dx = TAKE(a, moe_real, (size_t)LT * LD);
    CHECK_OK(moe_layer_forward(L, &tw->w, in->lx, LT, out, NULL));
    CHECK_OK(moe_layer_backward(L, &tw->w, in->ldout, dx, &g.w));
    const size_t n = moe_layer_num_params(cfg, 1);
    memcpy(TAKE(a, moe_real, n), g.buffer, n * sizeof(moe_real));
    const moe_token_routing *r = moe__layer_token_routing(L);
    memcpy(TAKE(a, int, LT * K), r->expert, LT * K * sizeof(int));
    test_weights_free(&g);
    moe_layer_destroy(L);
}

int main(void) {
    moe_rng rng = moe_rng_seeded(2024);
    inputs in;
    in.x = test_alloc_uniform(&rng, (size_t)T * D, 1), in.logits = test_alloc_uniform(&rng, T * E, 3);
    in.w = test_alloc_uniform(&rng, D, 1), in.dy = test_alloc_uniform(&rng, (size_t)T * K * D, 1);
    in.q = test_alloc_uniform(&rng, (size_t)SEQS * S * H * HD, 1);
    in.k = test_alloc_uniform(&rng, (size_t)SEQS * S * KV * HD, 1);
    in.v = test_alloc_uniform(&rng, (size_t)SEQS * S * KV * HD, 1);
    in.dout = test_alloc_uniform(&rng, (size_t)SEQS * S * H * HD, 1);
    in.table = test_alloc_uniform(&rng, (size_t)T * V, 4), in.grad = test_alloc_uniform(&rng, (size_t)T * D, 1);
    in.param = test_alloc_uniform(&rng, (size_t)T * D, 1);
    in.lx = test_alloc_uniform(&rng, (size_t)LT * LD, 1), in.ldout = test_alloc_uniform(&rng, (size_t)LT * LD, 1);
    in.tokens = malloc(T * sizeof(int)), in.targets = malloc(T * sizeof(int)), in.perm = malloc(T * K * sizeof(int));
    for (int t = 0; t < T; t++) in.tokens[t] = (int)(moe_rng_next(&rng) % V), in.targets[t] = (t * 7) % V;
    for (int i = 0; i < T * K; i++) in.perm[i] = (int)(moe_rng_next(&rng) % T);
    moe_config cfg = moe_config_default(LD, LF, LE, K);
    test_weights tw = test_weights_random(&cfg, 1, &rng);

    const size_t cap = (size_t)64 << 20;
    arena runs[3];
    for (int i = 0; i < 3; i++) {
        moe_threads_set(i + 1);
        CHECK(moe_threads_get() == i + 1, "asked for %d threads, got %d", i + 1, moe_threads_get());
        runs[i] = (arena){calloc(cap, 1), 0, cap};
        if (!runs[i].base) abort();
        kernels(&in, &runs[i]);
        size_t kernels_end = runs[i].used;
        layer(&cfg, &tw, &in, &runs[i]);
        if (i == 0) continue;
        CHECK(runs[i].used == runs[0].used, "outputs of %zu bytes, 1 thread %zu", runs[i].used, runs[0].used);
        CHECK(!memcmp(runs[i].base, runs[0].base, kernels_end), "%d threads: a kernel's output differs from 1 thread's",
              i + 1);
        CHECK(!memcmp(runs[i].base + kernels_end, runs[0].base + kernels_end, runs[0].used - kernels_end),
              "%d threads: the layer's outputs or gradients differ from 1 thread's", i + 1);
    }
    printf("1, 2 and 3 threads: %zu bytes of kernel and layer outputs compared, bitwise\n", runs[0].used);
    for (int i = 0; i < 3; i++) free(runs[i].base);
    moe_real *bufs[] = {in.x, in.logits, in.w, in.dy, in.q, in.k, in.v, in.dout, in.table, in.grad, in.param, in.lx,
                        in.ldout};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) free(bufs[i]);
    free(in.tokens), free(in.targets), free(in.perm);
    test_weights_free(&tw);
    return test_finish("test_threads");
}
