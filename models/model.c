/* model.c — the MoE decoder LM: parameter layout, initialisation, forward and backward on one rank; its two ends
 * (the embedding, the head) are head.c's, the structures model_internal.h's. Orchestration only: the dense ops come
 * from the runtime's table (moe/dense_ops.h), the MoE layers from moe/moe.h, the list of tensors from model.h's
 * X-macros. Every row-wise GEMM is cut as the layer cuts its own, and attention runs per sequence, so a token's
 * activations do not depend on which other tokens share this rank: the layout only changes how gradients are
 * summed. */
#include "models/model.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fail.h"
#include "models/model_internal.h"

/* ---- the tensor table ------------------------------------------------------------------------- */

/* The shape symbols of model.h's tensor lists. */
typedef struct {
    long d, A, B, F, E;
    long BK; /* model_activations.h's */
} dims;

static dims dims_of(const moe_model *m) {
    const moe_model_config *c = &m->cfg;
    const long B = (long)c->num_kv_heads * m->head_dim;
    return (dims){c->d_model, (long)c->num_heads * m->head_dim, B, c->d_ff, c->moe.num_experts,
                  B * moe_model_kv_chunks(c)};
}

/* The chunk that holds `layer` (-1, the embedding: chunk 0; num_layers, the final norm and lm_head: the last chunk),
 * or -1 when this model holds none of it. */
static int chunk_of(const moe_model *m, int layer) {
    if (layer < 0) return m->embeds ? 0 : -1;
    if (layer >= m->cfg.num_layers) return m->heads ? m->stage.chunks - 1 : -1;
    for (int c = 0; c < m->stage.chunks; c++)
        if (layer >= m->first[c] && layer < m->last[c]) return c;
    return -1;
}

/* Whether this model holds the tensors of `layer`. */
static int holds_layer(const moe_model *m, int layer) { return chunk_of(m, layer) >= 0; }

/* Every layer this model holds, ascending: for (FIRST_LAYER(m, c, l); l >= 0; l = next_layer(m, &c, l)). */
#define FIRST_LAYER(m, c, l) int c = 0, l = (m)->first[0]
static int next_layer(const moe_model *m, int *c, int l) {
    if (l + 1 < m->last[*c]) return l + 1;
    return ++*c < m->stage.chunks ? m->first[*c] : -1;
}

/* Appends a tensor at the end of the buffer laid out so far (*cursor); without a table (m->tensors NULL) it only
 * counts. */
static void put(moe_model *m, size_t *cursor, int index, int replica, int layer, int experts, long rows, long cols,
                moe_tensor_kind kind, moe_tensor_split split, const char *name) {
    /* this rank's block of a split tensor */
    const int parts = split == MOE_SPLIT_NONE      ? 1
                      : split == MOE_SPLIT_KV_ROWS ? moe_model_kv_blocks(&m->cfg)
                                                   : moe_model_tp_size(&m->cfg);
    split = split == MOE_SPLIT_KV_ROWS ? MOE_SPLIT_ROWS : split;
    rows /= split == MOE_SPLIT_ROWS ? parts : 1;
    cols /= split == MOE_SPLIT_COLS ? parts : 1;
    const size_t count = (size_t)(experts ? experts : 1) * rows * (cols ? cols : 1);
    if (m->tensors) {
        moe_model_tensor *t = &m->tensors[m->num_tensors++];
        *t = (moe_model_tensor){.layer = layer, .experts = experts, .ndim = cols ? 2 : 1, .rows = rows, .cols = cols,
                                .split = split, .parts = parts, .offset = *cursor, .count = count, .kind = kind,
                                .index = index, .replica = replica};
        snprintf(t->name, sizeof t->name, "%s", name);
    }
    *cursor += count;
}

/* The next tensor of the one-stage table (*index counts them all), put when this model holds its layer. */
static void append(moe_model *m, size_t *cursor, int *index, int layer, int experts, long rows, long cols,
                   moe_tensor_kind kind, moe_tensor_split split, const char *name) {
    const int at = (*index)++;
    if (holds_layer(m, layer)) put(m, cursor, at, 0, layer, experts, rows, cols, kind, split, name);
}

/* Whether this stage's lm_head is a replica of another stage's embedding (model.h). */
static int holds_tied_replica(const moe_model *m) { return m->cfg.tie_embeddings && m->heads && !m->embeds; }

/* Every tensor this model holds in buffer order, [dense | experts]: the embedding, each layer's attention and FFN
 * (router or dense SwiGLU), the final norm and lm_head, then each MoE layer's local experts — the one-stage model's
 * order, with the tensors of other stages left out. */
static void lay_out(moe_model *m) {
    const moe_model_config *c = &m->cfg;
    const dims D = dims_of(m);
    const long d = D.d, A = D.A, B = D.B, F = D.F, E = D.E, V = c->vocab_size, EL = m->num_local_experts;
    char name[sizeof m->tensors->name];
    size_t at = 0;
    int index = 0;
    m->num_tensors = 0;
    /* the embedding and lm_head are vocabulary-parallel (rows of the vocabulary) */
    append(m, &at, &index, -1, 0, V, d, MOE_TENSOR_WEIGHT, MOE_SPLIT_ROWS, "model.embed_tokens.weight");
#define DENSE_TENSOR(field, hf, rows, cols, kind, split)                                                            \
    snprintf(name, sizeof name, "model.layers.%d.%s", l, hf);                                                      \
    append(m, &at, &index, l, 0, rows, cols, kind, MOE_SPLIT_##split, name);
    for (int l = 0; l < c->num_layers; l++) {
        MOE_MODEL_ATTENTION_TENSORS(DENSE_TENSOR)
        if (moe_model_layer_is_moe(c, l)) {
            MOE_MODEL_ROUTER_TENSORS(DENSE_TENSOR)
        } else {
            MOE_MODEL_DENSE_FFN_TENSORS(DENSE_TENSOR)
        }
    }
#undef DENSE_TENSOR
    append(m, &at, &index, c->num_layers, 0, d, 0, MOE_TENSOR_NORM, MOE_SPLIT_NONE, "model.norm.weight");
    if (!c->tie_embeddings)
        append(m, &at, &index, c->num_layers, 0, V, d, MOE_TENSOR_WEIGHT, MOE_SPLIT_ROWS, "lm_head.weight");
    if (holds_tied_replica(m))
        put(m, &at, 0, 1, c->num_layers, 0, V, d, MOE_TENSOR_WEIGHT, MOE_SPLIT_ROWS, "model.embed_tokens.weight");
    m->num_dense = at;
#define EXPERT_TENSOR(field, hf, rows, cols, kind, split)                                                           \
    snprintf(name, sizeof name, "model.layers.%d.block_sparse_moe.experts.%%d.%s", l, hf);                        \
    append(m, &at, &index, l, (int)EL, rows, cols, kind, MOE_SPLIT_##split, name);
    for (int l = 0; l < c->num_layers; l++)
        if (moe_model_layer_is_moe(c, l)) {
            MOE_MODEL_EXPERT_TENSORS(EXPERT_TENSOR)
        }
#undef EXPERT_TENSOR
    m->num_expert = at - m->num_dense;
    (void)A, (void)B, (void)E; /* the lists name every dimension; a model may use only some */
}

/* Where a tensor of one buffer (params or grads) is: base + its offset, or with zg (ZeRO-2's gradients) in their window
 * or ends. */
static moe_real *tensor_at(moe_real *base, const moe_zero_grads *zg, const moe_model_tensor *t) {
    return zg ? moe_zero_grads_at(zg, t) : base + t->offset;
}

/* Points the views of one buffer (params or grads) at the tensors: the same walk as lay_out (what this model does not
 * hold stays NULL). */
static void set_views(moe_model *m, moe_real *base, const moe_zero_grads *zg, moe_model_views *v) {
    const moe_model_config *c = &m->cfg;
    const moe_model_tensor *t = m->tensors;
    v->embedding = m->embeds ? tensor_at(base, zg, t++) : NULL;
#define VIEW(field, hf, rows, cols, kind, split) L->field = tensor_at(base, zg, t++);
    for (FIRST_LAYER(m, ch, l); l >= 0; l = next_layer(m, &ch, l)) {
        moe_model_layer_params *L = &v->layers[l];
        L->ffn.router_w = NULL;
        MOE_MODEL_ATTENTION_TENSORS(VIEW)
        if (moe_model_layer_is_moe(c, l)) {
            MOE_MODEL_ROUTER_TENSORS(VIEW)
        } else {
            MOE_MODEL_DENSE_FFN_TENSORS(VIEW)
        }
    }
    v->final_norm = v->lm_head = NULL;
    if (m->heads) {
        v->final_norm = tensor_at(base, zg, t++);
        v->lm_head = c->tie_embeddings && m->embeds ? v->embedding : tensor_at(base, zg, t++);
    }
    for (FIRST_LAYER(m, ch, l); l >= 0; l = next_layer(m, &ch, l)) {
        moe_model_layer_params *L = &v->layers[l];
        if (moe_model_layer_is_moe(c, l)) {
            MOE_MODEL_EXPERT_TENSORS(VIEW)
        }
    }
#undef VIEW
}

/* The GEMMs' views (m->c): p's, with the dense GEMM weights moved into m->compute when there is one. */
static void set_compute_views(moe_model *m) {
    moe_model_layer_params *layers = m->c.layers;
    m->c = m->p;
    m->c.layers = layers;
    memcpy(layers, m->p.layers, (size_t)m->cfg.num_layers * sizeof *layers);
    if (!m->compute) return;
#define IN_COMPUTE(ptr) ((ptr) = m->compute + ((ptr) - m->params))
    for (FIRST_LAYER(m, ch, l); l >= 0; l = next_layer(m, &ch, l)) {
        moe_model_layer_params *w = &layers[l];
        IN_COMPUTE(w->wq), IN_COMPUTE(w->wk), IN_COMPUTE(w->wv), IN_COMPUTE(w->wo);
        if (!moe_model_layer_is_moe(&m->cfg, l)) IN_COMPUTE(w->ffn.w1), IN_COMPUTE(w->ffn.w3), IN_COMPUTE(w->ffn.w2);
    }
    if (m->heads) IN_COMPUTE(m->c.lm_head);
#undef IN_COMPUTE
}

/* When the parameters changed since the last forward: under bf16 the bf16 copies of every dense weight that is not a
 * norm (the GEMMs read those of set_compute_views), and the version the layers (ffn.version) and the dense ops are
 * told, which says when to make the weights' prepared copies again (core/types.h). Once per optimizer step, not per
 * micro-batch. */
static moe_status refresh_compute_weights(moe_model *m) {
    if (m->compute_version == m->params_version) return MOE_OK;
    for (int i = 0; m->compute && i < m->num_tensors; i++) {
        const moe_model_tensor *t = &m->tensors[i];
        if (t->experts == 0 && t->kind != MOE_TENSOR_NORM)
            MOE_TRY(m->dense->round_bf16(m->ops_state, m->params + t->offset, t->count, m->compute + t->offset));
    }
    for (int l = 0; l < m->cfg.num_layers; l++) m->c.layers[l].ffn.version = m->params_version;
    /* not with tensor-parallel pieces: their GEMMs take weight blocks copied into scratch (tp/linear.c), one address
     * for many weights, where a copy kept by address would be another weight's */
    if (m->dense->weights_version && !m->pieces) m->dense->weights_version(m->ops_state, m->params_version);
    m->compute_version = m->params_version;
    return MOE_OK;
}

/* ---- creation --------------------------------------------------------------------------------- */

#define COUNT_ONE(...) +1
enum {
    LAYER_BUFFERS = 0 MOE_MODEL_LAYER_ACTIVATIONS(COUNT_ONE),
    PASS_BUFFERS = 0 MOE_MODEL_PASS_BUFFERS(COUNT_ONE),
    SCRATCH_BUFFERS = 0 MOE_MODEL_SCRATCH_BUFFERS(COUNT_ONE)
};
#undef COUNT_ONE

/* The stage's chunks and ends, checked: MOE_ERR_INVALID_CONFIG with a message for chunks outside the model or
 * overlapping, or no pass. */
static moe_status set_stage(moe_model *m, const moe_model_stage *stage) {
    const int L = m->cfg.num_layers, V = stage->chunks ? stage->chunks : 1;
    const int stride = V > 1 ? stage->chunk_stride : stage->num_layers;
    if (stage->num_layers < 1 || stage->first_layer < 0 || V > MOE_MODEL_MAX_CHUNKS || stride < stage->num_layers ||
        stage->first_layer + (long)(V - 1) * stride + stage->num_layers > L || stage->passes < 1)
        return moe_fail(MOE_ERR_INVALID_CONFIG, "a stage of %d chunk(s) of %d layers from layer %d, %d apart, with %d "
                        "passes: each chunk needs at least one of the model's %d layers, the chunks may not overlap "
                        "(at most %d), and it needs a pass", V, stage->num_layers, stage->first_layer, stride,
                        stage->passes, L, MOE_MODEL_MAX_CHUNKS);
    m->stage = *stage;
    m->stage.chunks = V, m->stage.chunk_stride = stride;
    for (int c = 0; c < V; c++) m->first[c] = stage->first_layer + c * stride, m->last[c] = m->first[c] + stage->num_layers;
    m->embeds = m->first[0] == 0, m->heads = m->last[V - 1] == L;
    return MOE_OK;
}

/* Whether chunk c starts with the embedding / ends with the head. */
static int chunk_embeds(const moe_model *m, int c) { return m->first[c] == 0; }
static int chunk_heads(const moe_model *m, int c) { return m->last[c] == m->cfg.num_layers; }

/* layer_acts' buffers, in its order. */
static void layer_buffer_ptrs(layer_acts *a, void **ptrs[LAYER_BUFFERS]) {
#define LAYER_PTR(name, count, rebuilt_from) (void **)&a->name,
    void **all[LAYER_BUFFERS] = {MOE_MODEL_LAYER_ACTIVATIONS(LAYER_PTR)};
#undef LAYER_PTR
    memcpy(ptrs, all, sizeof all);
}

/* Whether buffer i of layer_acts is rebuilt in backward under cfg.moe.recompute (one buffer for every layer and pass)
 * rather than kept per layer and pass. */
static int layer_buffer_shared(moe_recompute recompute, int i) {
#define LAYER_LEVEL(name, count, rebuilt_from) rebuilt_from,
    static const int rebuilt_from[LAYER_BUFFERS] = {MOE_MODEL_LAYER_ACTIVATIONS(LAYER_LEVEL)};
#undef LAYER_LEVEL
    return (int)recompute >= rebuilt_from[i];
}

/* The bytes of layer l's activations, in layer_acts' order, for T = max_seqs * S tokens. */
static void layer_activation_nbytes(const moe_model *m, int l, size_t nbytes[LAYER_BUFFERS]) {
    const moe_model_config *c = &m->cfg;
    const dims D = dims_of(m);
    const size_t tp = (size_t)moe_model_tp_size(c), TG = (size_t)m->max_seqs * c->seq_len, T = TG / tp, d = D.d,
                 S = c->seq_len, A = D.A, BK = D.BK; /* T: this rank's slice (model_activations.h) */
    const size_t FD = moe_model_layer_is_moe(c, l) ? 0 : T * D.F;
    const size_t ATT = (size_t)m->max_seqs * c->num_heads * S * (c->attention == MOE_ATTENTION_FUSED ? 1 : S) / tp;
#define LAYER_NBYTES(name, count, rebuilt_from) (count) * sizeof(moe_real),
    const size_t n[LAYER_BUFFERS] = {MOE_MODEL_LAYER_ACTIVATIONS(LAYER_NBYTES)};
#undef LAYER_NBYTES
    memcpy(nbytes, n, sizeof n);
}

/* The bytes of a pass's own buffers for chunk c (MOE_MODEL_PASS_BUFFERS' order: the tokens on the embedding's chunk,
 * the head's on the last one, 0 elsewhere) and of the scratch (MOE_MODEL_SCRATCH_BUFFERS'). */
static void model_buffer_nbytes(const moe_model *m, int c, size_t pass[PASS_BUFFERS], size_t scratch[SCRATCH_BUFFERS]) {
    const dims D = dims_of(m);
    const size_t TG = (size_t)m->max_seqs * m->cfg.seq_len, T = TG / moe_model_tp_size(&m->cfg), d = D.d, A = D.A,
                 BK = D.BK, V = m->cfg.vocab_size;
    const size_t KVG = moe_model_kv_blocks(&m->cfg) < moe_model_tp_size(&m->cfg) ? TG * D.B : 0;
#define MODEL_NBYTES(name, type, count) (count) * sizeof(type),
    const size_t p[PASS_BUFFERS] = {MOE_MODEL_PASS_BUFFERS(MODEL_NBYTES)};
    const size_t n[SCRATCH_BUFFERS] = {MOE_MODEL_SCRATCH_BUFFERS(MODEL_NBYTES)};
#undef MODEL_NBYTES
    memcpy(pass, p, sizeof p), memcpy(scratch, n, sizeof n);
    pass[0] = chunk_embeds(m, c) ? pass[0] : 0; /* inputs */
    for (int i = 1; i < PASS_BUFFERS; i++) pass[i] = chunk_heads(m, c) ? pass[i] : 0;
}

static void pass_buffer_ptrs(model_pass *P, void **ptrs[PASS_BUFFERS]) {
#define PASS_PTR(name, type, count) (void **)&P->name,
    void **all[PASS_BUFFERS] = {MOE_MODEL_PASS_BUFFERS(PASS_PTR)};
#undef PASS_PTR
    memcpy(ptrs, all, sizeof all);
}

static void scratch_buffer_ptrs(moe_model *m, void **ptrs[SCRATCH_BUFFERS]) {
#define SCRATCH_PTR(name, type, count) (void **)&m->name,
    void **all[SCRATCH_BUFFERS] = {MOE_MODEL_SCRATCH_BUFFERS(SCRATCH_PTR)};
#undef SCRATCH_PTR
    memcpy(ptrs, all, sizeof all);
}

/* The bytes of each layer buffer of a pass: per layer (layer_activation_nbytes) for the kept ones, in row l; a
 * shared one's largest size over the stage's layers in the row of its first layer (first[0]), and 0 in the other rows
 * (and passes). */
static void activation_plan(const moe_model *m, size_t (*nbytes)[LAYER_BUFFERS]) {
    const int first = m->first[0];
    for (FIRST_LAYER(m, c, l); l >= 0; l = next_layer(m, &c, l)) {
        layer_activation_nbytes(m, l, nbytes[l]);
        for (int i = 0; i < LAYER_BUFFERS && l > first; i++)
            if (layer_buffer_shared(m->cfg.moe.recompute, i)) {
                if (nbytes[l][i] > nbytes[first][i]) nbytes[first][i] = nbytes[l][i];
                nbytes[l][i] = 0;
            }
    }
}

/* Whether pass P's buffer i of layer l is the one every pass shares (rebuilt under --recompute), owned by pass 0 at
 * the stage's first layer. */
static int owns_shared(const moe_model *m, const model_pass *P, int l) { return P == m->passes && l == m->first[0]; }

/* Allocates one pass's activations, of its chunk's layers (pass 0 also the shared ones, which the others point at);
 * nothing of 0 bytes. */
static moe_status alloc_pass(moe_model *m, model_pass *P, size_t (*plan)[LAYER_BUFFERS]) {
    const int L = m->cfg.num_layers, c = P->chunk;
    const size_t resid_nbytes = /* this rank's slice of the rows (model_activations.h's T) */
        (size_t)m->max_seqs * m->cfg.seq_len / moe_model_tp_size(&m->cfg) * m->cfg.d_model * sizeof(moe_real);
    P->resid = calloc(L + 1, sizeof(moe_real *));
    P->acts = calloc(L, sizeof(layer_acts));
    P->moe = calloc(L, sizeof(moe_layer *));
    P->stats = calloc(L, sizeof(moe_layer_stats));
    if (!P->resid || !P->acts || !P->moe || !P->stats) return MOE_ERR_OUT_OF_MEMORY;
    for (int l = m->first[c]; l <= m->last[c]; l++) MOE_TRY(moe_runtime_alloc(m->rt, resid_nbytes, (void **)&P->resid[l]));
    void **shared[LAYER_BUFFERS], **layer[LAYER_BUFFERS];
    layer_buffer_ptrs(&m->passes[0].acts[m->first[0]], shared);
    for (int l = m->first[c]; l < m->last[c]; l++) {
        layer_buffer_ptrs(&P->acts[l], layer);
        for (int i = 0; i < LAYER_BUFFERS; i++)
            if (layer_buffer_shared(m->cfg.moe.recompute, i) && !owns_shared(m, P, l)) *layer[i] = *shared[i];
            else if (plan[l][i]) MOE_TRY(moe_runtime_alloc(m->rt, plan[l][i], layer[i]));
    }
    size_t nbytes[PASS_BUFFERS], scratch[SCRATCH_BUFFERS];
    void **ptrs[PASS_BUFFERS];
    model_buffer_nbytes(m, c, nbytes, scratch);
    pass_buffer_ptrs(P, ptrs);
    for (int i = 0; i < PASS_BUFFERS; i++)
        if (nbytes[i]) MOE_TRY(moe_runtime_alloc(m->rt, nbytes[i], ptrs[i]));
    return MOE_OK;
}

static void free_pass(moe_model *m, model_pass *P) {
    const int c = P->chunk;
    for (int l = m->first[c]; P->moe && l < m->last[c]; l++) moe_layer_destroy(P->moe[l]);
    for (int l = m->first[c]; P->resid && l <= m->last[c]; l++) moe_runtime_free(m->rt, P->resid[l]);
    for (int l = m->first[c]; P->acts && l < m->last[c]; l++) {
        void **ptrs[LAYER_BUFFERS];
        layer_buffer_ptrs(&P->acts[l], ptrs);
        for (int i = 0; i < LAYER_BUFFERS; i++)
            if (!layer_buffer_shared(m->cfg.moe.recompute, i) || owns_shared(m, P, l)) moe_runtime_free(m->rt, *ptrs[i]);
    }
    void **ptrs[PASS_BUFFERS];
    pass_buffer_ptrs(P, ptrs);
    for (int i = 0; i < PASS_BUFFERS; i++) moe_runtime_free(m->rt, *ptrs[i]);
    free(P->resid), free(P->acts), free(P->moe), free(P->stats);
}

/* Allocates every pass's activations and the scratch, for T = max_seqs * S tokens, in the runtime's memory. */
static moe_status alloc_activations(moe_model *m) {
    const int n = m->stage.chunks * m->stage.passes;
    size_t(*plan)[LAYER_BUFFERS] = calloc(m->cfg.num_layers, sizeof *plan);
    m->passes = calloc(n, sizeof(model_pass));
    if (!plan || !m->passes) return free(plan), MOE_ERR_OUT_OF_MEMORY;
    m->P = m->passes;
    activation_plan(m, plan);
    moe_status st = MOE_OK;
    for (int i = 0; i < n; i++) m->passes[i].chunk = i / m->stage.passes;
    for (int i = 0; i < n && st == MOE_OK; i++) st = alloc_pass(m, &m->passes[i], plan);
    free(plan);
    MOE_TRY(st);
    size_t nbytes[SCRATCH_BUFFERS], pass[PASS_BUFFERS];
    void **ptrs[SCRATCH_BUFFERS];
    scratch_buffer_ptrs(m, ptrs);
    model_buffer_nbytes(m, 0, pass, nbytes);
    return moe_runtime_regrow(m->rt, ptrs, nbytes, SCRATCH_BUFFERS);
}

moe_model_stage moe_model_stage_whole(const moe_model_config *cfg) {
    return (moe_model_stage){.first_layer = 0, .num_layers = cfg->num_layers, .chunks = 1, .passes = 1};
}

moe_model_stage moe_model_pipeline_stage(const moe_model_config *cfg, int pp, int chunks, int stage, int passes) {
    const int per = cfg->num_layers / (pp * chunks); /* virtual stage v = c pp + stage holds [v per, (v + 1) per) */
    return (moe_model_stage){.first_layer = stage * per, .num_layers = per, .chunks = chunks,
                             .chunk_stride = pp * per, .passes = passes};
}

int moe_model_pipeline_stage_of(const moe_model_config *cfg, int pp, int chunks, int layer) {
    if (layer < 0) return 0;
    if (layer >= cfg->num_layers) return pp - 1;
    return layer / (cfg->num_layers / (pp * chunks)) % pp;
}

moe_model_footprint moe_model_stage_footprint(const moe_model_config *cfg, const moe_model_stage *stage,
                                              int max_seqs) {
    moe_model m = {.cfg = *cfg, .max_seqs = max_seqs, .head_dim = cfg->d_model / cfg->num_heads,
                   .num_local_experts = cfg->moe.num_experts / cfg->moe.ep_size};
    moe_model_footprint f = {0};
    if (set_stage(&m, stage) != MOE_OK) return f; /* the caller's create fails with the message */
    lay_out(&m); /* no tensor table: it only counts */
    f.dense_params = m.num_dense, f.expert_params = m.num_expert;
    const size_t T = (size_t)max_seqs * cfg->seq_len / moe_model_tp_size(cfg); /* this rank's slice */
    const size_t resid = T * cfg->d_model * sizeof(moe_real);
    size_t(*plan)[LAYER_BUFFERS] = calloc(cfg->num_layers, sizeof *plan), pass[PASS_BUFFERS], nbytes[SCRATCH_BUFFERS];
    if (!plan) return f; /* without the activations: the caller's allocation will fail as plainly */
    activation_plan(&m, plan);
    size_t shared = 0;
    for (int c = 0; c < m.stage.chunks; c++) { /* each chunk's passes: its layers' kept buffers and residuals */
        size_t per_pass = (size_t)(m.last[c] - m.first[c] + 1) * resid;
        for (int l = m.first[c]; l < m.last[c]; l++)
            for (int i = 0; i < LAYER_BUFFERS; i++) {
                if (layer_buffer_shared(cfg->moe.recompute, i)) shared += plan[l][i];
                else per_pass += plan[l][i];
            }
        model_buffer_nbytes(&m, c, pass, nbytes);
        for (int i = 0; i < PASS_BUFFERS; i++) per_pass += pass[i];
        f.activation_bytes += per_pass * m.stage.passes;
    }
    free(plan);
    for (int i = 0; i < SCRATCH_BUFFERS; i++) shared += nbytes[i];
    f.activation_bytes += shared;
    return f;
}

moe_model_footprint moe_model_config_footprint(const moe_model_config *cfg, int max_seqs) {
    const moe_model_stage whole = moe_model_stage_whole(cfg);
    return moe_model_stage_footprint(cfg, &whole, max_seqs);
}

/* The shard tree of the dense weight gradients, sized for the largest (moe_shard_grads_max_count). */
static moe_status init_shard_grads(moe_model *m) {
    const int S = m->cfg.moe.num_shards, W = moe_comm_size(moe_parallel_stage(m->par));
    if (!S) return moe_shard_grads_init(&m->shard_grads, m->rt, m->dense, m->ops_state, 0, 0);
    MOE_TRY(moe_shard_tree_local_shards(S, W, &m->local_shards));
    return moe_shard_grads_init(&m->shard_grads, m->rt, m->dense, m->ops_state, m->local_shards,
                                moe_shard_grads_max_count(&m->cfg));
}

static moe_status model_add(void *ctx, const moe_real *a, const moe_real *b, size_t n, moe_real *y) {
    moe_model *m = ctx;
    return m->dense->add(m->ops_state, a, b, n, y);
}

/* Grouped-query attention in pieces (model.h): the rank's kv heads, their copies, the products of k_proj and v_proj. */
static moe_status init_kv_heads(moe_model *m) {
    const int S = moe_model_tp_pieces(&m->cfg);
    m->kv_blocks = moe_model_kv_blocks(&m->cfg);
    m->kv_heads = m->cfg.num_kv_heads / m->kv_blocks;
    m->kv_copies = moe_model_kv_chunks(&m->cfg) * m->kv_blocks / m->seq.tp;
    m->kv_linear = &m->tpl;
    if (m->kv_blocks < m->seq.tp) {
        MOE_TRY(moe_tp_linear_init_block(&m->kv_block_linear, m->rt, m->ops_state, S, m->kv_blocks,
                                         m->seq.tp_rank / (m->seq.tp / m->kv_blocks)));
        m->kv_linear = &m->kv_block_linear;
    }
    const size_t heads = (size_t)m->max_seqs * m->cfg.seq_len * m->kv_heads * m->head_dim; /* [TG, kv_heads hd] */
    return moe_shard_tree_init(&m->kv_tree, m->rt, model_add, m, m->kv_copies, m->kv_copies > 1 ? heads : 0);
}

/* Tensor parallelism (model.h): the layout's tensor group, its products in fixed pieces, and the shard tree of the
 * pieces' weight gradients over the group's rows (tp x local_shards shards), sized for the largest piece held. */
static moe_status init_tensor_parallel(moe_model *m) {
    const moe_ranks r = moe_parallel_ranks(m->par);
    const int layout_tp = r.tp_size > 1 ? r.tp_size : 1;
    m->seq = (moe_tp_sequence){.group = moe_parallel_tensor(m->par), .rt = m->rt, .tp = moe_model_tp_size(&m->cfg),
                               .tp_rank = layout_tp > 1 ? r.tp_rank : 0};
    if (layout_tp != m->seq.tp)
        return moe_fail(MOE_ERR_INVALID_CONFIG, "the model's tp %d differs from the layout's tp %d", m->seq.tp,
                        layout_tp);
    MOE_TRY(moe_tp_linear_init(&m->tpl, m->rt, m->ops_state, m->seq.tp > 1 ? moe_parallel_tensor(m->par) : NULL,
                               moe_model_tp_pieces(&m->cfg)));
    m->pieces = moe_model_tp_pieces(&m->cfg) > 1;
    MOE_TRY(moe_tp_cross_entropy_init(&m->vocab_ce, m->rt, m->ops_state,
                                      m->seq.tp > 1 ? moe_parallel_tensor(m->par) : NULL,
                                      moe_model_tp_pieces(&m->cfg)));
    MOE_TRY(init_kv_heads(m));
    int dense_layers = 0;
    for (int l = 0; l < m->cfg.num_layers; l++)
        dense_layers += holds_layer(m, l) && !moe_model_layer_is_moe(&m->cfg, l);
    if (m->pieces && dense_layers) {
        const size_t n = (size_t)m->max_seqs * m->cfg.seq_len * (m->cfg.d_ff / m->seq.tp) * sizeof(moe_real);
        MOE_TRY(moe_runtime_alloc(m->rt, n, (void **)&m->tp_dh1));
        MOE_TRY(moe_runtime_alloc(m->rt, n, (void **)&m->tp_dh3));
    }
    size_t widest = 0;
    for (int i = 0; i < m->num_tensors; i++)
        if (m->tensors[i].split != MOE_SPLIT_NONE && m->tensors[i].count > widest) widest = m->tensors[i].count;
    return moe_shard_grads_init(&m->tp_grads, m->rt, m->dense, m->ops_state, m->local_shards * m->seq.tp, widest);
}

/* The gradient views: into the whole buffer, or under ZeRO-2 into the window and the ends (it needs the fixed tree). */
static moe_status init_grads(moe_model *m) {
    if (m->cfg.zero < 2) {
        set_views(m, m->grads, NULL, &m->g);
        return MOE_OK;
    }
    if (!m->local_shards)
        return moe_fail(MOE_ERR_INVALID_CONFIG, "ZeRO-2 reduce-scatters the gradients in the fixed tree: it needs the "
                                                "world-invariant sums (cfg.moe.num_shards > 0)");
    MOE_TRY(moe_zero_grads_init(&m->zero_grads, &m->zero, m->rt, m->dense, m->ops_state, m->tensors, m->num_tensors,
                                m->cfg.num_layers, m->seq.tp > 1 ? moe_parallel_tensor(m->par) : NULL));
    set_views(m, NULL, &m->zero_grads, &m->g);
    return MOE_OK;
}

/* The most tensors a table of cfg holds: the embedding, 9 per layer, the final norm and lm_head, 3 expert tensors per
 * layer. */
static int max_tensors_of(const moe_model_config *cfg) { return 1 + 9 * cfg->num_layers + 2 + 3 * cfg->num_layers; }

/* Each chunk's slices of the two regions, from the table (chunk_of each tensor's layer). */
static void find_chunk_slices(moe_model *m) {
    for (int i = 0; i < m->num_tensors; i++) {
        const moe_model_tensor *t = &m->tensors[i];
        const int c = chunk_of(m, t->layer), expert = t->offset >= m->num_dense;
        moe_zero_slice *sl = expert ? &m->chunk_expert[c] : &m->chunk_dense[c];
        const size_t from = t->offset - (expert ? m->num_dense : 0);
        if (!sl->count) *sl = (moe_zero_slice){from, t->count};
        else if (from + t->count > sl->from + sl->count) sl->count = from + t->count - sl->from; /* table order */
    }
}

/* Tied embeddings on a stage that holds an end (models/tied_grads.h): the lm_head's gradient goes to its own buffer. */
static moe_status init_tied(moe_model *m) {
    if (!m->cfg.tie_embeddings || (!m->embeds && !m->heads)) return MOE_OK;
    const moe_tied_end end = m->embeds && m->heads ? MOE_TIED_BOTH_ENDS : m->embeds ? MOE_TIED_FIRST : MOE_TIED_LAST;
    MOE_TRY(moe_tied_grads_init(&m->tied, end, m->rt, m->dense, m->ops_state, moe_parallel_pipeline(m->par),
                                (size_t)(m->cfg.vocab_size / m->seq.tp) * m->cfg.d_model)); /* its vocabulary block */
    if (m->heads) m->g.lm_head = m->tied.grad;
    return MOE_OK;
}

/* Every pass's MoE layers (the aux and z coefficients divided by the micro-batches: the step's loss is their mean);
 * pass 0's own each layer's selection bias, the others route with it. */
static moe_status create_moe_layers(moe_model *m, int accum_steps) {
    for (int i = 0; i < m->stage.chunks * m->stage.passes; i++) {
        const int c = m->passes[i].chunk, owner = c * m->stage.passes; /* the chunk's first pass owns the biases */
        for (int l = m->first[c]; l < m->last[c]; l++) {
            if (!moe_model_layer_is_moe(&m->cfg, l)) continue;
            moe_config lc = m->cfg.moe;
            lc.layer_index = l;
            lc.aux_loss_coef /= accum_steps;
            lc.z_loss_coef /= accum_steps;
            MOE_TRY(moe_layer_create(&lc, m->rt, m->par, &m->passes[i].moe[l]));
            if (i > owner) MOE_TRY(moe_layer_share_expert_bias(m->passes[i].moe[l], m->passes[owner].moe[l]));
        }
    }
    return MOE_OK;
}

moe_status moe_model_create_stage(const moe_model_config *cfg, moe_runtime *rt, const moe_parallel *par,
                                  const moe_model_stage *stage, int max_seqs, int accum_steps, moe_model **out) {
    if (!cfg || !par || !stage || !out || max_seqs < 1 || accum_steps < 1) return MOE_ERR_INVALID_ARG;
    *out = NULL;
    const char *problem = moe_model_config_problem(cfg);
    if (problem) return moe_fail(MOE_ERR_INVALID_CONFIG, "%s", problem);
    if (cfg->moe.ep_size != moe_parallel_ranks(par).ep_size)
        return moe_fail(MOE_ERR_INVALID_CONFIG, "the model's ep_size %d differs from the layout's ep %d",
                        cfg->moe.ep_size, moe_parallel_ranks(par).ep_size);
    moe_model *m = calloc(1, sizeof *m);
    if (!m) return MOE_ERR_OUT_OF_MEMORY;
    m->cfg = *cfg;
    m->par = par;
    m->max_seqs = max_seqs;
    m->head_dim = cfg->d_model / cfg->num_heads;
    m->num_local_experts = cfg->moe.num_experts / cfg->moe.ep_size;
    moe_status st = set_stage(m, stage);
    if (st != MOE_OK) return free(m), st;
    st = rt ? MOE_OK : moe_runtime_create_cpu(&m->owned_rt);
    m->rt = rt ? rt : m->owned_rt;
    if (st == MOE_OK && !(m->dense = moe_runtime_dense_ops(m->rt)))
        st = moe_fail(MOE_ERR_INVALID_CONFIG,
                      "the %s runtime has no table of dense-model ops (moe/dense_ops.h): a model cannot run on it",
                      moe_runtime_name(m->rt));
    const int L = cfg->num_layers;
    if (st == MOE_OK) {
        m->p.layers = calloc(L, sizeof(moe_model_layer_params));
        m->g.layers = calloc(L, sizeof(moe_model_layer_params));
        m->c.layers = calloc(L, sizeof(moe_model_layer_params));
        m->tensors = calloc(max_tensors_of(cfg), sizeof(moe_model_tensor));
        if (!m->p.layers || !m->g.layers || !m->c.layers || !m->tensors) st = MOE_ERR_OUT_OF_MEMORY;
    }
    if (st == MOE_OK) {
        lay_out(m);
        find_chunk_slices(m);
        const size_t n = (m->num_dense + m->num_expert) * sizeof(moe_real);
        st = moe_runtime_alloc(m->rt, n, (void **)&m->params);
        if (st == MOE_OK && cfg->zero < 2) st = moe_runtime_alloc(m->rt, n, (void **)&m->grads);
        if (st == MOE_OK)
            /* the dense region over the ranks holding the same one: the data-parallel group (the stage at tp 1; at tp
             * > 1 its members hold the same tensor-parallel blocks, and the replicated tensors, summed over the
             * stage, alike) */
            st = moe_zero_layout_init(&m->zero, cfg->zero, m->tensors, m->num_tensors, m->num_dense, m->num_expert,
                                      moe_parallel_data(par), moe_parallel_expert_dp(par));
        if (st == MOE_OK && moe_precision_bf16_inputs(cfg->moe.precision, MOE_GEMM_DENSE))
            st = moe_runtime_alloc(m->rt, m->num_dense * sizeof(moe_real), (void **)&m->compute);
    }
    if (st == MOE_OK) st = alloc_activations(m);
    if (st == MOE_OK) {
        set_views(m, m->params, NULL, &m->p);
        set_compute_views(m);
        int widest = cfg->d_model > cfg->d_ff ? cfg->d_model : cfg->d_ff;
        widest = widest > cfg->vocab_size ? widest : cfg->vocab_size;
        st = m->dense->create(m->rt, cfg->moe.layout_invariant, cfg->moe.precision, widest, &m->ops_state);
    }
    if (st == MOE_OK) st = init_shard_grads(m);
    if (st == MOE_OK) st = init_tensor_parallel(m);
    if (st == MOE_OK) st = init_grads(m);
    if (st == MOE_OK) st = create_moe_layers(m, accum_steps);
    if (st == MOE_OK) st = init_tied(m);
    if (st != MOE_OK) return moe_model_destroy(m), st;
    *out = m;
    return MOE_OK;
}

moe_status moe_model_whole_tensors(const moe_model *m, moe_model_tensor **tensors, int *count) {
    moe_model w = {.cfg = m->cfg, .head_dim = m->head_dim, .num_local_experts = m->num_local_experts};
    const moe_model_stage whole = moe_model_stage_whole(&m->cfg);
    MOE_TRY(set_stage(&w, &whole));
    if (!(w.tensors = calloc(max_tensors_of(&m->cfg), sizeof(moe_model_tensor)))) return MOE_ERR_OUT_OF_MEMORY;
    lay_out(&w);
    *tensors = w.tensors, *count = w.num_tensors;
    return MOE_OK;
}

moe_status moe_model_create(const moe_model_config *cfg, moe_runtime *rt, const moe_parallel *par, int max_seqs,
                            int accum_steps, moe_model **out) {
    if (!cfg) return MOE_ERR_INVALID_ARG;
    const moe_model_stage whole = moe_model_stage_whole(cfg);
    return moe_model_create_stage(cfg, rt, par, &whole, max_seqs, accum_steps, out);
}

void moe_model_destroy(moe_model *m) {
    if (!m) return;
    moe_shard_grads_free(&m->shard_grads);
    moe_shard_grads_free(&m->tp_grads);
    moe_tp_linear_free(&m->tpl);
    moe_tp_linear_free(&m->kv_block_linear);
    moe_shard_tree_free(&m->kv_tree);
    moe_tp_cross_entropy_free(&m->vocab_ce);
    moe_zero_grads_free(&m->zero_grads);
    moe_zero_layout_free(&m->zero);
    if (m->ops_state) m->dense->destroy(m->ops_state);
    for (int i = m->stage.chunks * m->stage.passes - 1; m->passes && i >= 0; i--) /* owners last */
        free_pass(m, &m->passes[i]);
    moe_tied_grads_free(&m->tied);
    void *bufs[] = {m->params, m->grads, m->compute, m->tp_dh1, m->tp_dh3};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs && m->rt; i++) moe_runtime_free(m->rt, bufs[i]);
    void **own[SCRATCH_BUFFERS];
    scratch_buffer_ptrs(m, own);
    for (int i = 0; i < SCRATCH_BUFFERS && m->rt; i++) moe_runtime_free(m->rt, *own[i]);
    moe_runtime_destroy(m->owned_rt);
    free(m->passes);
    free(m->p.layers), free(m->g.layers), free(m->c.layers), free(m->tensors);
    free(m);
}

moe_real *moe_model_params(moe_model *m) {
    m->params_version++; /* the caller may write them: the GEMMs' copies are made again at the next forward */
    return m->params;
}
moe_real *moe_model_grads(moe_model *m) { return m->grads; }
const moe_zero_layout *moe_model_zero(const moe_model *m) { return &m->zero; }
moe_real *moe_model_range_grads(moe_model *m, int expert) {
    if (m->cfg.zero == 2) return moe_zero_grads_range(&m->zero_grads, expert);
    return m->grads + (expert ? m->num_dense + m->zero.expert.begin : m->zero.dense.begin);
}
size_t moe_model_num_dense(const moe_model *m) { return m->num_dense; }
size_t moe_model_num_expert(const moe_model *m) { return m->num_expert; }
int moe_model_num_local_experts(const moe_model *m) { return m->num_local_experts; }
moe_runtime *moe_model_runtime(const moe_model *m) { return m->rt; }
void moe_model_replace_dense_ops(moe_model *m, const moe_dense_ops *ops) {
    m->dense = m->shard_grads.dense = m->tp_grads.dense = m->tpl.ops = ops;
}
const moe_dense_ops *moe_model_dense_ops(const moe_model *m, moe_dense_state **state) {
    *state = m->ops_state;
    return m->dense;
}
const moe_parallel *moe_model_parallel(const moe_model *m) { return m->par; }
const moe_model_config *moe_model_config_of(const moe_model *m) { return &m->cfg; }
const moe_model_stage *moe_model_stage_of(const moe_model *m) { return &m->stage; }
const moe_model_tensor *moe_model_tensors(const moe_model *m, int *count) {
    *count = m->num_tensors;
    return m->tensors;
}
moe_layer *moe_model_moe_layer(moe_model *m, int l) { return m->P->moe[l]; }
moe_real *moe_model_expert_bias(moe_model *m, int l) { /* the chunk's first pass owns the bias the others share */
    const int c = chunk_of(m, l);
    moe_layer *owner = c >= 0 ? m->passes[c * m->stage.passes].moe[l] : NULL;
    return owner ? moe_layer_expert_bias(owner) : NULL;
}
const moe_layer_stats *moe_model_layer_stats(const moe_model *m, int l) { return m->P->moe[l] ? &m->P->stats[l] : NULL; }

moe_status moe_model_finish_tied_grads(moe_model *m) {
    if (!m->tied.grad) return MOE_OK;
    if (!m->embeds) return moe_tied_grads_finish_step(&m->tied, NULL, 0, 0); /* the last stage sends its sum */
    /* the embedding (its vocabulary block at tp > 1): the dense region's start */
    const size_t count = (size_t)(m->cfg.vocab_size / m->seq.tp) * m->cfg.d_model;
    if (m->cfg.zero < 2) return moe_tied_grads_finish_step(&m->tied, m->g.embedding, 0, count);
    const moe_zero_region *r = &m->zero.dense; /* ZeRO-2: this rank's range of it, in the shard */
    const size_t hi = r->end < count ? r->end : count, lo = r->begin < hi ? r->begin : hi;
    return moe_tied_grads_finish_step(&m->tied, moe_zero_grads_range(&m->zero_grads, 0), lo, hi);
}

moe_status moe_model_zero_grads(moe_model *m) {
    if (m->tied.grad) moe_tied_grads_start_step(&m->tied);
    if (m->cfg.zero == 2) return moe_zero_grads_start_step(&m->zero_grads), MOE_OK; /* first sums copy into the shard */
    return moe_runtime_zero(m->rt, m->grads, (m->num_dense + m->num_expert) * sizeof(moe_real));
}

/* ---- non-finite values -------------------------------------------------------------------------- */

/* The name of element i of tensor t, with the global expert id filled in for an expert tensor. */
static void element_name(const moe_model *m, const moe_model_tensor *t, size_t i, char *out, size_t n) {
    if (!t->experts) {
        snprintf(out, n, "%s[%zu]", t->name, i);
        return;
    }
    const size_t per = t->count / t->experts;
    char name[sizeof t->name + 16];
    snprintf(name, sizeof name, t->name, moe_parallel_ranks(m->par).ep_rank * m->num_local_experts + (int)(i / per));
    snprintf(out, n, "%s[%zu]", name, i % per);
}

/* The first NaN or Inf among values [lo, hi) of tensor t, held at `at` (on_host 0: by the runtime's find_nonfinite
 * in its memory; 1: by the CPU's in host memory), as a failure naming the element. */
static moe_status tensor_finite(moe_model *m, const moe_model_tensor *t, const moe_real *at, size_t lo, size_t hi,
                                int on_host, const char *what) {
    long long first;
    if (on_host) first = moe_find_nonfinite_cpu(at, hi - lo);
    else MOE_TRY(m->dense->find_nonfinite(m->ops_state, at, hi - lo, &first));
    if (first < 0) return MOE_OK;
    char name[192];
    element_name(m, t, lo + (size_t)first, name, sizeof name);
    return moe_fail(MOE_ERR_NONFINITE, "%s: %s is the first NaN or Inf (world rank %d)", what, name,
                    moe_parallel_ranks(m->par).world_rank);
}

/* The first NaN or Inf of a buffer laid out like the parameters, found tensor by tensor. */
static moe_status check_finite(moe_model *m, const moe_real *buffer, int on_host, const char *what) {
    for (int i = 0; i < m->num_tensors; i++)
        MOE_TRY(tensor_finite(m, &m->tensors[i], buffer + m->tensors[i].offset, 0, m->tensors[i].count, on_host, what));
    return MOE_OK;
}

moe_status moe_model_check_finite(moe_model *m, const moe_real *buffer, const char *what) {
    return check_finite(m, buffer, 0, what);
}

moe_status moe_model_check_finite_host(moe_model *m, const moe_real *host_buffer, const char *what) {
    return check_finite(m, host_buffer, 1, what);
}

moe_status moe_model_check_range_grads_finite(moe_model *m, const char *what) {
    for (int i = 0; i < m->num_tensors; i++) {
        const moe_model_tensor *t = &m->tensors[i];
        const int expert = t->offset >= m->num_dense;
        const moe_zero_region *r = expert ? &m->zero.expert : &m->zero.dense;
        const size_t from = t->offset - (expert ? m->num_dense : 0); /* in the region */
        const size_t lo = from > r->begin ? from : r->begin, hi = from + t->count < r->end ? from + t->count : r->end;
        if (hi > lo)
            MOE_TRY(tensor_finite(m, t, moe_model_range_grads(m, expert) + (lo - r->begin), lo - from, hi - from, 0,
                                  what));
    }
    return MOE_OK;
}

void moe_model_set_checks(moe_model *m, moe_nonfinite_finding *finding) {
    m->finding = finding;
    for (int i = 0; i < m->stage.chunks * m->stage.passes; i++)
        for (int l = 0; l < m->cfg.num_layers; l++)
            if (m->passes[i].moe[l]) moe_layer_set_checks(m->passes[i].moe[l], finding);
}

moe_status moe__model_watch(moe_model *m, const moe_real *data, size_t count, const char *fmt, ...) {
    if (!m->finding || m->finding->found) return MOE_OK;
    long long first;
    MOE_TRY(m->dense->find_nonfinite(m->ops_state, data, count, &first));
    if (first < 0) return m->finding->looks++, MOE_OK;
    char what[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    m->finding->found = 1, m->finding->order = m->finding->looks;
    snprintf(m->finding->where, sizeof m->finding->where, "%s holds the first NaN or Inf (element %lld, world rank %d)",
             what, first, moe_parallel_ranks(m->par).world_rank);
    return MOE_OK;
}

/* ---- forward ---------------------------------------------------------------------------------- */

/* Grouped-query attention in pieces (model.h): attention's k or v, each of the rank's kv heads kv_copies times in a
 * row ([T, kv_heads x kv_copies heads]), from the heads' [T, kv_heads heads]. */
static moe_status copy_kv_heads(moe_model *m, const moe_real *heads, int T, moe_real *copies) {
    const int n = m->kv_heads, c = m->kv_copies;
    const size_t hd = (size_t)m->head_dim, row = hd * sizeof(moe_real);
    for (int h = 0; h < n; h++)
        for (int j = 0; j < c; j++)
            MOE_TRY(moe_runtime_copy_2d(m->rt, copies + (size_t)(h * c + j) * hd, n * c * row, heads + h * hd, n * row,
                                        row, (size_t)T));
    return MOE_OK;
}

/* Its backward's first part: the gradient of the rank's kv heads from attention's gradient of their copies (dkv),
 * each head's copies added in the fixed tree (leaf j holds copy j of every head), overwriting dkv's start
 * ([T, kv_heads heads]). */
static moe_status sum_kv_copies(moe_model *m, int T, moe_real *dkv) {
    const int n = m->kv_heads, c = m->kv_copies;
    if (c == 1) return MOE_OK;
    const size_t hd = (size_t)m->head_dim, row = hd * sizeof(moe_real);
    MOE_TRY(moe_shard_tree_begin(&m->kv_tree, (size_t)T * n * hd));
    for (int j = 0; j < c; j++) {
        moe_real *leaf;
        MOE_TRY(moe_shard_tree_leaf_raw(&m->kv_tree, &leaf));
        for (int h = 0; h < n; h++)
            MOE_TRY(moe_runtime_copy_2d(m->rt, leaf + h * hd, n * row, dkv + (size_t)(h * c + j) * hd, n * c * row,
                                        row, (size_t)T));
        MOE_TRY(moe_shard_tree_push(&m->kv_tree));
    }
    return moe_shard_tree_copy_to(&m->kv_tree, dkv);
}

/* With fewer kv heads than tp the tree goes on over the ranks that share the head: into m->kv_group [T, B], whole on
 * every rank, each rank's head at its columns and -0.0 elsewhere (x + -0.0 = x for every x: each column is its
 * sharers' sum, exactly), added over the group in its fixed tree. */
static moe_status sum_kv_over_group(moe_model *m, int T, const moe_real *head) {
    const size_t hd = (size_t)m->head_dim, B = (size_t)m->cfg.num_kv_heads * hd, n = (size_t)T * B;
    const size_t h = (size_t)(m->seq.tp_rank / (m->seq.tp / m->kv_blocks));
    MOE_TRY(moe_runtime_zero(m->rt, m->kv_group, n * sizeof(moe_real)));
    MOE_TRY(m->dense->scale(m->ops_state, m->kv_group, n, -1.0)); /* -0.0 */
    MOE_TRY(moe_runtime_copy_2d(m->rt, m->kv_group + h * hd, B * sizeof(moe_real), head, hd * sizeof(moe_real),
                                hd * sizeof(moe_real), (size_t)T));
    return moe_comm_allreduce_tree_real(moe_parallel_tensor(m->par), m->kv_group, n);
}

/* k's or v's part of a layer's attention backward (ln1: its input, the group's rows), from attention's gradient of
 * the copies (dkv: m->dk or m->dv): the rank's kv heads' gradient, RoPE's backward (k), the gradient of the rank's
 * block of W (k_proj or v_proj), and the input gradient added into m->dln. */
static moe_status kv_backward(moe_model *m, const moe_real *ln1, moe_real *dkv, int rope, const moe_real *W,
                              moe_real *dW) {
    const moe_model_config *c = &m->cfg;
    const int S = c->seq_len, seqs = m->P->num_seqs, T = seqs * S, d = c->d_model, hd = m->head_dim,
              B = c->num_kv_heads * hd;
    MOE_TRY(sum_kv_copies(m, T, dkv));
    if (m->kv_blocks == m->seq.tp) {
        if (rope) MOE_TRY(m->dense->rope_backward(m->ops_state, dkv, seqs, S, m->kv_heads, hd, c->rope_theta));
        MOE_TRY(moe_shard_grads_tp_column(&m->tp_grads, &m->tpl, dkv, ln1, d, B, dW));
        return moe_tp_column_backward_input(&m->tpl, dkv, W, T, d, B, 1, m->dln);
    }
    /* from the group's whole gradient: the rank's head for its block's weight gradient, then columns [tp_rank w,
     * +w) (w = B / tp) for its part of the plain split's input gradient, with the block's matching rows */
    MOE_TRY(sum_kv_over_group(m, T, dkv));
    if (rope) MOE_TRY(m->dense->rope_backward(m->ops_state, m->kv_group, seqs, S, c->num_kv_heads, hd, c->rope_theta));
    const int sharing = m->seq.tp / m->kv_blocks, w = B / m->seq.tp;
    const size_t pitch = (size_t)B * sizeof(moe_real), hb = (size_t)hd * sizeof(moe_real), wb = w * sizeof(moe_real);
    MOE_TRY(moe_runtime_copy_2d(m->rt, dkv, hb, m->kv_group + (size_t)(m->seq.tp_rank / sharing) * hd, pitch, hb,
                                (size_t)T));
    MOE_TRY(moe_shard_grads_tp_column(&m->tp_grads, m->kv_linear, dkv, ln1, d, B, dW));
    MOE_TRY(moe_runtime_copy_2d(m->rt, dkv, wb, m->kv_group + (size_t)m->seq.tp_rank * w, pitch, wb, (size_t)T));
    return moe_tp_column_backward_input(&m->tpl, dkv, W + (size_t)(m->seq.tp_rank % sharing) * w * d, T, d, B, 1,
                                        m->dln);
}

/* Layer l's attention block up to its output, for num_seqs sequences (the tensor group's: T rows): ln1 =
 * rmsnorm(resid[l]) on this rank's slice (kept), gathered over the group into m->tmp at tp > 1 (backward gathers it
 * again: Megatron's sequence parallelism keeps the slice); q, k, v of this rank's heads (all of them at tp 1) with
 * RoPE; attention into attn_y (its statistics or probabilities in att). */
static moe_status attention_block_forward(moe_model *m, int l, int num_seqs) {
    const moe_model_config *c = &m->cfg;
    const int S = c->seq_len, T = num_seqs * S, Ts = T / m->seq.tp, d = c->d_model, H = c->num_heads / m->seq.tp,
              KV = m->kv_heads, hd = m->head_dim, A = c->num_heads * hd, B = c->num_kv_heads * hd;
    const moe_dense_ops *dense = m->dense;
    moe_dense_state *s = m->ops_state;
    const moe_model_layer_params *w = &m->c.layers[l];
    layer_acts *a = &m->P->acts[l];
    MOE_TRY(dense->rmsnorm_forward(s, m->P->resid[l], w->attn_norm, Ts, d, c->norm_eps, a->ln1, a->rstd1));
    MOE_TRY(moe__model_watch(m, a->ln1, (size_t)Ts * d, "layer %d: the attention norm's output", l));
    const moe_real *x; /* q/k/v read the group's rows */
    MOE_TRY(moe_tp_group_rows(&m->seq, a->ln1, T, d, m->tmp, &x));
    /* k and v of the rank's kv heads: in place, or before their copies (in backward's scratch) */
    moe_real *k = m->kv_copies > 1 ? m->dk : a->k, *v = m->kv_copies > 1 ? m->dv : a->v;
    MOE_TRY(moe_tp_column_forward(&m->tpl, x, w->wq, T, d, A, a->q));
    MOE_TRY(moe_tp_column_forward(m->kv_linear, x, w->wk, T, d, B, k));
    MOE_TRY(moe_tp_column_forward(m->kv_linear, x, w->wv, T, d, B, v));
    MOE_TRY(moe__model_watch(m, a->q, (size_t)T * H * hd, "layer %d: q", l));
    MOE_TRY(moe__model_watch(m, k, (size_t)T * KV * hd, "layer %d: k", l));
    MOE_TRY(moe__model_watch(m, v, (size_t)T * KV * hd, "layer %d: v", l));
    MOE_TRY(dense->rope_forward(s, a->q, num_seqs, S, H, hd, c->rope_theta));
    MOE_TRY(dense->rope_forward(s, k, num_seqs, S, KV, hd, c->rope_theta));
    if (m->kv_copies > 1) {
        MOE_TRY(copy_kv_heads(m, k, T, a->k));
        MOE_TRY(copy_kv_heads(m, v, T, a->v));
    }
    const int KVC = KV * m->kv_copies; /* the kv heads attention reads */
    if (c->attention == MOE_ATTENTION_FUSED)
        MOE_TRY(dense->attention_fused_forward(s, a->q, a->k, a->v, num_seqs, S, H, KVC, hd, a->att, a->attn_y));
    else
        MOE_TRY(dense->attention_forward(s, a->q, a->k, a->v, num_seqs, S, H, KVC, hd, a->att, a->attn_y));
    return moe__model_watch(m, a->attn_y, (size_t)T * H * hd, "layer %d: the attention output", l);
}

/* From attn_y (T rows) to the FFN's input on this rank's slice: resid_mid = resid[l] + o_proj(attn_y) (o_proj's whole
 * output in m->tmp: at tp > 1 the group's sum, of which the slice is taken), ln2. */
static moe_status attention_residual_forward(moe_model *m, int l, int T) {
    const moe_model_config *c = &m->cfg;
    const size_t Tsd = (size_t)(T / m->seq.tp) * c->d_model;
    const moe_model_layer_params *w = &m->c.layers[l];
    layer_acts *a = &m->P->acts[l];
    MOE_TRY(moe_tp_row_forward(&m->tpl, a->attn_y, w->wo, T, c->num_heads * m->head_dim, c->d_model, m->tmp));
    MOE_TRY(m->dense->add(m->ops_state, m->P->resid[l], m->tmp + moe_tp_slice_first(&m->seq, T) * c->d_model, Tsd,
                          a->resid_mid));
    MOE_TRY(moe__model_watch(m, a->resid_mid, Tsd, "layer %d: the residual after attention (o_proj)", l));
    /* a tensor-parallel dense FFN reads the group's rows: the slice's norm gathered (o_proj's output is spent) */
    const int gather = m->seq.tp > 1 && m->pieces && !moe_model_layer_is_moe(c, l);
    moe_real *ln2 = gather ? m->tmp : a->ln2;
    MOE_TRY(m->dense->rmsnorm_forward(m->ops_state, a->resid_mid, w->ffn_norm, T / m->seq.tp, c->d_model, c->norm_eps,
                                      ln2, a->rstd2));
    MOE_TRY(moe__model_watch(m, ln2, Tsd, "layer %d: the FFN norm's output", l));
    return gather ? moe_tp_gather_slices(&m->seq, ln2, T, c->d_model, a->ln2) : MOE_OK;
}

/* A dense FFN in tensor-parallel pieces (tp_shards > 1): h1, h3 of this rank's d_ff / tp columns from ln2 (the group's
 * T rows), act, then down_proj's sum over the group; y (optional: a recompute needs only h1, h3, act) gets this rank's
 * slice of its rows. */
static moe_status tp_dense_ffn_forward(moe_model *m, int l, int T, moe_real *y) {
    const moe_model_config *c = &m->cfg;
    const moe_layer_weights *w = &m->c.layers[l].ffn;
    layer_acts *a = &m->P->acts[l];
    const int d = c->d_model, F = c->d_ff;
    MOE_TRY(moe_tp_column_forward(&m->tpl, a->ln2, w->w1, T, d, F, a->h1));
    MOE_TRY(moe_tp_column_forward(&m->tpl, a->ln2, w->w3, T, d, F, a->h3));
    MOE_TRY(m->dense->swiglu_act_forward(m->ops_state, a->h1, a->h3, (size_t)T * (F / m->seq.tp), a->act));
    if (!y) return MOE_OK;
    moe_real *whole = m->seq.tp > 1 ? m->dln : y; /* backward's scratch, free in forward */
    MOE_TRY(moe_tp_row_forward(&m->tpl, a->act, w->w2, T, F, d, whole));
    if (m->seq.tp == 1) return MOE_OK;
    return moe_tp_take_slice(&m->seq, whole, T, d, y);
}

/* Its backward from dL/dy of the slice (m->dresid) to dL/dln2 of the slice at m->dln's start; the weight gradients
 * over the group's rows (m->tp_grads). */
static moe_status tp_dense_ffn_backward(moe_model *m, int l, int T) {
    const moe_model_config *c = &m->cfg;
    const moe_layer_weights *w = &m->c.layers[l].ffn;
    moe_layer_weights *gw = &m->g.layers[l].ffn;
    layer_acts *a = &m->P->acts[l];
    const int d = c->d_model, F = c->d_ff;
    const moe_real *dy = m->dresid;
    if (m->seq.tp > 1) { /* the group's rows of dL/dy (m->tmp: forward's, spent once the layer is recomputed) */
        MOE_TRY(moe_tp_gather_slices(&m->seq, m->dresid, T, d, m->tmp));
        dy = m->tmp;
    }
    MOE_TRY(moe_shard_grads_tp_row(&m->tp_grads, &m->tpl, dy, a->act, F, d, gw->w2));
    MOE_TRY(moe_tp_row_backward_input(&m->tpl, dy, w->w2, T, F, d, 0, m->tp_dh1));
    MOE_TRY(m->dense->swiglu_act_backward(m->ops_state, a->h1, a->h3, (size_t)T * (F / m->seq.tp), m->tp_dh1,
                                          m->tp_dh3));
    MOE_TRY(moe_shard_grads_tp_column(&m->tp_grads, &m->tpl, m->tp_dh1, a->ln2, d, F, gw->w1));
    MOE_TRY(moe_shard_grads_tp_column(&m->tp_grads, &m->tpl, m->tp_dh3, a->ln2, d, F, gw->w3));
    MOE_TRY(moe_tp_column_backward_input(&m->tpl, m->tp_dh1, w->w1, T, d, F, 0, m->dln));
    MOE_TRY(moe_tp_column_backward_input(&m->tpl, m->tp_dh3, w->w3, T, d, F, 1, m->dln));
    return moe_tp_take_slice(&m->seq, m->dln, T, d, m->dln); /* the slice to dln's start */
}

/* Before layer l's backward: what cfg.moe.recompute did not keep, rebuilt from what forward kept by the forward's
 * own ops on the same inputs (bitwise the same); an MoE layer reuses its routing (moe_layer_recompute). */
static moe_status recompute_layer(moe_model *m, int l, int T) {
    const moe_model_config *c = &m->cfg;
    const moe_recompute r = c->moe.recompute;
    layer_acts *a = &m->P->acts[l];
    const moe_layer_weights *w = &m->c.layers[l].ffn;
    if (r >= MOE_RECOMPUTE_ATTENTION) MOE_TRY(attention_block_forward(m, l, m->P->num_seqs));
    if (r == MOE_RECOMPUTE_FULL) MOE_TRY(attention_residual_forward(m, l, T));
    if (m->P->moe[l]) return r == MOE_RECOMPUTE_FULL ? moe_layer_recompute(m->P->moe[l], w, a->ln2) : MOE_OK;
    if (r < MOE_RECOMPUTE_MOE) return MOE_OK; /* the dense FFN's intermediates (its output in m->tmp, unused) */
    if (m->pieces) return tp_dense_ffn_forward(m, l, T, NULL);
    return m->dense->swiglu_forward(m->ops_state, w, T, c->d_model, c->d_ff, a->ln2, a->h1, a->h3, a->act, m->tmp);
}

/* The FFN of layer l on this rank's slice of the group's T rows, its output into m->tmp. */
static moe_status ffn_forward(moe_model *m, int l, int T) {
    const moe_model_config *c = &m->cfg;
    layer_acts *a = &m->P->acts[l];
    const moe_layer_weights *w = &m->c.layers[l].ffn;
    if (m->P->moe[l]) return moe_layer_forward(m->P->moe[l], w, a->ln2, T / m->seq.tp, m->tmp, &m->P->stats[l]);
    if (m->pieces) return tp_dense_ffn_forward(m, l, T, m->tmp);
    return m->dense->swiglu_forward(m->ops_state, w, T, c->d_model, c->d_ff, a->ln2, a->h1, a->h3, a->act, m->tmp);
}

moe_status moe_model_select_pass(moe_model *m, int chunk, int pass) {
    if (chunk < 0 || chunk >= m->stage.chunks || pass < 0 || pass >= m->stage.passes) return MOE_ERR_INVALID_ARG;
    m->P = &m->passes[chunk * m->stage.passes + pass];
    return MOE_OK;
}

int moe_model_num_passes(const moe_model *m) { return m->stage.passes; }

/* The first stage's input: the embedding of this rank's slice of the group's T tokens (host) into resid[0]. At tp > 1
 * the vocabulary is split: each rank looks up the group's tokens in its block (-0.0 for the others' ids), the group
 * adds them (one value and -0.0s: exact) and each keeps its slice. */
/* The selected pass's forward through this stage: the embedding of the tokens (first stage) or the previous stage's
 * output x, the stage's layers, then on the last stage the final norm, the logits (into logits_out when asked) and,
 * with targets, the loss. Keeps what backward needs unless it is the last stage without targets. At tp > 1 the inputs
 * and targets are the tensor group's num_seqs sequences and everything but attention runs on this rank's slice of
 * their rows: x, the output, the logits and the loss are the slice's. */
static moe_status stage_forward(moe_model *m, const int *inputs, const moe_real *x, const int *targets, int num_seqs,
                                double *loss_sum, moe_real *logits_out) {
    const moe_model_config *c = &m->cfg;
    model_pass *P = m->P;
    const int first = m->first[P->chunk], last = m->last[P->chunk], embeds = first == 0, heads = last == c->num_layers;
    if (num_seqs < 1 || num_seqs > m->max_seqs || (embeds ? !inputs : !x) || (heads && targets && !loss_sum))
        return MOE_ERR_INVALID_ARG;
    const int S = c->seq_len, T = num_seqs * S, d = c->d_model;
    if (T % m->seq.tp)
        return moe_fail(MOE_ERR_INVALID_ARG, "%d sequences of %d tokens do not split into %d equal slices (tp)",
                        num_seqs, S, m->seq.tp);
    const int Ts = T / m->seq.tp; /* this rank's slice of the rows (all of them at tp 1) */
    const moe_dense_ops *dense = m->dense;
    moe_dense_state *s = m->ops_state;
    const size_t Td = (size_t)Ts * d;
    P->has_forward = 0;
    P->num_seqs = num_seqs;
    MOE_TRY(refresh_compute_weights(m));
    if (embeds) {
        MOE_TRY(moe__model_embed(m, inputs, T));
        MOE_TRY(moe__model_watch(m, P->resid[0], Td, "the embedding output"));
    } else {
        MOE_TRY(moe_runtime_copy(m->rt, P->resid[first], x, Td * sizeof(moe_real)));
    }
    for (int l = first; l < last; l++) {
        const layer_acts *a = &P->acts[l];
        MOE_TRY(attention_block_forward(m, l, num_seqs));
        MOE_TRY(attention_residual_forward(m, l, T));
        MOE_TRY(ffn_forward(m, l, T));
        MOE_TRY(moe__model_watch(m, m->tmp, Td, "layer %d: the %s output", l, P->moe[l] ? "MoE" : "dense FFN"));
        MOE_TRY(dense->add(s, a->resid_mid, m->tmp, Td, P->resid[l + 1]));
    }
    m->last_forward[P->chunk] = P;
    if (!heads) return P->has_forward = 1, MOE_OK;
    MOE_TRY(moe__model_head_forward(m, targets, T, loss_sum, logits_out));
    P->has_forward = targets != NULL; /* a forward without targets (logits only) has nothing to go back through */
    return MOE_OK;
}

moe_status moe_model_forward(moe_model *m, const int *inputs, const int *targets, int num_seqs, double *loss_sum,
                             moe_real *logits_out) {
    if (!m->embeds || !m->heads) return MOE_ERR_INVALID_ARG; /* a stage: moe_model_stage_forward */
    return stage_forward(m, inputs, NULL, targets, num_seqs, loss_sum, logits_out);
}

moe_status moe_model_stage_forward(moe_model *m, const int *inputs, const moe_real *x, const int *targets,
                                   int num_seqs, double *loss_sum, moe_real *logits_out) {
    return stage_forward(m, inputs, x, targets, num_seqs, loss_sum, logits_out);
}

const moe_real *moe_model_stage_output(const moe_model *m) { return m->P->resid[m->last[m->P->chunk]]; }

/* ---- backward --------------------------------------------------------------------------------- */

/* From dL/dffn_out (m->dresid) to dL/dln2 (m->dln, overwritten), on this rank's slice of the group's T rows. */
static moe_status ffn_backward(moe_model *m, int l, int T) {
    const moe_model_config *c = &m->cfg;
    layer_acts *a = &m->P->acts[l];
    const moe_layer_weights *w = &m->c.layers[l].ffn;
    moe_layer_weights *gw = &m->g.layers[l].ffn;
    if (m->P->moe[l]) return moe_layer_backward(m->P->moe[l], w, m->dresid, m->dln, gw);
    if (m->pieces) return tp_dense_ffn_backward(m, l, T);
    return moe_shard_grads_swiglu(&m->shard_grads, w, gw, c->d_model, c->d_ff, a->ln2, a->h1, a->h3, a->act,
                                  m->dresid, m->dln);
}

moe_status moe_model_sync_tied(moe_model *m) {
    if (!m->tied.grad) return MOE_OK;
    return moe_tied_grads_sync_weights(&m->tied, m->embeds ? m->p.embedding : m->p.lm_head);
}

/* The selected pass's backward through this stage, from the loss (last stage, dL/dloss_t = loss_scale) or from dy,
 * the gradient of the stage's output, down to the embedding (first stage) or to dL/dx in m->dresid. A tied lm_head's
 * gradient: with combine_tied (moe_model_backward) added into the embedding's at once, as one rank adds them; else
 * kept apart for the step's sum (models/tied_grads.h) — here without the world-invariant sums and under ZeRO-2 (which
 * sums each layer in backward), by moe_model_reduce_chunk_grads with them. */
static moe_status stage_backward(moe_model *m, moe_real loss_scale, const moe_real *dy, int combine_tied) {
    model_pass *P = m->P;
    const int first = m->first[P->chunk], last = m->last[P->chunk], embeds = first == 0,
              heads = last == m->cfg.num_layers;
    if (!P->has_forward) return MOE_ERR_NO_FORWARD;
    if (!heads && !dy) return MOE_ERR_INVALID_ARG;
    const moe_model_config *c = &m->cfg;
    const int S = c->seq_len, T = P->num_seqs * S, Ts = T / m->seq.tp, d = c->d_model, V = c->vocab_size,
              H = c->num_heads / m->seq.tp, KVC = m->kv_heads * m->kv_copies, hd = m->head_dim, A = c->num_heads * hd;
    const moe_dense_ops *dense = m->dense;
    moe_dense_state *s = m->ops_state;
    moe_shard_grads *sg = &m->shard_grads; /* the weight gradients: per shard, or over all rows, of this rank's slice */
    moe_shard_grads *tg = &m->tp_grads;    /* the tensor-parallel pieces', over the tensor group's rows */
    sg->num_tokens = Ts, tg->num_tokens = T;
    moe_zero_grads *zg = c->zero == 2 ? &m->zero_grads : NULL; /* ZeRO-2: each layer's gradients summed as it ends */
    if (zg) MOE_TRY(moe_zero_grads_begin_backward(zg));
    const size_t Td = (size_t)Ts * d; /* the slice's residual stream */
    if (heads) {
        MOE_TRY(moe__model_head_backward(m, T, loss_scale));
    } else {
        MOE_TRY(moe_runtime_copy(m->rt, m->dresid, dy, Td * sizeof(moe_real)));
    }
    /* at tp > 1 the attention block's gradients span the group's rows: dln holds them whole, the slice is its part */
    moe_real *dln_slice = m->dln + moe_tp_slice_first(&m->seq, T) * d;
    for (int l = last - 1; l >= first; l--) {
        const moe_model_layer_params *w = &m->c.layers[l];
        moe_model_layer_params *gw = &m->g.layers[l];
        layer_acts *a = &P->acts[l];
        if (zg) MOE_TRY(moe_zero_grads_begin_layer(zg, l));
        MOE_TRY(recompute_layer(m, l, T));
        /* resid[l+1] = resid_mid + ffn(ln2(resid_mid)): dresid flows to both */
        MOE_TRY(ffn_backward(m, l, T));
        MOE_TRY(moe__model_watch(m, m->dln, Td, "layer %d: the gradient into the %s", l, P->moe[l] ? "MoE layer" : "dense FFN"));
        MOE_TRY(moe_shard_grads_rmsnorm(sg, a->resid_mid, w->ffn_norm, a->rstd2, m->dln, d, m->dresid, gw->ffn_norm));
        MOE_TRY(moe__model_watch(m, m->dresid, Td, "layer %d: the gradient of the residual after attention", l));
        /* resid_mid = resid[l] + wo(attention(...)): o_proj's output gradient over the group's rows */
        const moe_real *dout = m->dresid;
        if (m->seq.tp > 1) {
            MOE_TRY(moe_tp_gather_slices(&m->seq, m->dresid, T, d, m->dln));
            dout = m->dln;
        }
        MOE_TRY(moe_shard_grads_tp_row(tg, &m->tpl, dout, a->attn_y, A, d, gw->wo));
        MOE_TRY(moe_tp_row_backward_input(&m->tpl, dout, w->wo, T, A, d, 0, m->dattn));
        if (c->attention == MOE_ATTENTION_FUSED)
            MOE_TRY(dense->attention_fused_backward(s, a->q, a->k, a->v, a->attn_y, a->att, m->dattn, P->num_seqs, S, H,
                                                    KVC, hd, m->dq, m->dk, m->dv));
        else
            MOE_TRY(dense->attention_backward(s, a->q, a->k, a->v, a->att, m->dattn, P->num_seqs, S, H, KVC, hd, m->dq,
                                              m->dk, m->dv));
        MOE_TRY(dense->rope_backward(s, m->dq, P->num_seqs, S, H, hd, c->rope_theta));
        const moe_real *ln1; /* the group's rows, gathered again (m->tmp is free from here on) */
        MOE_TRY(moe_tp_group_rows(&m->seq, a->ln1, T, d, m->tmp, &ln1));
        MOE_TRY(moe_shard_grads_tp_column(tg, &m->tpl, m->dq, ln1, d, A, gw->wq));
        MOE_TRY(moe_tp_column_backward_input(&m->tpl, m->dq, w->wq, T, d, A, 0, m->dln));
        MOE_TRY(kv_backward(m, ln1, m->dk, 1, w->wk, gw->wk)); /* dln += k's and v's input gradients */
        MOE_TRY(kv_backward(m, ln1, m->dv, 0, w->wv, gw->wv));
        MOE_TRY(moe__model_watch(m, dln_slice, Td, "layer %d: the gradient of the attention norm's output", l));
        MOE_TRY(moe_shard_grads_rmsnorm(sg, P->resid[l], w->attn_norm, a->rstd1, dln_slice, d, m->dresid,
                                        gw->attn_norm));
        MOE_TRY(moe__model_watch(m, m->dresid, Td, "layer %d: the gradient of the layer's input", l));
        if (zg) MOE_TRY(moe_zero_grads_end_layer(zg, l));
    }
    if (embeds && m->seq.tp > 1) { /* the vocabulary block's rows, from the group's tokens */
        MOE_TRY(moe_tp_gather_slices(&m->seq, m->dresid, T, d, m->dln));
        MOE_TRY(moe_shard_grads_embedding(tg, m->dln, P->inputs, d, m->seq.tp_rank * (V / m->seq.tp), V / m->seq.tp,
                                          m->g.embedding));
    } else if (embeds) {
        MOE_TRY(moe_shard_grads_embedding(sg, m->dresid, P->inputs, d, 0, V, m->g.embedding));
    }
    if (heads && m->tied.grad) { /* the tied lm_head's gradient: a vocabulary block's at tp > 1 */
        if (combine_tied)
            MOE_TRY(dense->add(s, m->g.embedding, m->tied.grad, (size_t)(V / m->seq.tp) * d, m->g.embedding));
        else if (zg || !m->local_shards)
            MOE_TRY(moe_tied_grads_accumulate(&m->tied, moe_parallel_data(m->par), m->local_shards > 0));
    }
    if (zg) MOE_TRY(moe_zero_grads_end_backward(zg, embeds, heads));
    P->has_forward = 0;
    return MOE_OK;
}

moe_status moe_model_backward(moe_model *m, moe_real loss_scale) {
    if (!m->embeds || !m->heads) return MOE_ERR_INVALID_ARG; /* a stage: moe_model_stage_backward */
    return stage_backward(m, loss_scale, NULL, 1);
}

moe_status moe_model_stage_backward(moe_model *m, moe_real loss_scale, const moe_real *dy) {
    return stage_backward(m, loss_scale, dy, 0);
}

const moe_real *moe_model_stage_input_grad(const moe_model *m) { return m->dresid; }

void moe_model_chunk_slices(const moe_model *m, int chunk, size_t *dense_from, size_t *dense_count,
                            size_t *expert_from, size_t *expert_count) {
    *dense_from = m->chunk_dense[chunk].from, *dense_count = m->chunk_dense[chunk].count;
    *expert_from = m->chunk_expert[chunk].from, *expert_count = m->chunk_expert[chunk].count;
}

int moe_model_chunk_heads(const moe_model *m, int chunk) { return chunk_heads(m, chunk); }

moe_status moe_model_zero_chunk_grads(moe_model *m, int chunk) {
    if (m->cfg.zero == 2) return MOE_OK; /* each layer's window is zeroed before its backward */
    const moe_zero_slice d = m->chunk_dense[chunk], e = m->chunk_expert[chunk];
    MOE_TRY(moe_runtime_zero(m->rt, m->grads + d.from, d.count * sizeof(moe_real)));
    return moe_runtime_zero(m->rt, m->grads + m->num_dense + e.from, e.count * sizeof(moe_real));
}

typedef moe_status (*allreduce_fn)(moe_comm *, moe_real *, size_t);

/* The dense gradients [from, from + count) summed over the ranks that share them: the stage's; at tp > 1 in runs of
 * consecutive tensors alike, the tensor-parallel pieces' over the data-parallel group (model.h). */
static moe_status reduce_dense(moe_model *m, size_t from, size_t count, allreduce_fn allreduce) {
    if (m->seq.tp == 1) return allreduce(moe_parallel_stage(m->par), m->grads + from, count);
    size_t run_from = from;
    for (int i = 0; i < m->num_tensors; i++) {
        const moe_model_tensor *t = &m->tensors[i], *next = i + 1 < m->num_tensors ? &m->tensors[i + 1] : NULL;
        if (t->offset < from || t->offset >= from + count) continue;
        const int pieces = t->split != MOE_SPLIT_NONE;
        if (next && next->offset < from + count && (next->split != MOE_SPLIT_NONE) == pieces) continue;
        const size_t end = t->offset + t->count;
        MOE_TRY(allreduce(pieces ? moe_parallel_data(m->par) : moe_parallel_stage(m->par), m->grads + run_from,
                          end - run_from));
        run_from = end;
    }
    return MOE_OK;
}

moe_status moe_model_reduce_chunk_grads(moe_model *m, int chunk) {
    if (m->cfg.zero == 2) return MOE_OK; /* backward summed each layer's as it ended */
    const allreduce_fn allreduce =
        m->local_shards ? moe_comm_allreduce_tree_real : moe_comm_allreduce_sum_real;
    const moe_zero_slice d = m->chunk_dense[chunk], e = m->chunk_expert[chunk];
    MOE_TRY(reduce_dense(m, d.from, d.count, allreduce));
    if (m->local_shards && chunk_heads(m, chunk) && m->tied.grad) /* the micro-batch's tied lm_head gradient, apart */
        MOE_TRY(moe_tied_grads_accumulate(&m->tied, moe_parallel_data(m->par), 1)); /* the stage's at tp 1 */
    if (!e.count) return MOE_OK;
    return allreduce(moe_parallel_expert_dp(m->par), m->grads + m->num_dense + e.from, e.count);
}

moe_status moe_model_reduce_grads(moe_model *m) {
    if (m->cfg.zero == 2) return MOE_OK; /* backward summed each layer's as it ended */
    /* with shards: the upper levels of the shard tree (each rank's buffer is its subtree's root) */
    const allreduce_fn allreduce =
        m->local_shards ? moe_comm_allreduce_tree_real : moe_comm_allreduce_sum_real;
    MOE_TRY(reduce_dense(m, 0, m->num_dense, allreduce));
    if (!m->num_expert) return MOE_OK;
    return allreduce(moe_parallel_expert_dp(m->par), m->grads + m->num_dense, m->num_expert);
}

int moe_model_local_shards(const moe_model *m) { return m->local_shards; }

moe_status moe_model_update_expert_bias(moe_model *m) {
    if (m->cfg.moe.score_func != MOE_SCORE_SIGMOID) return MOE_OK;
    for (int c = 0; c < m->stage.chunks; c++) { /* one bias per layer, moved by its chunk's last forward's counts */
        const model_pass *P = m->last_forward[c];
        if (!P) return MOE_ERR_NO_FORWARD;
        for (int l = m->first[c]; l < m->last[c]; l++)
            if (P->moe[l]) MOE_TRY(moe_layer_update_expert_bias(P->moe[l]));
    }
    return MOE_OK;
}
