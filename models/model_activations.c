/* model_activations.c — the model's activation buffers (model_activations.h's lists): each pass's, those every pass
 * shares under --recompute, the scratch; their sizes for moe-plan's and moe-train's memory check (the footprint). */
#include "models/model_activations.h"

#include <stdlib.h>
#include <string.h>

#include "core/fail.h"
#include "models/tensors.h"

#define COUNT_ONE(...) +1
enum {
    LAYER_BUFFERS = 0 MOE_MODEL_LAYER_ACTIVATIONS(COUNT_ONE),
    PASS_BUFFERS = 0 MOE_MODEL_PASS_BUFFERS(COUNT_ONE),
    SCRATCH_BUFFERS = 0 MOE_MODEL_SCRATCH_BUFFERS(COUNT_ONE)
};
#undef COUNT_ONE

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
    const model_dims D = moe__model_dims(m);
    const size_t tp = (size_t)m->seq.tp, TG = (size_t)m->max_seqs * c->seq_len, T = TG / tp, d = D.d,
                 S = c->seq_len, A = D.A, BK = D.BK; /* T: this rank's slice (model_activations.h) */
    const moe_qk_norm qk = moe_model_qk_norm(c);
    const size_t KV = (size_t)c->num_kv_heads, QK = qk != MOE_QK_NORM_NONE,
                 QR = qk == MOE_QK_NORM_HEAD ? (size_t)c->num_heads : QK, KN = D.KN,
                 KR = qk == MOE_QK_NORM_HEAD ? (KV > tp ? KV : tp) : QK; /* rows per token (T: the slice's) */
    const size_t ML = moe_model_mla(c), QL = (size_t)c->q_lora_rank, KL = (size_t)c->kv_lora_rank,
                 HV = (size_t)c->num_heads * c->v_head_dim; /* multi-head latent attention's */
    const size_t FD = moe_model_layer_is_moe(c, l) ? 0 : T * D.DF;
    const size_t SH = moe_model_layer_is_moe(c, l) && c->shared_d_ff > 0, SF = SH * T * (size_t)c->shared_d_ff,
                 SG = SH && moe_model_shared_gate(c);
    const size_t ATT = (size_t)m->max_seqs * c->num_heads * S * (c->attention == MOE_ATTENTION_FUSED ? 1 : S) / tp;
#define LAYER_NBYTES(name, count, rebuilt_from) (count) * sizeof(moe_real),
    const size_t n[LAYER_BUFFERS] = {MOE_MODEL_LAYER_ACTIVATIONS(LAYER_NBYTES)};
#undef LAYER_NBYTES
    memcpy(nbytes, n, sizeof n);
}

/* The bytes of a pass's own buffers for chunk c (MOE_MODEL_PASS_BUFFERS' order: the tokens on the embedding's chunk,
 * the head's on the last one, 0 elsewhere) and of the scratch (MOE_MODEL_SCRATCH_BUFFERS'). */
static void model_buffer_nbytes(const moe_model *m, int c, size_t pass[PASS_BUFFERS], size_t scratch[SCRATCH_BUFFERS]) {
    const model_dims D = moe__model_dims(m);
    const size_t TG = (size_t)m->max_seqs * m->cfg.seq_len, T = TG / m->seq.tp, d = D.d, A = D.A,
                 BK = D.BK, V = m->cfg.vocab_size;
    const size_t KVG = moe_model_kv_blocks(&m->cfg, m->seq.tp) < m->seq.tp ? TG * D.B : 0;
    const size_t QB = moe_model_qkv_bias(&m->cfg), SH = m->cfg.shared_d_ff > 0 && m->cfg.moe.num_experts > 1,
                 SG = SH && moe_model_shared_gate(&m->cfg);
    const size_t HNV = (size_t)D.HNV * moe_model_mla(&m->cfg), DR = (size_t)m->cfg.qk_rope_dim, /* MLA's */
                 LAT = (size_t)(D.KLR > D.QL ? D.KLR : D.QL) * moe_model_mla(&m->cfg);
    const size_t QT = moe_model_qk_norm(&m->cfg) != MOE_QK_NORM_NONE && m->seq.tp > 1,
                 QH = moe_model_qk_norm(&m->cfg) == MOE_QK_NORM_HEAD, H = (size_t)m->cfg.num_heads,
                 HD = (size_t)m->head_dim; /* the q/k norms' scratch at tp > 1 */
#define MODEL_NBYTES(name, type, count) (count) * sizeof(type),
    const size_t p[PASS_BUFFERS] = {MOE_MODEL_PASS_BUFFERS(MODEL_NBYTES)};
    const size_t n[SCRATCH_BUFFERS] = {MOE_MODEL_SCRATCH_BUFFERS(MODEL_NBYTES)};
#undef MODEL_NBYTES
    memcpy(pass, p, sizeof p), memcpy(scratch, n, sizeof n);
    pass[0] = moe__model_chunk_embeds(m, c) ? pass[0] : 0; /* inputs */
    for (int i = 1; i < PASS_BUFFERS; i++) pass[i] = moe__model_chunk_heads(m, c) ? pass[i] : 0;
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
    for (FIRST_LAYER(m, c, l); l >= 0; l = moe__model_next_layer(m, &c, l)) {
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
        (size_t)m->max_seqs * m->cfg.seq_len / m->seq.tp * m->cfg.d_model * sizeof(moe_real);
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

void moe__model_free_activations(moe_model *m) {
    for (int i = m->stage.chunks * m->stage.passes - 1; m->passes && i >= 0; i--) /* owners last */
        free_pass(m, &m->passes[i]);
    free(m->passes);
    m->passes = NULL;
    void **own[SCRATCH_BUFFERS];
    scratch_buffer_ptrs(m, own);
    for (int i = 0; i < SCRATCH_BUFFERS && m->rt; i++) moe_runtime_free(m->rt, *own[i]);
    if (m->rt) moe_runtime_host_free(m->rt, m->staged_tokens);
    m->staged_tokens = NULL;
}

/* m->ones (with q/k/v biases): 1.0 in each of the group's rows. */
static moe_status fill_ones(moe_model *m) {
    if (!moe_model_qkv_bias(&m->cfg)) return MOE_OK; /* (an allocation of 0 bytes need not be NULL) */
    const size_t n = (size_t)m->max_seqs * m->cfg.seq_len;
    moe_real *host = malloc(n * sizeof *host);
    if (!host) return MOE_ERR_OUT_OF_MEMORY;
    for (size_t i = 0; i < n; i++) host[i] = 1;
    const moe_status st = moe_runtime_upload(m->rt, m->ones, host, n * sizeof *host);
    free(host);
    return st;
}

/* Allocates every pass's activations and the scratch, for T = max_seqs * S tokens, in the runtime's memory. */
moe_status moe__model_alloc_activations(moe_model *m) {
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
    MOE_TRY(moe_runtime_regrow(m->rt, ptrs, nbytes, SCRATCH_BUFFERS));
    MOE_TRY(moe_runtime_host_alloc(m->rt, 2 * (size_t)m->max_seqs * m->cfg.seq_len * sizeof(int),
                                   (void **)&m->staged_tokens));
    return fill_ones(m);
}


moe_model_footprint moe_model_stage_footprint(const moe_model_config *cfg, int tp, int ep,
                                              const moe_model_stage *stage, int max_seqs) {
    moe_model m = {.cfg = *cfg, .max_seqs = max_seqs, .head_dim = moe_model_head_dim(cfg),
                   .num_local_experts = moe_config_num_local_experts(&cfg->moe, ep), .seq.tp = tp};
    moe_model_footprint f = {0};
    if (moe__model_set_stage(&m, stage) != MOE_OK) return f; /* the caller's create fails with the message */
    moe__model_lay_out(&m); /* no tensor table: it only counts */
    f.dense_params = m.num_dense, f.expert_params = m.num_expert;
    const size_t T = (size_t)max_seqs * cfg->seq_len / tp; /* this rank's slice */
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

moe_model_footprint moe_model_config_footprint(const moe_model_config *cfg, int tp, int ep, int max_seqs) {
    const moe_model_stage whole = moe_model_stage_whole(cfg);
    return moe_model_stage_footprint(cfg, tp, ep, &whole, max_seqs);
}
