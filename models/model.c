/* model.c — the MoE decoder LM: parameter layout, initialisation, forward and backward on one rank.
 * Orchestration only: ops come from kernels/, experts/ and the MoE layer (moe/moe.h). Every row-wise
 * GEMM goes through kernels/gemm_rows.h, and attention runs per sequence, so a token's activations do
 * not depend on which other tokens share this rank: the layout only changes how gradients are summed. */
#include "models/model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "experts/expert_ffn.h"
#include "kernels/attention.h"
#include "kernels/cross_entropy.h"
#include "kernels/embedding.h"
#include "kernels/gemm_rows.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "core/real.h"
#include "core/rng.h"

/* Activations of one layer for T = max_seqs * S tokens (A = H*hd, B = KV*hd). */
typedef struct {
    moe_real *ln1, *rstd1;      /* [T, d], [T]           */
    moe_real *q, *k, *v;        /* [T, A], [T, B], [T, B] after RoPE */
    moe_real *att;              /* [max_seqs, H, S, S]   */
    moe_real *attn_y;           /* [T, A]                */
    moe_real *resid_mid;        /* [T, d]  x + attention */
    moe_real *ln2, *rstd2;      /* [T, d], [T]           */
    moe_real *h1, *h3, *act;    /* [T, d_ff] dense FFN only */
} layer_acts;

struct moe_model {
    moe_model_config cfg;
    const moe_parallel *par;
    int max_seqs, head_dim, num_local_experts;
    size_t num_dense, num_expert;
    moe_real *params, *grads;
    moe_model_views p, g;
    moe_model_param_span *spans;
    int num_spans;
    moe_layer **moe;            /* [L], NULL for dense layers */
    moe_layer_stats *stats;     /* [L] */
    moe_gemm_rows_plan gemm;
    /* activations of the last forward */
    int num_seqs;
    int *inputs, *targets;      /* [T] */
    moe_real **resid;           /* [L + 1] of [T, d]: the residual stream entering each layer */
    layer_acts *acts;           /* [L] */
    moe_real *lnf, *rstdf;      /* [T, d], [T] */
    moe_real *logits;           /* [T, V] */
    /* backward scratch */
    moe_real *dresid, *dln, *tmp;       /* [T, d] */
    moe_real *dq, *dk, *dv, *dattn;     /* [T, A], [T, B], [T, B], [T, A] */
    moe_real *dh1, *dh3;                /* [T, d_ff] */
    moe_real *att_scratch;              /* [S, S] */
    moe_real *wgrad_scratch;            /* [d_ff, d] */
    int has_forward;
};

/* ---- parameter layout ------------------------------------------------------------------------- */

typedef struct {
    moe_model *m;
    size_t cursor;
} layout_walk;

/* Reserves count reals at the cursor, records the span; returns its offset. */
static size_t take(layout_walk *w, size_t count, int decay, const char *name) {
    size_t at = w->cursor;
    w->cursor += count;
    w->m->spans[w->m->num_spans++] = (moe_model_param_span){at, count, decay, name};
    return at;
}

/* The order of every tensor in the buffer: [dense | experts]; offsets[] in the order set_views reads. */
static void lay_out(moe_model *m, size_t *offsets) {
    const moe_model_config *c = &m->cfg;
    const size_t d = c->d_model, V = c->vocab_size, A = (size_t)c->num_heads * m->head_dim,
                 B = (size_t)c->num_kv_heads * m->head_dim, F = c->d_ff, E = c->moe.num_experts,
                 EL = m->num_local_experts;
    layout_walk w = {m, 0};
    int n = 0;
    m->num_spans = 0;
    offsets[n++] = take(&w, V * d, 1, "embedding");
    for (int l = 0; l < c->num_layers; l++) {
        offsets[n++] = take(&w, d, 0, "attn_norm");
        offsets[n++] = take(&w, A * d, 1, "wq");
        offsets[n++] = take(&w, B * d, 1, "wk");
        offsets[n++] = take(&w, B * d, 1, "wv");
        offsets[n++] = take(&w, d * A, 1, "wo");
        offsets[n++] = take(&w, d, 0, "ffn_norm");
        if (moe_model_layer_is_moe(c, l)) {
            offsets[n++] = take(&w, E * d, 1, "router");
        } else {
            offsets[n++] = take(&w, F * d, 1, "dense.w1");
            offsets[n++] = take(&w, F * d, 1, "dense.w3");
            offsets[n++] = take(&w, d * F, 1, "dense.w2");
        }
    }
    offsets[n++] = take(&w, d, 0, "final_norm");
    if (!c->tie_embeddings) offsets[n++] = take(&w, V * d, 1, "lm_head");
    m->num_dense = w.cursor;
    for (int l = 0; l < c->num_layers; l++)
        if (moe_model_layer_is_moe(c, l)) {
            offsets[n++] = take(&w, EL * F * d, 1, "experts.w1");
            offsets[n++] = take(&w, EL * F * d, 1, "experts.w3");
            offsets[n++] = take(&w, EL * d * F, 1, "experts.w2");
        }
    m->num_expert = w.cursor - m->num_dense;
}

/* Points the views of one buffer (params or grads) at the offsets recorded by lay_out. */
static void set_views(moe_model *m, moe_real *base, moe_model_views *v, const size_t *offsets) {
    const moe_model_config *c = &m->cfg;
    int n = 0;
    v->embedding = base + offsets[n++];
    for (int l = 0; l < c->num_layers; l++) {
        moe_model_layer_params *L = &v->layers[l];
        L->attn_norm = base + offsets[n++];
        L->wq = base + offsets[n++];
        L->wk = base + offsets[n++];
        L->wv = base + offsets[n++];
        L->wo = base + offsets[n++];
        L->ffn_norm = base + offsets[n++];
        if (moe_model_layer_is_moe(c, l)) {
            L->ffn.router_w = base + offsets[n++];
        } else {
            L->ffn.router_w = NULL;
            L->ffn.w1 = base + offsets[n++];
            L->ffn.w3 = base + offsets[n++];
            L->ffn.w2 = base + offsets[n++];
        }
    }
    v->final_norm = base + offsets[n++];
    v->lm_head = c->tie_embeddings ? v->embedding : base + offsets[n++];
    for (int l = 0; l < c->num_layers; l++)
        if (moe_model_layer_is_moe(c, l)) {
            v->layers[l].ffn.w1 = base + offsets[n++];
            v->layers[l].ffn.w3 = base + offsets[n++];
            v->layers[l].ffn.w2 = base + offsets[n++];
        }
}

/* ---- creation --------------------------------------------------------------------------------- */

static moe_real *alloc_reals(size_t count, int *failed) {
    moe_real *p = calloc(count ? count : 1, sizeof(moe_real));
    if (!p) *failed = 1;
    return p;
}

static int alloc_activations(moe_model *m) {
    const moe_model_config *c = &m->cfg;
    const size_t T = (size_t)m->max_seqs * c->seq_len, d = c->d_model, V = c->vocab_size, F = c->d_ff,
                 S = c->seq_len, A = (size_t)c->num_heads * m->head_dim, B = (size_t)c->num_kv_heads * m->head_dim;
    int failed = 0;
    m->inputs = calloc(T, sizeof(int));
    m->targets = calloc(T, sizeof(int));
    m->resid = calloc(c->num_layers + 1, sizeof(moe_real *));
    m->acts = calloc(c->num_layers, sizeof(layer_acts));
    if (!m->inputs || !m->targets || !m->resid || !m->acts) return 0;
    for (int l = 0; l <= c->num_layers; l++) m->resid[l] = alloc_reals(T * d, &failed);
    for (int l = 0; l < c->num_layers; l++) {
        layer_acts *a = &m->acts[l];
        a->ln1 = alloc_reals(T * d, &failed), a->rstd1 = alloc_reals(T, &failed);
        a->q = alloc_reals(T * A, &failed), a->k = alloc_reals(T * B, &failed), a->v = alloc_reals(T * B, &failed);
        a->att = alloc_reals((size_t)m->max_seqs * c->num_heads * S * S, &failed);
        a->attn_y = alloc_reals(T * A, &failed);
        a->resid_mid = alloc_reals(T * d, &failed);
        a->ln2 = alloc_reals(T * d, &failed), a->rstd2 = alloc_reals(T, &failed);
        if (!moe_model_layer_is_moe(c, l))
            a->h1 = alloc_reals(T * F, &failed), a->h3 = alloc_reals(T * F, &failed), a->act = alloc_reals(T * F, &failed);
    }
    m->lnf = alloc_reals(T * d, &failed), m->rstdf = alloc_reals(T, &failed);
    m->logits = alloc_reals(T * V, &failed);
    m->dresid = alloc_reals(T * d, &failed), m->dln = alloc_reals(T * d, &failed), m->tmp = alloc_reals(T * d, &failed);
    m->dq = alloc_reals(T * A, &failed), m->dk = alloc_reals(T * B, &failed), m->dv = alloc_reals(T * B, &failed);
    m->dattn = alloc_reals(T * A, &failed);
    m->dh1 = alloc_reals(T * F, &failed), m->dh3 = alloc_reals(T * F, &failed);
    m->att_scratch = alloc_reals(S * S, &failed);
    m->wgrad_scratch = alloc_reals(F * d, &failed);
    size_t widest = d > F ? d : F;
    widest = widest > V ? widest : V;
    if (moe_gemm_rows_plan_init(&m->gemm, c->moe.layout_invariant, (int)widest) != MOE_OK) failed = 1;
    return !failed;
}

moe_status moe_model_create(const moe_model_config *cfg, const moe_parallel *par, int max_seqs, int accum_steps,
                            moe_model **out) {
    if (!cfg || !par || !out || max_seqs < 1 || accum_steps < 1) return MOE_ERR_INVALID_ARG;
    *out = NULL;
    if (moe_model_config_problem(cfg) || cfg->moe.ep_size != par->ep_size) return MOE_ERR_INVALID_CONFIG;
    moe_model *m = calloc(1, sizeof *m);
    if (!m) return MOE_ERR_OUT_OF_MEMORY;
    m->cfg = *cfg;
    m->par = par;
    m->max_seqs = max_seqs;
    m->head_dim = cfg->d_model / cfg->num_heads;
    m->num_local_experts = cfg->moe.num_experts / cfg->moe.ep_size;
    const int L = cfg->num_layers, max_tensors = 1 + 9 * L + 2 + 3 * L;
    size_t *offsets = calloc(max_tensors, sizeof(size_t));
    m->p.layers = calloc(L, sizeof(moe_model_layer_params));
    m->g.layers = calloc(L, sizeof(moe_model_layer_params));
    m->spans = calloc(max_tensors, sizeof(moe_model_param_span));
    m->moe = calloc(L, sizeof(moe_layer *));
    m->stats = calloc(L, sizeof(moe_layer_stats));
    moe_status st = offsets && m->p.layers && m->g.layers && m->spans && m->moe && m->stats ? MOE_OK
                                                                                          : MOE_ERR_OUT_OF_MEMORY;
    if (st == MOE_OK) {
        lay_out(m, offsets);
        m->params = calloc(m->num_dense + m->num_expert, sizeof(moe_real));
        m->grads = calloc(m->num_dense + m->num_expert, sizeof(moe_real));
        if (!m->params || !m->grads || !alloc_activations(m)) st = MOE_ERR_OUT_OF_MEMORY;
    }
    if (st == MOE_OK) {
        set_views(m, m->params, &m->p, offsets);
        set_views(m, m->grads, &m->g, offsets);
    }
    for (int l = 0; l < L && st == MOE_OK; l++) {
        if (!moe_model_layer_is_moe(cfg, l)) continue;
        moe_config lc = cfg->moe;
        lc.layer_index = l;
        lc.aux_loss_coef /= accum_steps; /* the step's loss is the mean over its micro-batches */
        lc.z_loss_coef /= accum_steps;
        st = moe_layer_create(&lc, par, &m->moe[l]);
    }
    free(offsets);
    if (st != MOE_OK) return moe_model_destroy(m), st;
    *out = m;
    return MOE_OK;
}

void moe_model_destroy(moe_model *m) {
    if (!m) return;
    const int L = m->cfg.num_layers;
    for (int l = 0; m->moe && l < L; l++) moe_layer_destroy(m->moe[l]);
    for (int l = 0; m->resid && l <= L; l++) free(m->resid[l]);
    for (int l = 0; m->acts && l < L; l++) {
        layer_acts *a = &m->acts[l];
        moe_real *all[] = {a->ln1, a->rstd1, a->q, a->k, a->v, a->att, a->attn_y, a->resid_mid, a->ln2, a->rstd2,
                           a->h1, a->h3, a->act};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++) free(all[i]);
    }
    moe_real *bufs[] = {m->params, m->grads, m->lnf, m->rstdf, m->logits, m->dresid, m->dln, m->tmp, m->dq,
                        m->dk, m->dv, m->dattn, m->dh1, m->dh3, m->att_scratch, m->wgrad_scratch};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) free(bufs[i]);
    moe_gemm_rows_plan_free(&m->gemm);
    free(m->resid), free(m->acts), free(m->inputs), free(m->targets);
    free(m->p.layers), free(m->g.layers), free(m->spans), free(m->moe), free(m->stats);
    free(m);
}

moe_real *moe_model_params(moe_model *m) { return m->params; }
moe_real *moe_model_grads(moe_model *m) { return m->grads; }
size_t moe_model_num_dense(const moe_model *m) { return m->num_dense; }
size_t moe_model_num_expert(const moe_model *m) { return m->num_expert; }
int moe_model_num_local_experts(const moe_model *m) { return m->num_local_experts; }
const moe_model_views *moe_model_param_views(const moe_model *m) { return &m->p; }
const moe_model_views *moe_model_grad_views(const moe_model *m) { return &m->g; }
const moe_model_param_span *moe_model_spans(const moe_model *m, int *count) {
    *count = m->num_spans;
    return m->spans;
}
moe_layer *moe_model_moe_layer(moe_model *m, int l) { return m->moe[l]; }
moe_real *moe_model_expert_bias(moe_model *m, int l) { return m->moe[l] ? moe_layer_expert_bias(m->moe[l]) : NULL; }
const moe_layer_stats *moe_model_layer_stats(const moe_model *m, int l) { return m->moe[l] ? &m->stats[l] : NULL; }
void moe_model_zero_grads(moe_model *m) { memset(m->grads, 0, (m->num_dense + m->num_expert) * sizeof(moe_real)); }

/* ---- initialisation --------------------------------------------------------------------------- */

/* uniform with standard deviation std: bound std * sqrt(3) */
static void init_tensor(moe_real *t, size_t count, double std, unsigned long long seed, unsigned long long stream) {
    moe_rng rng = moe_rng_seeded(seed * 0x100000001B3ull + stream);
    moe_rng_fill_uniform(&rng, t, count, std * sqrt(3.0));
}

void moe_model_init_weights(moe_model *m, unsigned long long seed) {
    const moe_model_config *c = &m->cfg;
    const double std = 0.02, out_std = std / sqrt(2.0 * c->num_layers); /* residual projections (GPT-2) */
    const size_t d = c->d_model, F = c->d_ff, per_expert = F * d;
    /* dense spans: stream = span index, the same on every rank */
    for (int s = 0; s < m->num_spans; s++) {
        const moe_model_param_span *sp = &m->spans[s];
        if (sp->offset >= m->num_dense) break;
        moe_real *t = m->params + sp->offset;
        if (!sp->decay) {
            for (size_t i = 0; i < sp->count; i++) t[i] = 1; /* norms */
            continue;
        }
        int residual_out = !strcmp(sp->name, "wo") || !strcmp(sp->name, "dense.w2");
        init_tensor(t, sp->count, residual_out ? out_std : std, seed, (unsigned long long)s);
    }
    /* experts: stream = (layer, global expert, matrix), whatever rank holds the expert */
    const int first = m->par->ep_rank * m->num_local_experts;
    for (int l = 0; l < c->num_layers; l++) {
        if (!m->moe[l]) continue;
        const moe_layer_weights *w = &m->p.layers[l].ffn;
        for (int e = 0; e < m->num_local_experts; e++) {
            unsigned long long id = ((unsigned long long)(l + 1) << 40) + ((unsigned long long)(first + e) << 4);
            init_tensor(w->w1 + e * per_expert, per_expert, std, seed, id + 1);
            init_tensor(w->w3 + e * per_expert, per_expert, std, seed, id + 2);
            init_tensor(w->w2 + e * per_expert, per_expert, out_std, seed, id + 3);
        }
    }
}

/* ---- forward ---------------------------------------------------------------------------------- */

/* y[T, out] = x[T, in] W^T (row-wise, layout-invariant) */
static void linear(moe_model *m, const moe_real *x, const moe_real *W, int T, int in, int out, moe_real *y) {
    moe_gemm_rows_cpu(&m->gemm, CblasTrans, T, out, in, x, W, 0, y);
}

/* dW[out, in] += dy^T x (a sum over this rank's tokens) */
static void linear_weight_grad(const moe_real *dy, const moe_real *x, int T, int in, int out, moe_real *dW) {
    moe__gemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, T, 1, dy, out, x, in, 1, dW, in);
}

/* dx[T, in] (+)= dy[T, out] W */
static void linear_input_grad(moe_model *m, const moe_real *dy, const moe_real *W, int T, int in, int out,
                              moe_real beta, moe_real *dx) {
    moe_gemm_rows_cpu(&m->gemm, CblasNoTrans, T, in, out, dy, W, beta, dx);
}

static void add(const moe_real *a, const moe_real *b, size_t n, moe_real *y) {
    for (size_t i = 0; i < n; i++) y[i] = a[i] + b[i];
}

static moe_status ffn_forward(moe_model *m, int l, int T) {
    const moe_model_config *c = &m->cfg;
    layer_acts *a = &m->acts[l];
    const moe_layer_weights *w = &m->p.layers[l].ffn;
    if (m->moe[l]) return moe_layer_forward(m->moe[l], w, a->ln2, T, m->tmp, &m->stats[l]);
    const int offsets[2] = {0, T}; /* a dense FFN is one expert that sees every token */
    moe_expert_ffn_forward_cpu(w, 1, c->d_model, c->d_ff, offsets, a->ln2, a->h1, a->h3, a->act, m->tmp, &m->gemm);
    return MOE_OK;
}

moe_status moe_model_forward(moe_model *m, const int *inputs, const int *targets, int num_seqs, double *loss_sum,
                             moe_real *logits_out) {
    const moe_model_config *c = &m->cfg;
    if (num_seqs < 1 || num_seqs > m->max_seqs || !inputs) return MOE_ERR_INVALID_ARG;
    const int S = c->seq_len, T = num_seqs * S, d = c->d_model, V = c->vocab_size, H = c->num_heads,
              KV = c->num_kv_heads, hd = m->head_dim, A = H * hd, B = KV * hd;
    m->has_forward = 0;
    m->num_seqs = num_seqs;
    memcpy(m->inputs, inputs, (size_t)T * sizeof(int));
    moe_embedding_forward_cpu(m->p.embedding, inputs, T, d, m->resid[0]);
    for (int l = 0; l < c->num_layers; l++) {
        const moe_model_layer_params *w = &m->p.layers[l];
        layer_acts *a = &m->acts[l];
        moe_rmsnorm_forward_cpu(m->resid[l], w->attn_norm, T, d, c->norm_eps, a->ln1, a->rstd1);
        linear(m, a->ln1, w->wq, T, d, A, a->q);
        linear(m, a->ln1, w->wk, T, d, B, a->k);
        linear(m, a->ln1, w->wv, T, d, B, a->v);
        moe_rope_forward_cpu(a->q, num_seqs, S, H, hd, c->rope_theta);
        moe_rope_forward_cpu(a->k, num_seqs, S, KV, hd, c->rope_theta);
        moe_attention_forward_cpu(a->q, a->k, a->v, num_seqs, S, H, KV, hd, a->att, a->attn_y);
        linear(m, a->attn_y, w->wo, T, A, d, m->tmp);
        add(m->resid[l], m->tmp, (size_t)T * d, a->resid_mid);
        moe_rmsnorm_forward_cpu(a->resid_mid, w->ffn_norm, T, d, c->norm_eps, a->ln2, a->rstd2);
        moe_status st = ffn_forward(m, l, T);
        if (st != MOE_OK) return st;
        add(a->resid_mid, m->tmp, (size_t)T * d, m->resid[l + 1]);
    }
    moe_rmsnorm_forward_cpu(m->resid[c->num_layers], m->p.final_norm, T, d, c->norm_eps, m->lnf, m->rstdf);
    linear(m, m->lnf, m->p.lm_head, T, d, V, m->logits);
    if (logits_out) memcpy(logits_out, m->logits, (size_t)T * V * sizeof(moe_real));
    if (!targets) return MOE_OK;
    memcpy(m->targets, targets, (size_t)T * sizeof(int));
    *loss_sum = moe_cross_entropy_forward_cpu(m->logits, targets, T, V);
    m->has_forward = 1;
    return MOE_OK;
}

/* ---- backward --------------------------------------------------------------------------------- */

/* From dL/dffn_out (m->dresid) to dL/dln2 (m->dln, overwritten). */
static moe_status ffn_backward(moe_model *m, int l, int T) {
    const moe_model_config *c = &m->cfg;
    layer_acts *a = &m->acts[l];
    const moe_layer_weights *w = &m->p.layers[l].ffn;
    moe_layer_weights *gw = &m->g.layers[l].ffn;
    if (m->moe[l]) return moe_layer_backward(m->moe[l], w, m->dresid, m->dln, gw);
    const int offsets[2] = {0, T};
    moe_expert_ffn_backward_cpu(w, gw, 1, c->d_model, c->d_ff, offsets, 1, a->ln2, a->h1, a->h3, a->act, m->dresid, m->dh1,
                            m->dh3, m->dln, m->wgrad_scratch, &m->gemm);
    return MOE_OK;
}

moe_status moe_model_backward(moe_model *m, moe_real loss_scale) {
    if (!m->has_forward) return MOE_ERR_NO_FORWARD;
    const moe_model_config *c = &m->cfg;
    const int S = c->seq_len, T = m->num_seqs * S, d = c->d_model, V = c->vocab_size, H = c->num_heads,
              KV = c->num_kv_heads, hd = m->head_dim, A = H * hd, B = KV * hd;
    /* head: dlogits (in place), then lm_head and the final norm */
    moe_cross_entropy_backward_cpu(m->logits, m->targets, T, V, loss_scale);
    linear_weight_grad(m->logits, m->lnf, T, d, V, m->g.lm_head);
    linear_input_grad(m, m->logits, m->p.lm_head, T, d, V, 0, m->dln);
    memset(m->dresid, 0, (size_t)T * d * sizeof(moe_real));
    moe_rmsnorm_backward_cpu(m->resid[c->num_layers], m->p.final_norm, m->rstdf, m->dln, T, d, m->dresid, m->g.final_norm);
    for (int l = c->num_layers - 1; l >= 0; l--) {
        const moe_model_layer_params *w = &m->p.layers[l];
        moe_model_layer_params *gw = &m->g.layers[l];
        layer_acts *a = &m->acts[l];
        /* resid[l+1] = resid_mid + ffn(ln2(resid_mid)): dresid flows to both */
        moe_status st = ffn_backward(m, l, T);
        if (st != MOE_OK) return st;
        moe_rmsnorm_backward_cpu(a->resid_mid, w->ffn_norm, a->rstd2, m->dln, T, d, m->dresid, gw->ffn_norm);
        /* resid_mid = resid[l] + wo(attention(...)) */
        linear_weight_grad(m->dresid, a->attn_y, T, A, d, gw->wo);
        linear_input_grad(m, m->dresid, w->wo, T, A, d, 0, m->dattn);
        moe_attention_backward_cpu(a->q, a->k, a->v, a->att, m->dattn, m->num_seqs, S, H, KV, hd, m->dq, m->dk, m->dv,
                               m->att_scratch);
        moe_rope_backward_cpu(m->dq, m->num_seqs, S, H, hd, c->rope_theta);
        moe_rope_backward_cpu(m->dk, m->num_seqs, S, KV, hd, c->rope_theta);
        linear_weight_grad(m->dq, a->ln1, T, d, A, gw->wq);
        linear_weight_grad(m->dk, a->ln1, T, d, B, gw->wk);
        linear_weight_grad(m->dv, a->ln1, T, d, B, gw->wv);
        linear_input_grad(m, m->dq, w->wq, T, d, A, 0, m->dln);
        linear_input_grad(m, m->dk, w->wk, T, d, B, 1, m->dln);
        linear_input_grad(m, m->dv, w->wv, T, d, B, 1, m->dln);
        moe_rmsnorm_backward_cpu(m->resid[l], w->attn_norm, a->rstd1, m->dln, T, d, m->dresid, gw->attn_norm);
    }
    moe_embedding_backward_cpu(m->dresid, m->inputs, T, d, m->g.embedding);
    m->has_forward = 0;
    return MOE_OK;
}

moe_status moe_model_reduce_grads(moe_model *m) {
    moe_comm *world = m->par->world, *dp = m->par->expert_dp;
    moe_status st = world->ops->allreduce_sum_real(world, m->grads, m->num_dense);
    if (st == MOE_OK && m->num_expert) st = dp->ops->allreduce_sum_real(dp, m->grads + m->num_dense, m->num_expert);
    return st;
}

moe_status moe_model_update_expert_bias(moe_model *m) {
    if (m->cfg.moe.score_func != MOE_SCORE_SIGMOID) return MOE_OK;
    for (int l = 0; l < m->cfg.num_layers; l++) {
        moe_status st = m->moe[l] ? moe_layer_update_expert_bias(m->moe[l]) : MOE_OK;
        if (st != MOE_OK) return st;
    }
    return MOE_OK;
}
