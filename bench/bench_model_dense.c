/* bench_model_dense.c — the dense path of moe-train's model at its shapes, and its optimizer step, on the CPU: the
 * two rates moe-plan takes beside bench_moe_layer's GEMM rate (--dense-us-per-token, --optimizer-ns-per-param;
 * docs/SCALING.md, scripts/plan_vs_measured.sh).
 *
 * Dense path: forward and backward of everything models/model.c runs except the MoE layers, in model.c's order,
 * through the same dense-ops table (moe/dense_ops.h) with the dense-ops state and weights of a real model of the
 * given shape (moe_model_create, moe_model_init_weights; the weights found by name in its tensor table):
 *   embedding; per layer RMSNorm, q/k/v projections, RoPE on q and k, causal attention (per sequence and head,
 *   the S x S probabilities kept), o projection, residual add, RMSNorm, the FFN, residual add; final RMSNorm,
 *   lm_head, cross-entropy.
 * The FFN is a dense SwiGLU on non-MoE layers (--moe-every > 1) and nothing on MoE layers, which bench_moe_layer
 * times; in backward a fixed gradient stands for the MoE layer's input gradient. model.c has no hook to leave its
 * MoE layers out, so this is a replay of its op sequence: a change to model.c's forward or backward is a change
 * here too.
 * With --shards S (moe-train's --world-invariant: default on, S as moe-train picks it for this batch) the loss and
 * every weight gradient are formed per shard of the batch and added in the fixed shard tree, as model.c does
 * (models/shard_grads.h); --shards 0 times one product over all rows.
 * Optimizer step: what moe-train does per step beside forward and backward (train/trainer.c: the zeroing in
 * run_micro_batches, then moe_trainer_apply), through models/optimizer.h on a world of one, so over every
 * parameter of the model (all E experts): zero the gradients, the global gradient norm, clipping (at 1, moe-train's
 * default), AdamW (moe-train's default hyperparameters), the weights checked finite.
 *
 * Per timed iteration (--iters, after --warmup untimed): forward, backward and optimizer ms; median and minimum.
 * Reported per token (the dense path: median fwd+bwd ms / (batch x seq_len) tokens) and per parameter (the
 * optimizer). Last line "json: {...}".
 *
 *   meson setup build --buildtype=release -Dcuda=disabled && ninja -C build bench/bench_model_dense
 *   build/bench/bench_model_dense [--batch 16 --seq-len 128 --layers 4 --d-model 128 --heads 4 --experts 8
 *       --threads 2 --warmup 2 --iters 7]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_util.h"
#include "core/rng.h"
#include "core/threads.h"
#include "models/optimizer.h"
#include "models/shard_grads.h"

typedef struct {
    int batch, seq_len, layers, d_model, heads, kv_heads, d_ff, vocab, experts, moe_every, tie_embeddings;
    int shards, threads, warmup, iters, seed;
} options;

static const bench_flag kFlags[] = {
    BENCH_INT("--batch", options, batch, 1, 1 << 20, "sequences per forward (moe-train's --batch / ranks)"),
    BENCH_INT("--seq-len", options, seq_len, 1, 1 << 20, "tokens per sequence"),
    BENCH_INT("--layers", options, layers, 1, 1024, "decoder layers"),
    BENCH_INT("--d-model", options, d_model, 2, 65536, "model width"),
    BENCH_INT("--heads", options, heads, 1, 1024, "attention heads (head_dim = d_model / heads, even)"),
    BENCH_INT("--kv-heads", options, kv_heads, 1, 1024, "key/value heads, divides --heads"),
    BENCH_INT("--d-ff", options, d_ff, 1, 1 << 20, "hidden width of the experts and of dense FFNs"),
    BENCH_INT("--vocab", options, vocab, 2, 65536, "vocabulary size"),
    BENCH_INT("--experts", options, experts, 1, 4096, "experts per MoE layer (the optimizer updates them all)"),
    BENCH_INT("--moe-every", options, moe_every, 1, 1024, "every n-th FFN is an MoE layer (others: dense SwiGLU)"),
    BENCH_INT("--tie-embeddings", options, tie_embeddings, 0, 1, "1: lm_head shares the embedding matrix"),
    BENCH_INT("--shards", options, shards, -1, 64, "virtual shards of the batch, summed in a fixed tree as "
              "moe-train's --world-invariant (0: off; -1: moe-train's default)"),
    BENCH_INT("--threads", options, threads, 0, 4096, "CPU threads (core/threads.h); 0: the CPUs this process may use"),
    BENCH_INT("--warmup", options, warmup, 0, 100000, "untimed iterations"),
    BENCH_INT("--iters", options, iters, 1, 100000, "timed iterations"),
    BENCH_INT("--seed", options, seed, 0, 1 << 30, "weights, tokens and the stand-in MoE gradient"),
};

/* moe-train's model config of these flags (its defaults for everything else: moe_model_config_default). The
 * router's k changes neither the dense path nor the parameter count: 2, or 1 with one expert. */
static moe_model_config config_of(const options *o) {
    moe_model_config c = moe_model_config_default();
    c.num_layers = o->layers, c.d_model = o->d_model, c.num_heads = o->heads, c.num_kv_heads = o->kv_heads;
    c.d_ff = o->d_ff, c.vocab_size = o->vocab, c.seq_len = o->seq_len, c.moe_every = o->moe_every;
    c.tie_embeddings = o->tie_embeddings;
    c.moe.num_experts = o->experts, c.moe.top_k = o->experts > 1 ? 2 : 1;
    c.moe.d_model = c.d_model, c.moe.d_ff = c.d_ff;
    return c;
}

static void check(const void *opt) {
    const options *o = opt;
    const moe_model_config c = config_of(o);
    const char *problem = moe_model_layout_problem(&c, 1, 1); /* one process */
    if (problem) bench_usage_errorf("the model these flags give is invalid: %s", problem);
    if (o->shards > 0 && ((o->shards & (o->shards - 1)) || o->batch % o->shards))
        bench_usage_errorf("--shards %d must be a power of two dividing --batch %d", o->shards, o->batch);
}

/* moe-train's default: the largest power of two dividing the batch, at most 64 (train/options.c) */
static int default_shards(int batch) {
    int shards = 1;
    while (shards < 64 && batch % (2 * shards) == 0) shards *= 2;
    return shards;
}

static const bench_cli kCli = {
    .name = "bench_model_dense",
    .synopsis = "bench_model_dense [flags]",
    .about = "forward + backward of moe-train's model without its MoE layers (embedding, attention, norms, RoPE,\n"
             "dense FFNs, lm_head, cross-entropy) and its optimizer step, per token and per parameter",
    .flags = kFlags,
    .num_flags = sizeof kFlags / sizeof kFlags[0],
    .notes = "CPU only, fp32 (moe-train's CPU default)",
    .check = check,
};

/* The weights of one layer (or the model's own), pointers into the parameter or the gradient buffer. */
typedef struct {
    moe_real *attn_norm, *wq, *wk, *wv, *wo, *ffn_norm;
    moe_layer_weights ffn; /* a dense layer's SwiGLU; unused on MoE layers */
} layer_weights;
typedef struct {
    moe_real *embedding, *final_norm, *lm_head;
    layer_weights *layers;
} weights;

/* Activations for T tokens (A = H hd, B = KV hd), as model.c keeps them. */
typedef struct {
    moe_real *ln1, *rstd1, *q, *k, *v, *att, *attn_y, *resid_mid, *ln2, *rstd2, *h1, *h3, *act;
} layer_acts;

typedef struct {
    moe_model_config cfg;
    moe_runtime *rt;
    moe_parallel *par;
    moe_model *model;
    const moe_dense_ops *ops;
    moe_dense_state *s;
    int seqs, T, A, B, hd;
    moe_rope rope;
    weights p, g;
    int *inputs, *targets;             /* host [T], uploaded every forward as model.c does */
    int *d_inputs, *d_targets;         /* the runtime's [T] */
    moe_real **resid;                  /* [L + 1] of [T, d] */
    layer_acts *acts;                  /* [L] */
    moe_real *lnf, *rstdf, *logits, *dresid, *dln, *tmp, *dq, *dk, *dv, *dattn;
    moe_real *moe_dx;                  /* [T, d]: stands for an MoE layer's input gradient */
    moe_real *moment1, *moment2;       /* AdamW's, over every parameter */
    moe_shard_grads sg;                /* the weight gradients: per shard, or over all rows (shards 0) */
} bench;

static void *rt_alloc(bench *b, size_t count, size_t size) {
    void *p;
    bench_check(moe_runtime_alloc(b->rt, (count ? count : 1) * size, &p), "moe_runtime_alloc");
    return p;
}
static moe_real *reals(bench *b, size_t count) { return rt_alloc(b, count, sizeof(moe_real)); }

/* The dense tensor of `layer` (-1: the embedding; L: the final norm and lm_head) whose name ends in suffix. */
static moe_real *tensor(bench *b, moe_real *base, int layer, const char *suffix) {
    int count;
    const moe_model_tensor *t = moe_model_tensors(b->model, &count);
    const size_t n = strlen(suffix);
    for (int i = 0; i < count; i++) {
        const size_t len = strlen(t[i].name);
        if (!t[i].experts && t[i].layer == layer && len >= n && !strcmp(t[i].name + len - n, suffix))
            return base + t[i].offset;
    }
    bench_fail("the model has no tensor %s in layer %d", suffix, layer);
}

static void views(bench *b, moe_real *base, weights *w) {
    const int L = b->cfg.num_layers;
    w->embedding = tensor(b, base, -1, "embed_tokens.weight");
    w->final_norm = tensor(b, base, L, "model.norm.weight");
    w->lm_head = b->cfg.tie_embeddings ? w->embedding : tensor(b, base, L, "lm_head.weight");
    w->layers = calloc(L, sizeof *w->layers);
    if (!w->layers) bench_fail("out of memory");
    for (int l = 0; l < L; l++) {
        layer_weights *lw = &w->layers[l];
        lw->attn_norm = tensor(b, base, l, "input_layernorm.weight");
        lw->wq = tensor(b, base, l, "q_proj.weight"), lw->wk = tensor(b, base, l, "k_proj.weight");
        lw->wv = tensor(b, base, l, "v_proj.weight"), lw->wo = tensor(b, base, l, "o_proj.weight");
        lw->ffn_norm = tensor(b, base, l, "post_attention_layernorm.weight");
        if (moe_model_layer_is_moe(&b->cfg, l)) continue;
        lw->ffn.w1 = tensor(b, base, l, "mlp.gate_proj.weight"), lw->ffn.w3 = tensor(b, base, l, "mlp.up_proj.weight");
        lw->ffn.w2 = tensor(b, base, l, "mlp.down_proj.weight");
    }
}

static void setup(bench *b, const options *o) {
    b->cfg = config_of(o);
    const moe_model_config *c = &b->cfg;
    bench_check(moe_runtime_create_cpu(&b->rt), "moe_runtime_create_cpu");
    bench_check(moe_parallel_create_self(&b->par), "moe_parallel_create_self");
    /* one sequence: the model's own activations go unused, only its weights, tensor table and dense-ops state */
    bench_check(moe_model_create(c, b->rt, b->par, 1, 1, &b->model), "moe_model_create");
    bench_check(moe_model_init_weights(b->model, (unsigned long long)o->seed), "moe_model_init_weights");
    b->ops = moe_model_dense_ops(b->model, &b->s);
    views(b, moe_model_params(b->model), &b->p);
    views(b, moe_model_grads(b->model), &b->g);

    const int L = c->num_layers, d = c->d_model, S = c->seq_len, V = c->vocab_size, F = c->d_ff;
    b->seqs = o->batch, b->T = o->batch * S, b->hd = moe_model_head_dim(c), b->rope = moe_model_rope(c);
    b->A = c->num_heads * b->hd, b->B = c->num_kv_heads * b->hd;
    const size_t T = (size_t)b->T, Td = T * d;
    b->inputs = malloc(T * sizeof *b->inputs), b->targets = malloc(T * sizeof *b->targets);
    if (!b->inputs || !b->targets) bench_fail("out of memory");
    moe_rng rng = moe_rng_seeded((unsigned long long)o->seed + 1);
    for (size_t t = 0; t < T; t++)
        b->inputs[t] = (int)(moe_rng_next(&rng) % (unsigned)V), b->targets[t] = (int)(moe_rng_next(&rng) % (unsigned)V);
    b->d_inputs = rt_alloc(b, T, sizeof(int)), b->d_targets = rt_alloc(b, T, sizeof(int));
    b->resid = calloc(L + 1, sizeof *b->resid), b->acts = calloc(L, sizeof *b->acts);
    if (!b->resid || !b->acts) bench_fail("out of memory");
    for (int l = 0; l <= L; l++) b->resid[l] = reals(b, Td);
    for (int l = 0; l < L; l++) {
        layer_acts *a = &b->acts[l];
        a->ln1 = reals(b, Td), a->rstd1 = reals(b, T), a->q = reals(b, T * b->A), a->k = reals(b, T * b->B);
        a->v = reals(b, T * b->B), a->att = reals(b, (size_t)b->seqs * c->num_heads * S * S);
        a->attn_y = reals(b, T * b->A), a->resid_mid = reals(b, Td), a->ln2 = reals(b, Td), a->rstd2 = reals(b, T);
        if (moe_model_layer_is_moe(c, l)) continue;
        a->h1 = reals(b, T * F), a->h3 = reals(b, T * F), a->act = reals(b, T * F);
    }
    b->lnf = reals(b, Td), b->rstdf = reals(b, T), b->logits = reals(b, T * V);
    b->dresid = reals(b, Td), b->dln = reals(b, Td), b->tmp = reals(b, Td);
    b->dq = reals(b, T * b->A), b->dk = reals(b, T * b->B), b->dv = reals(b, T * b->B), b->dattn = reals(b, T * b->A);
    /* the stand-in MoE input gradient: of the scale of the real one (1/T of the loss per token, times O(1)) */
    moe_real *host = malloc(Td * sizeof *host);
    if (!host) bench_fail("out of memory");
    moe_rng_fill_uniform(&rng, host, Td, 1.0 / (double)T);
    b->moe_dx = reals(b, Td);
    bench_check(moe_runtime_upload(b->rt, b->moe_dx, host, Td * sizeof *host), "moe_runtime_upload");
    free(host);
    const size_t P = moe_model_num_dense(b->model) + moe_model_num_expert(b->model);
    b->moment1 = reals(b, P), b->moment2 = reals(b, P);
    bench_check(moe_shard_grads_init(&b->sg, b->rt, b->ops, b->s, o->shards,
                                     o->shards ? moe_shard_grads_max_count(c) : 0), "moe_shard_grads_init");
}

static void teardown(bench *b) {
    const int L = b->cfg.num_layers;
    for (int l = 0; l < L; l++) {
        layer_acts *a = &b->acts[l];
        moe_real *all[] = {a->ln1, a->rstd1, a->q, a->k, a->v, a->att, a->attn_y, a->resid_mid, a->ln2, a->rstd2,
                           a->h1, a->h3, a->act};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++) moe_runtime_free(b->rt, all[i]);
    }
    for (int l = 0; l <= L; l++) moe_runtime_free(b->rt, b->resid[l]);
    void *bufs[] = {b->d_inputs, b->d_targets, b->lnf, b->rstdf, b->logits, b->dresid, b->dln, b->tmp, b->dq, b->dk,
                    b->dv, b->dattn, b->moe_dx, b->moment1, b->moment2};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) moe_runtime_free(b->rt, bufs[i]);
    moe_shard_grads_free(&b->sg);
    free(b->resid), free(b->acts), free(b->inputs), free(b->targets), free(b->p.layers), free(b->g.layers);
    moe_model_destroy(b->model);
    moe_parallel_destroy(b->par);
    moe_runtime_destroy(b->rt);
}

/* model.c's moe_model_forward without the MoE layers (their output: whatever tmp holds, added as theirs is). */
static void forward(bench *b, double *loss_sum) {
    const moe_model_config *c = &b->cfg;
    const moe_dense_ops *ops = b->ops;
    moe_dense_state *s = b->s;
    const int S = c->seq_len, T = b->T, d = c->d_model, V = c->vocab_size, H = c->num_heads, KV = c->num_kv_heads;
    const int hd = b->hd, A = b->A, B = b->B, n = b->seqs;
    const size_t Td = (size_t)T * d;
    bench_check(moe_runtime_upload(b->rt, b->d_inputs, b->inputs, (size_t)T * sizeof(int)), "upload");
    bench_check(ops->embedding_forward(s, b->p.embedding, b->d_inputs, T, d, 0, c->vocab_size, b->resid[0]),
                "embedding_forward");
    for (int l = 0; l < c->num_layers; l++) {
        const layer_weights *w = &b->p.layers[l];
        layer_acts *a = &b->acts[l];
        bench_check(ops->rmsnorm_forward(s, b->resid[l], w->attn_norm, T, d, c->norm_eps, a->ln1, a->rstd1), "rmsnorm");
        bench_check(ops->linear_forward(s, a->ln1, w->wq, T, d, A, a->q), "q_proj");
        bench_check(ops->linear_forward(s, a->ln1, w->wk, T, d, B, a->k), "k_proj");
        bench_check(ops->linear_forward(s, a->ln1, w->wv, T, d, B, a->v), "v_proj");
        bench_check(ops->rope_forward(s, a->q, n, S, H, hd, &b->rope), "rope q");
        bench_check(ops->rope_forward(s, a->k, n, S, KV, hd, &b->rope), "rope k");
        bench_check(ops->attention_forward(s, a->q, a->k, a->v, n, S, H, KV, hd, a->att, a->attn_y), "attention");
        bench_check(ops->linear_forward(s, a->attn_y, w->wo, T, A, d, b->tmp), "o_proj");
        bench_check(ops->add(s, b->resid[l], b->tmp, Td, a->resid_mid), "add");
        bench_check(ops->rmsnorm_forward(s, a->resid_mid, w->ffn_norm, T, d, c->norm_eps, a->ln2, a->rstd2), "rmsnorm");
        if (!moe_model_layer_is_moe(c, l))
            bench_check(ops->swiglu_forward(s, &w->ffn, T, d, c->d_ff, a->ln2, a->h1, a->h3, a->act, b->tmp), "swiglu");
        bench_check(ops->add(s, a->resid_mid, b->tmp, Td, b->resid[l + 1]), "add");
    }
    bench_check(ops->rmsnorm_forward(s, b->resid[c->num_layers], b->p.final_norm, T, d, c->norm_eps, b->lnf, b->rstdf),
                "final rmsnorm");
    bench_check(ops->linear_forward(s, b->lnf, b->p.lm_head, T, d, V, b->logits), "lm_head");
    bench_check(moe_runtime_upload(b->rt, b->d_targets, b->targets, (size_t)T * sizeof(int)), "upload");
    bench_check(moe_shard_grads_loss(&b->sg, b->logits, b->d_targets, T, V, loss_sum), "moe_shard_grads_loss");
}

/* model.c's moe_model_backward without the MoE layers: on an MoE layer moe_dx is dL/dln2. */
static void backward(bench *b, moe_real loss_scale) {
    const moe_model_config *c = &b->cfg;
    const moe_dense_ops *ops = b->ops;
    moe_dense_state *s = b->s;
    const int S = c->seq_len, T = b->T, d = c->d_model, V = c->vocab_size, H = c->num_heads, KV = c->num_kv_heads;
    const int hd = b->hd, A = b->A, B = b->B, n = b->seqs;
    moe_shard_grads *sg = &b->sg;
    sg->num_tokens = T;
    bench_check(ops->cross_entropy_backward(s, b->logits, b->d_targets, T, V, loss_scale), "cross_entropy_backward");
    bench_check(moe_shard_grads_linear(sg, b->logits, b->lnf, d, V, b->g.lm_head), "lm_head dW");
    bench_check(ops->linear_backward_input(s, b->logits, b->p.lm_head, T, d, V, 0, b->dln), "lm_head dx");
    bench_check(moe_runtime_zero(b->rt, b->dresid, (size_t)T * d * sizeof(moe_real)), "zero");
    bench_check(moe_shard_grads_rmsnorm(sg, b->resid[c->num_layers], b->p.final_norm, b->rstdf, b->dln, d, b->dresid,
                                        b->g.final_norm), "final rmsnorm backward");
    for (int l = c->num_layers - 1; l >= 0; l--) {
        const layer_weights *w = &b->p.layers[l];
        layer_weights *gw = &b->g.layers[l];
        layer_acts *a = &b->acts[l];
        const moe_real *dln2 = b->moe_dx;
        if (!moe_model_layer_is_moe(c, l)) {
            bench_check(moe_shard_grads_swiglu(sg, &w->ffn, &gw->ffn, d, c->d_ff, a->ln2, a->h1, a->h3, a->act, b->dresid,
                                               b->dln), "swiglu backward");
            dln2 = b->dln;
        }
        bench_check(moe_shard_grads_rmsnorm(sg, a->resid_mid, w->ffn_norm, a->rstd2, dln2, d, b->dresid, gw->ffn_norm),
                    "rmsnorm backward");
        bench_check(moe_shard_grads_linear(sg, b->dresid, a->attn_y, A, d, gw->wo), "o_proj dW");
        bench_check(ops->linear_backward_input(s, b->dresid, w->wo, T, A, d, 0, b->dattn), "o_proj dx");
        bench_check(
            ops->attention_backward(s, a->q, a->k, a->v, a->att, b->dattn, n, S, H, KV, hd, b->dq, b->dk, b->dv),
            "attention backward");
        bench_check(ops->rope_backward(s, b->dq, n, S, H, hd, &b->rope), "rope backward q");
        bench_check(ops->rope_backward(s, b->dk, n, S, KV, hd, &b->rope), "rope backward k");
        bench_check(moe_shard_grads_linear(sg, b->dq, a->ln1, d, A, gw->wq), "q_proj dW");
        bench_check(moe_shard_grads_linear(sg, b->dk, a->ln1, d, B, gw->wk), "k_proj dW");
        bench_check(moe_shard_grads_linear(sg, b->dv, a->ln1, d, B, gw->wv), "v_proj dW");
        bench_check(ops->linear_backward_input(s, b->dq, w->wq, T, d, A, 0, b->dln), "q_proj dx");
        bench_check(ops->linear_backward_input(s, b->dk, w->wk, T, d, B, 1, b->dln), "k_proj dx");
        bench_check(ops->linear_backward_input(s, b->dv, w->wv, T, d, B, 1, b->dln), "v_proj dx");
        bench_check(
            moe_shard_grads_rmsnorm(sg, b->resid[l], w->attn_norm, a->rstd1, b->dln, d, b->dresid, gw->attn_norm),
            "rmsnorm backward");
    }
    bench_check(moe_shard_grads_embedding(sg, b->dresid, b->d_inputs, d, 0, V, b->g.embedding), "embedding backward");
}

/* moe_trainer_apply's arithmetic on a world of one: norm, clip at 1, AdamW at moe-train's defaults, finite check. */
static void optimizer_step(bench *b, int step, double *grad_norm) {
    bench_check(moe_model_grad_norm(b->model, b->par, grad_norm), "moe_model_grad_norm");
    const moe_adamw_params hp = {.lr = 3e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                                 .step = step, .clip_factor = moe_model_clip_factor(*grad_norm, 1.0f)};
    bench_check(moe_model_adamw_step(b->model, b->moment1, b->moment2, &hp), "moe_model_adamw_step");
    bench_check(moe_model_check_finite(b->model, moe_model_params(b->model), "the weights"), "the update");
}

/* GEMM FLOPs of one dense fwd+bwd per token (3 x forward): 2 x the projections' and lm_head's weights, dense FFNs,
 * and the attention's 2 S x S x hd products per head (the whole matrix, as the kernel computes it). */
static double flops_per_token(const bench *b) {
    const moe_model_config *c = &b->cfg;
    double dense_ffn_layers = 0;
    for (int l = 0; l < c->num_layers; l++) dense_ffn_layers += !moe_model_layer_is_moe(c, l);
    const double d = c->d_model, L = c->num_layers;
    const double matmul = L * (2.0 * d * b->A + 2.0 * d * b->B) + dense_ffn_layers * 3 * d * c->d_ff +
                          (double)c->vocab_size * d;
    return 3 * (2 * matmul + 4.0 * L * b->A * c->seq_len);
}

enum { SERIES_FORWARD, SERIES_BACKWARD, SERIES_DENSE, SERIES_OPTIMIZER, NUM_SERIES };
static const char *const kSeries[NUM_SERIES] = {"forward_ms", "backward_ms", "dense_ms", "optimizer_ms"};

int main(int argc, char **argv) {
    options o = {.batch = 16, .seq_len = 128, .layers = 4, .d_model = 128, .heads = 4, .kv_heads = 4, .d_ff = 256,
                 .vocab = 256, .experts = 8, .moe_every = 1, .tie_embeddings = 0, .shards = -1, .threads = 0,
                 .warmup = 2, .iters = 7, .seed = 0x5eed};
    bench_parse_flags(&kCli, argc, argv, &o); /* --help, --dry-run and usage errors leave here */
    if (o.shards < 0) o.shards = default_shards(o.batch);
    if (o.threads == 0) o.threads = moe_threads_default();
    moe_threads_set(o.threads);
    bench b = {0};
    setup(&b, &o);
    const size_t P = moe_model_num_dense(b.model) + moe_model_num_expert(b.model);
    const int N = o.iters;
    double *series = malloc((size_t)NUM_SERIES * N * sizeof *series), loss_sum = 0, grad_norm = 0;
    if (!series) bench_fail("out of memory");
    const moe_real scale = (moe_real)(1.0 / b.T); /* the mean over the step's tokens, as moe-train scales */
    for (int it = -o.warmup; it < N; it++) {
        const double t0 = bench_now_ms();
        bench_check(moe_model_zero_grads(b.model), "moe_model_zero_grads");
        const double t1 = bench_now_ms();
        forward(&b, &loss_sum);
        const double t2 = bench_now_ms();
        backward(&b, scale);
        const double t3 = bench_now_ms();
        optimizer_step(&b, it + o.warmup + 1, &grad_norm);
        const double t4 = bench_now_ms();
        if (it < 0) continue;
        const double v[NUM_SERIES] = {t2 - t1, t3 - t2, t3 - t1, (t1 - t0) + (t4 - t3)};
        for (int s = 0; s < NUM_SERIES; s++) series[(size_t)s * N + it] = v[s];
    }
    double median[NUM_SERIES], least[NUM_SERIES];
    for (int s = 0; s < NUM_SERIES; s++)
        least[s] = bench_min(series + (size_t)s * N, N), median[s] = bench_median(series + (size_t)s * N, N);
    free(series);

    const moe_model_config *c = &b.cfg;
    const double flop = flops_per_token(&b) * b.T;
    const double us_per_token = median[SERIES_DENSE] * 1e3 / b.T;
    const double ns_per_param = median[SERIES_OPTIMIZER] * 1e6 / (double)P;
    printf("shape: batch=%d S=%d (T=%d) L=%d d=%d H=%d KV=%d d_ff=%d V=%d E=%d moe_every=%d tie=%d shards=%d "
           "threads=%d warmup=%d iters=%d\n", o.batch, c->seq_len, b.T, c->num_layers, c->d_model, c->num_heads,
           c->num_kv_heads, c->d_ff, c->vocab_size, c->moe.num_experts, c->moe_every, c->tie_embeddings, o.shards,
           moe_threads_get(), o.warmup, N);
    printf("parameters %zu (dense %zu, experts %zu); loss %.4f, gradient norm %.4f (last iteration)\n", P,
           moe_model_num_dense(b.model), moe_model_num_expert(b.model), loss_sum / b.T, grad_norm);
    const char *labels[NUM_SERIES] = {"dense forward ", "dense backward", "dense fwd+bwd ", "optimizer step"};
    for (int s = 0; s < NUM_SERIES; s++)
        printf("%s: median %8.3f ms  min %8.3f ms\n", labels[s], median[s], least[s]);
    printf("dense path: %.4f us per token, %.3f GFLOP per fwd+bwd (GEMMs), %.1f GFLOP/s; optimizer: %.4f ns per "
           "parameter\n", us_per_token, flop * 1e-9, flop / median[SERIES_DENSE] * 1e-6, ns_per_param);
    printf("json: {\"bench\":\"model_dense_cpu\",");
    bench_json_flags(&o);
    printf(",\"tokens\":%d,\"params\":%zu,\"dense_params\":%zu,\"expert_params\":%zu", b.T, P,
           moe_model_num_dense(b.model), moe_model_num_expert(b.model));
    for (int s = 0; s < NUM_SERIES; s++)
        printf(",\"%s\":{\"median\":%.4f,\"min\":%.4f}", kSeries[s], median[s], least[s]);
    printf(",\"gflop\":%.6f,\"gflops\":%.3f,\"dense_us_per_token\":%.6f,\"optimizer_ns_per_param\":%.6f,"
           "\"loss\":%.6f}\n", flop * 1e-9, flop / median[SERIES_DENSE] * 1e-6, us_per_token, ns_per_param, loss_sum / b.T);
    teardown(&b);
    return 0;
}
