/* tensors.c — the model's tensor table (model.h's X-macro lists laid out for the layers this rank holds), the views
 * of a buffer laid out by it, the bf16 copies the GEMMs read, and the stage: which chunks of layers a model holds. */
#include "models/tensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fail.h"

model_dims moe__model_dims(const moe_model *m) {
    const moe_model_config *c = &m->cfg;
    const long A = (long)c->num_heads * m->head_dim, B = (long)c->num_kv_heads * m->head_dim;
    const moe_qk_norm qk = moe_model_qk_norm(c);
    return (model_dims){.d = c->d_model, .A = A, .B = B, .F = c->d_ff, .DF = moe_model_dense_d_ff(c),
                        .E = c->moe.num_experts,
                        .BK = B * moe_model_kv_chunks(c, m->seq.tp), .QN = qk == MOE_QK_NORM_HEAD ? m->head_dim : A,
                        .KN = qk == MOE_QK_NORM_HEAD ? m->head_dim : B, .SF = c->shared_d_ff,
                        .QL = c->q_lora_rank, .KLR = c->kv_lora_rank + c->qk_rope_dim, .KL = c->kv_lora_rank,
                        .HNV = (long)c->num_heads * (m->head_dim - c->qk_rope_dim + c->v_head_dim),
                        .HV = (long)c->num_heads * c->v_head_dim};
}

/* A tensor's Hugging Face name after "model.layers.N.": the lists' (Mixtral's), or for the other families their MoE
 * block's ("mlp.gate.weight"; an expert's "mlp.experts.%d." + the dense FFN's names; DeepSeek's shared experts
 * "mlp.shared_experts."). */
static const char *family_name(const moe_model *m, const char *mixtral) {
    static const char *const renamed[][2] = {
        {"block_sparse_moe.gate.weight", "mlp.gate.weight"},
        {"block_sparse_moe.experts.%d.w1.weight", "mlp.experts.%d.gate_proj.weight"},
        {"block_sparse_moe.experts.%d.w3.weight", "mlp.experts.%d.up_proj.weight"},
        {"block_sparse_moe.experts.%d.w2.weight", "mlp.experts.%d.down_proj.weight"},
    }, *const deepseek[][2] = {
        {"mlp.shared_expert.gate_proj.weight", "mlp.shared_experts.gate_proj.weight"},
        {"mlp.shared_expert.up_proj.weight", "mlp.shared_experts.up_proj.weight"},
        {"mlp.shared_expert.down_proj.weight", "mlp.shared_experts.down_proj.weight"},
    };
    if (m->cfg.family == MOE_MODEL_FAMILY_MIXTRAL) return mixtral;
    for (size_t i = 0; i < sizeof renamed / sizeof *renamed; i++)
        if (!strcmp(mixtral, renamed[i][0])) return renamed[i][1];
    for (size_t i = 0; moe_model_deepseek(&m->cfg) && i < sizeof deepseek / sizeof *deepseek; i++)
        if (!strcmp(mixtral, deepseek[i][0])) return deepseek[i][1];
    return mixtral;
}

int moe__model_chunk_of(const moe_model *m, int layer) {
    if (layer < 0) return m->embeds ? 0 : -1;
    if (layer >= m->cfg.num_layers) return m->heads ? m->stage.chunks - 1 : -1;
    for (int c = 0; c < m->stage.chunks; c++)
        if (layer >= m->first[c] && layer < m->last[c]) return c;
    return -1;
}

int moe__model_holds_layer(const moe_model *m, int layer) { return moe__model_chunk_of(m, layer) >= 0; }

int moe__model_next_layer(const moe_model *m, int *c, int l) {
    if (l + 1 < m->last[*c]) return l + 1;
    return ++*c < m->stage.chunks ? m->first[*c] : -1;
}

/* Appends a tensor at the end of the buffer laid out so far (*cursor); without a table (m->tensors NULL) it only
 * counts. */
static void put(moe_model *m, size_t *cursor, int index, int replica, int layer, int experts, long rows, long cols,
                moe_tensor_kind kind, moe_tensor_split split, const char *name) {
    /* this rank's block of a split tensor */
    const int parts = split == MOE_SPLIT_NONE      ? 1
                      : split == MOE_SPLIT_KV_ROWS ? moe_model_kv_blocks(&m->cfg, m->seq.tp)
                                                   : m->seq.tp;
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
    if (moe__model_holds_layer(m, layer)) put(m, cursor, at, 0, layer, experts, rows, cols, kind, split, name);
}

/* Layer l's tensors in buffer order, X applied to each of model.h's lists that its config has: the attention norm, the
 * projections (or multi-head latent attention's), the FFN norm, the q/k/v biases, the q/k norms, then the router with
 * the shared expert and its gate, or the dense FFN. The one walk lay_out and set_views both take. */
#define MODEL_LAYER_TENSORS(X, c, l)                                                                               \
    MOE_MODEL_ATTENTION_NORM_TENSORS(X)                                                                            \
    if (moe_model_mla(c) && (c)->q_lora_rank) {                                                                    \
        MOE_MODEL_MLA_Q_LORA_TENSORS(X)                                                                            \
        MOE_MODEL_MLA_KV_TENSORS(X)                                                                                \
    } else if (moe_model_mla(c)) {                                                                                 \
        MOE_MODEL_MLA_Q_TENSORS(X)                                                                                 \
        MOE_MODEL_MLA_KV_TENSORS(X)                                                                                \
    } else {                                                                                                       \
        MOE_MODEL_ATTENTION_TENSORS(X)                                                                             \
    }                                                                                                              \
    MOE_MODEL_FFN_NORM_TENSORS(X)                                                                                  \
    if (moe_model_qkv_bias(c)) {                                                                                   \
        MOE_MODEL_QKV_BIAS_TENSORS(X)                                                                              \
    }                                                                                                              \
    if (moe_model_qk_norm(c) != MOE_QK_NORM_NONE) {                                                                \
        MOE_MODEL_QK_NORM_TENSORS(X)                                                                               \
    }                                                                                                              \
    if (moe_model_layer_is_moe(c, l)) {                                                                            \
        MOE_MODEL_ROUTER_TENSORS(X)                                                                                \
        if ((c)->shared_d_ff) {                                                                                    \
            MOE_MODEL_SHARED_TENSORS(X)                                                                            \
        }                                                                                                          \
        if (moe_model_shared_gate(c)) {                                                                            \
            MOE_MODEL_SHARED_GATE_TENSORS(X)                                                                       \
        }                                                                                                          \
    } else {                                                                                                       \
        MOE_MODEL_DENSE_FFN_TENSORS(X)                                                                             \
    }

/* Whether this stage's lm_head is a replica of another stage's embedding (model.h). */
static int holds_tied_replica(const moe_model *m) { return m->cfg.tie_embeddings && m->heads && !m->embeds; }

/* Every tensor this model holds in buffer order, [dense | experts]: the embedding, each layer's attention and FFN
 * (router or dense SwiGLU), the final norm and lm_head, then each MoE layer's local experts — the one-stage model's
 * order, with the tensors of other stages left out. */
void moe__model_lay_out(moe_model *m) {
    const moe_model_config *c = &m->cfg;
    const model_dims D = moe__model_dims(m);
    const long d = D.d, A = D.A, B = D.B, F = D.F, DF = D.DF, E = D.E, QN = D.QN, KN = D.KN, SF = D.SF,
               QL = D.QL, KLR = D.KLR, KL = D.KL, HNV = D.HNV, HV = D.HV, V = c->vocab_size,
               EL = m->num_local_experts;
    char name[sizeof m->tensors->name], mixtral[64]; /* an expert tensor's Mixtral name, before family_name */
    size_t at = 0;
    int index = 0;
    m->num_tensors = 0;
    /* the embedding and lm_head are vocabulary-parallel (rows of the vocabulary) */
    append(m, &at, &index, -1, 0, V, d, MOE_TENSOR_WEIGHT, MOE_SPLIT_ROWS, "model.embed_tokens.weight");
#define DENSE_TENSOR(field, hf, rows, cols, kind, split)                                                            \
    snprintf(name, sizeof name, "model.layers.%d.%s", l, family_name(m, hf));                                      \
    append(m, &at, &index, l, 0, rows, cols, kind, MOE_SPLIT_##split, name);
    for (int l = 0; l < c->num_layers; l++) {
        MODEL_LAYER_TENSORS(DENSE_TENSOR, c, l)
    }
#undef DENSE_TENSOR
    append(m, &at, &index, c->num_layers, 0, d, 0, MOE_TENSOR_NORM, MOE_SPLIT_NONE, "model.norm.weight");
    if (!c->tie_embeddings)
        append(m, &at, &index, c->num_layers, 0, V, d, MOE_TENSOR_WEIGHT, MOE_SPLIT_ROWS, "lm_head.weight");
    if (holds_tied_replica(m))
        put(m, &at, 0, 1, c->num_layers, 0, V, d, MOE_TENSOR_WEIGHT, MOE_SPLIT_ROWS, "model.embed_tokens.weight");
    m->num_dense = at;
#define EXPERT_TENSOR(field, hf, rows, cols, kind, split)                                                           \
    snprintf(mixtral, sizeof mixtral, "block_sparse_moe.experts.%%d.%s", hf);                                     \
    snprintf(name, sizeof name, "model.layers.%d.%s", l, family_name(m, mixtral));                                 \
    append(m, &at, &index, l, (int)EL, rows, cols, kind, MOE_SPLIT_##split, name);
    for (int l = 0; l < c->num_layers; l++)
        if (moe_model_layer_is_moe(c, l)) {
            MOE_MODEL_EXPERT_TENSORS(EXPERT_TENSOR)
        }
#undef EXPERT_TENSOR
    m->num_expert = at - m->num_dense;
    (void)A, (void)B, (void)F, (void)DF, (void)E, (void)QN, (void)KN, (void)SF, (void)QL, (void)KLR, (void)KL,
        (void)HNV, (void)HV; /* a model may use only some */
}

/* Where a tensor of one buffer (params or grads) is: base + its offset, or with zg (ZeRO-2's gradients) in their window
 * or ends. */
static moe_real *tensor_at(moe_real *base, const moe_zero_grads *zg, const moe_model_tensor *t) {
    return zg ? moe_zero_grads_at(zg, t) : base + t->offset;
}

/* Points the views of one buffer (params or grads) at the tensors: the same walk as moe__model_lay_out (what this model does not
 * hold stays NULL). */
void moe__model_set_views(moe_model *m, moe_real *base, const moe_zero_grads *zg, moe_model_views *v) {
    const moe_model_config *c = &m->cfg;
    const moe_model_tensor *t = m->tensors;
    v->embedding = m->embeds ? tensor_at(base, zg, t++) : NULL;
#define VIEW(field, hf, rows, cols, kind, split) L->field = tensor_at(base, zg, t++);
    for (FIRST_LAYER(m, ch, l); l >= 0; l = moe__model_next_layer(m, &ch, l)) {
        moe_model_layer_params *L = &v->layers[l];
        *L = (moe_model_layer_params){0}; /* what the layer's config has not stays NULL */
        MODEL_LAYER_TENSORS(VIEW, c, l)
    }
    v->final_norm = v->lm_head = NULL;
    if (m->heads) {
        v->final_norm = tensor_at(base, zg, t++);
        v->lm_head = c->tie_embeddings && m->embeds ? v->embedding : tensor_at(base, zg, t++);
    }
    for (FIRST_LAYER(m, ch, l); l >= 0; l = moe__model_next_layer(m, &ch, l)) {
        moe_model_layer_params *L = &v->layers[l];
        if (moe_model_layer_is_moe(c, l)) {
            MOE_MODEL_EXPERT_TENSORS(VIEW)
        }
    }
#undef VIEW
}

/* The GEMMs' views (m->c): p's, with the dense GEMM weights moved into m->compute when there is one. */
void moe__model_set_compute_views(moe_model *m) {
    moe_model_layer_params *layers = m->c.layers;
    m->c = m->p;
    m->c.layers = layers;
    memcpy(layers, m->p.layers, (size_t)m->cfg.num_layers * sizeof *layers);
    if (!m->compute) return;
#define IN_COMPUTE(ptr) ((ptr) = m->compute + ((ptr) - m->params))
    for (FIRST_LAYER(m, ch, l); l >= 0; l = moe__model_next_layer(m, &ch, l)) {
        moe_model_layer_params *w = &layers[l];
        moe_real **gemm_weights[] = {&w->wq, &w->wk, &w->wv, &w->wo, &w->mla.q_a, &w->mla.q_b, &w->mla.kv_a,
                                     &w->mla.kv_b};
        for (size_t i = 0; i < sizeof gemm_weights / sizeof *gemm_weights; i++)
            if (*gemm_weights[i]) IN_COMPUTE(*gemm_weights[i]);
        if (!moe_model_layer_is_moe(&m->cfg, l)) IN_COMPUTE(w->ffn.w1), IN_COMPUTE(w->ffn.w3), IN_COMPUTE(w->ffn.w2);
        if (w->shared.w1) IN_COMPUTE(w->shared.w1), IN_COMPUTE(w->shared.w3), IN_COMPUTE(w->shared.w2);
        if (w->shared_gate) IN_COMPUTE(w->shared_gate);
    }
    if (m->heads) IN_COMPUTE(m->c.lm_head);
#undef IN_COMPUTE
}

/* When the parameters changed since the last forward: under bf16 the bf16 copies of every dense weight that is not a
 * norm (the GEMMs read those of moe__model_set_compute_views), and the version the layers (ffn.version) and the dense ops are
 * told, which says when to make the weights' prepared copies again (core/types.h). Once per optimizer step, not per
 * micro-batch. */
moe_status moe__model_refresh_compute_weights(moe_model *m) {
    if (m->compute_version == m->params_version) return MOE_OK;
    for (int i = 0; m->compute && i < m->num_tensors; i++) {
        const moe_model_tensor *t = &m->tensors[i];
        if (t->experts == 0 && t->kind != MOE_TENSOR_NORM && t->kind != MOE_TENSOR_BIAS) /* those are read in fp32 */
            MOE_TRY(m->dense->round_bf16(m->ops_state, m->params + t->offset, t->count, m->compute + t->offset));
    }
    for (int l = 0; l < m->cfg.num_layers; l++)
        m->c.layers[l].ffn.version = m->c.layers[l].shared.version = m->params_version;
    /* not with tensor-parallel pieces: their GEMMs take weight blocks copied into scratch (tp/linear.c), one address
     * for many weights, where a copy kept by address would be another weight's */
    if (m->dense->weights_version && !m->pieces) m->dense->weights_version(m->ops_state, m->params_version);
    m->compute_version = m->params_version;
    return MOE_OK;
}


moe_status moe__model_set_stage(moe_model *m, const moe_model_stage *stage) {
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

int moe__model_chunk_embeds(const moe_model *m, int c) { return m->first[c] == 0; }
int moe__model_chunk_heads(const moe_model *m, int c) { return m->last[c] == m->cfg.num_layers; }

moe_model_stage moe_model_stage_whole(const moe_model_config *cfg) {
    return (moe_model_stage){.first_layer = 0, .num_layers = cfg->num_layers, .chunks = 1, .passes = 1,
                             .split = {.pp = 1, .chunks = 1}};
}

/* Stage s's layers under a split of one chunk a stage (the first's and the last's where given, else an equal share
 * of what they leave) and the first of them. */
static int split_stage_layers(const moe_pipeline_split *p, int L, int s) {
    if (p->pp <= 1) return L;
    if (s == 0 && p->first_layers) return p->first_layers;
    if (s == p->pp - 1 && p->last_layers) return p->last_layers;
    const int given = (p->first_layers > 0) + (p->last_layers > 0);
    return (L - p->first_layers - p->last_layers) / (p->pp - given);
}

int moe_pipeline_split_stage(const moe_pipeline_split *p, int L, int s, int *first) {
    *first = 0;
    for (int j = 0; j < s; j++) *first += split_stage_layers(p, L, j);
    return split_stage_layers(p, L, s);
}

const char *moe_pipeline_split_problem(const moe_pipeline_split *p, int L) {
    const int pp = p->pp > 1 ? p->pp : 1, V = p->chunks > 1 ? p->chunks : 1;
    if (p->first_layers < 0 || p->last_layers < 0) return "the first and last stages' layers cannot be negative";
    const int given = (p->first_layers > 0) + (p->last_layers > 0);
    if (!given) return L % (pp * V) ? "the pipeline's pp x virtual stages must divide the layers (each stage, and each "
                                      "chunk of one, holds as many), or the first and last stages' layers be given"
                                    : NULL;
    if (pp == 1) return "the first and last stages' layers need a pipeline (pp 2 or more)";
    if (V > 1) return "the first and last stages' layers are for one chunk a stage: the interleaved schedule's chunks "
                      "hold equal layers";
    const int rest = L - p->first_layers - p->last_layers, middle = pp - given;
    if (rest < middle || (middle == 0 && rest != 0) || (middle > 0 && rest % middle))
        return "the first and last stages' layers must leave the other stages an equal share of at least one layer "
               "each (layers - first - last a multiple of the stages between, or 0 with 2 stages both given)";
    return NULL;
}

moe_model_stage moe_model_pipeline_stage(const moe_model_config *cfg, const moe_pipeline_split *split, int stage,
                                         int passes) {
    const int pp = split->pp > 1 ? split->pp : 1, chunks = split->chunks > 1 ? split->chunks : 1, L = cfg->num_layers;
    moe_model_stage st = {.chunks = chunks, .passes = passes, .split = *split};
    if (chunks == 1) {
        st.num_layers = moe_pipeline_split_stage(split, L, stage, &st.first_layer);
        return st;
    }
    const int per = L / (pp * chunks); /* virtual stage v = c pp + stage holds [v per, (v + 1) per) */
    st.first_layer = stage * per, st.num_layers = per, st.chunk_stride = pp * per;
    return st;
}

int moe_model_pipeline_stage_of(const moe_model_config *cfg, const moe_pipeline_split *split, int layer) {
    const int pp = split->pp > 1 ? split->pp : 1, chunks = split->chunks > 1 ? split->chunks : 1, L = cfg->num_layers;
    if (layer < 0) return 0;
    if (layer >= L) return pp - 1;
    if (chunks > 1) return layer / (L / (pp * chunks)) % pp;
    for (int s = 0, first = 0; s < pp; first += split_stage_layers(split, L, s++))
        if (layer < first + split_stage_layers(split, L, s)) return s;
    return pp - 1;
}

/* The most tensors a table of cfg holds: the embedding, 18 per layer (q/k norms, biases, a gated shared expert with), the final norm and lm_head, 3 expert tensors per
 * layer. */
int moe__model_max_tensors(const moe_model_config *cfg) { return 1 + 18 * cfg->num_layers + 2 + 3 * cfg->num_layers; }

/* Each chunk's slices of the two regions, from the table (moe__model_chunk_of each tensor's layer). */
void moe__model_find_chunk_slices(moe_model *m) {
    for (int i = 0; i < m->num_tensors; i++) {
        const moe_model_tensor *t = &m->tensors[i];
        const int c = moe__model_chunk_of(m, t->layer), expert = t->offset >= m->num_dense;
        moe_zero_slice *sl = expert ? &m->chunk_expert[c] : &m->chunk_dense[c];
        const size_t from = t->offset - (expert ? m->num_dense : 0);
        if (!sl->count) *sl = (moe_zero_slice){from, t->count};
        else if (from + t->count > sl->from + sl->count) sl->count = from + t->count - sl->from; /* table order */
    }
}


moe_status moe_model_whole_tensors(const moe_model *m, moe_model_tensor **tensors, int *count) {
    moe_model w = {.cfg = m->cfg, .head_dim = m->head_dim, .num_local_experts = m->num_local_experts, .seq = m->seq};
    const moe_model_stage whole = moe_model_stage_whole(&m->cfg);
    MOE_TRY(moe__model_set_stage(&w, &whole));
    if (!(w.tensors = calloc(moe__model_max_tensors(&m->cfg), sizeof(moe_model_tensor)))) return MOE_ERR_OUT_OF_MEMORY;
    moe__model_lay_out(&w);
    *tensors = w.tensors, *count = w.num_tensors;
    return MOE_OK;
}
