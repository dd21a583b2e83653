/* model.c — the MoE decoder LM on one rank: creation, the stage's forward and backward over its layers, and the sums
 * of its gradients. The pieces are models/'s other files: the tensor table and the stage (tensors.c), the activation
 * buffers (model_activations.c), a layer's attention (attention.c) and FFN (ffn.c), the two ends (head.c), the checks
 * for NaN (model_checks.c), the structures (model_internal.h). Orchestration only: the dense ops come
 * from the runtime's table (moe/dense_ops.h), the MoE layers from moe/moe.h, the list of tensors from model.h's
 * X-macros. Every row-wise GEMM is cut as the layer cuts its own, and attention runs per sequence, so a token's
 * activations do not depend on which other tokens share this rank: the layout only changes how gradients are
 * summed. */
#include "models/model.h"

#include <stdlib.h>

#include "core/fail.h"
#include "models/tensors.h"

/* The largest of the rank's dense tensors: its count, or with `side` its longer side (rows or columns as held). */
static size_t largest_dense_tensor(const moe_model *m, int side) {
    size_t largest = 0;
    for (int i = 0; i < m->num_tensors; i++) {
        const moe_model_tensor *t = &m->tensors[i];
        const size_t rows = (size_t)t->rows, cols = (size_t)t->cols, v = side ? (rows > cols ? rows : cols) : t->count;
        if (!t->experts && v > largest) largest = v;
    }
    return largest;
}

/* The shard tree of the dense weight gradients, sized for the largest: moe_shard_grads_max_count's (the dense SwiGLU's
 * three as one) or a tensor's (MLA's latent projections are not in that list). */
static moe_status init_shard_grads(moe_model *m) {
    const int S = m->cfg.moe.num_shards, W = moe_comm_size(moe_parallel_stage(m->par));
    if (!S) return moe_shard_grads_init(&m->shard_grads, m->rt, m->dense, m->ops_state, 0, 0);
    MOE_TRY(moe_shard_tree_local_shards(S, W, &m->local_shards));
    const size_t listed = moe_shard_grads_max_count(&m->cfg), held = largest_dense_tensor(m, 0);
    return moe_shard_grads_init(&m->shard_grads, m->rt, m->dense, m->ops_state, m->local_shards,
                                listed > held ? listed : held);
}

/* The widest row a dense product reads or writes: d_model, the FFNs' widths, the vocabulary, and every dense weight's
 * longer side as the rank holds it (Qwen3's H x head_dim and MLA's latent and heads can pass all of the others). */
static int widest_dense_row(const moe_model *m) {
    const moe_model_config *cfg = &m->cfg;
    const int widths[] = {cfg->d_model, cfg->d_ff, moe_model_dense_d_ff(cfg), cfg->shared_d_ff, cfg->vocab_size,
                          (int)largest_dense_tensor(m, 1)};
    int widest = 1;
    for (size_t i = 0; i < sizeof widths / sizeof *widths; i++) widest = widths[i] > widest ? widths[i] : widest;
    return widest;
}

/* Tensor parallelism (model.h): the layout's tensor group, its products in fixed pieces, and the shard tree of the
 * pieces' weight gradients over the group's rows (tp x local_shards shards), sized for the largest piece held. */
static moe_status init_tensor_parallel(moe_model *m) {
    const int pieces = moe_model_tp_pieces(&m->cfg, m->seq.tp);
    MOE_TRY(moe_tp_linear_init(&m->tpl, m->rt, m->ops_state, m->seq.tp > 1 ? m->seq.group : NULL, pieces));
    m->pieces = pieces > 1;
    MOE_TRY(moe_tp_cross_entropy_init(&m->vocab_ce, m->rt, m->ops_state, m->seq.tp > 1 ? m->seq.group : NULL, pieces));
    MOE_TRY(moe__model_init_kv_heads(m));
    int dense_layers = 0;
    for (int l = 0; l < m->cfg.num_layers; l++)
        dense_layers += moe__model_holds_layer(m, l) && !moe_model_layer_is_moe(&m->cfg, l);
    if (m->pieces && dense_layers) {
        const size_t n =
            (size_t)m->max_seqs * m->cfg.seq_len * (moe_model_dense_d_ff(&m->cfg) / m->seq.tp) * sizeof(moe_real);
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
        moe__model_set_views(m, m->grads, NULL, &m->g);
        return MOE_OK;
    }
    if (!m->local_shards)
        return moe_fail(MOE_ERR_INVALID_CONFIG, "ZeRO-2 reduce-scatters the gradients in the fixed tree: it needs the "
                                                "world-invariant sums (cfg.moe.num_shards > 0)");
    MOE_TRY(moe_zero_grads_init(&m->zero_grads, &m->zero, m->rt, m->dense, m->ops_state, m->tensors, m->num_tensors,
                                m->cfg.num_layers, m->seq.tp > 1 ? moe_parallel_tensor(m->par) : NULL));
    moe__model_set_views(m, NULL, &m->zero_grads, &m->g);
    return MOE_OK;
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
            moe_layer_defer_finish(m->passes[i].moe[l], 1); /* finished with the forward: end_forward */
            if (i > owner) MOE_TRY(moe_layer_share_expert_bias(m->passes[i].moe[l], m->passes[owner].moe[l]));
        }
    }
    return MOE_OK;
}

moe_status moe_model_create_stage(const moe_model_config *cfg, moe_runtime *rt, const moe_parallel *par,
                                  const moe_model_stage *stage, int max_seqs, int accum_steps, moe_model **out) {
    if (!cfg || !par || !stage || !out || max_seqs < 1 || accum_steps < 1) return MOE_ERR_INVALID_ARG;
    *out = NULL;
    const moe_ranks r = moe_parallel_ranks(par); /* tp and ep are the layout's (model.h) */
    const char *problem = moe_model_layout_problem(cfg, r.tp_size, r.ep_size);
    if (problem) return moe_fail(MOE_ERR_INVALID_CONFIG, "%s", problem);
    moe_model *m = calloc(1, sizeof *m);
    if (!m) return MOE_ERR_OUT_OF_MEMORY;
    m->cfg = *cfg;
    m->par = par;
    m->max_seqs = max_seqs;
    m->head_dim = moe_model_head_dim(cfg);
    m->rope = moe_model_rope(cfg);
    m->num_local_experts = moe_config_num_local_experts(&cfg->moe, r.ep_size);
    moe_status st = moe__model_set_stage(m, stage);
    if (st != MOE_OK) return free(m), st;
    st = rt ? MOE_OK : moe_runtime_create_cpu(&m->owned_rt);
    m->rt = rt ? rt : m->owned_rt;
    m->seq = (moe_tp_sequence){.group = moe_parallel_tensor(par), .rt = m->rt, .tp = r.tp_size,
                               .tp_rank = r.tp_rank};
    if (st == MOE_OK && !(m->dense = moe_runtime_dense_ops(m->rt)))
        st = moe_fail(MOE_ERR_INVALID_CONFIG,
                      "the %s runtime has no table of dense-model ops (moe/dense_ops.h): a model cannot run on it",
                      moe_runtime_name(m->rt));
    const int L = cfg->num_layers;
    if (st == MOE_OK) {
        m->p.layers = calloc(L, sizeof(moe_model_layer_params));
        m->g.layers = calloc(L, sizeof(moe_model_layer_params));
        m->c.layers = calloc(L, sizeof(moe_model_layer_params));
        m->tensors = calloc(moe__model_max_tensors(cfg), sizeof(moe_model_tensor));
        if (!m->p.layers || !m->g.layers || !m->c.layers || !m->tensors) st = MOE_ERR_OUT_OF_MEMORY;
    }
    if (st == MOE_OK) {
        moe__model_lay_out(m);
        moe__model_find_chunk_slices(m);
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
    if (st == MOE_OK) st = moe__model_alloc_activations(m);
    if (st == MOE_OK) {
        moe__model_set_views(m, m->params, NULL, &m->p);
        moe__model_set_compute_views(m);
        st = m->dense->create(m->rt, cfg->moe.layout_invariant, cfg->moe.precision, widest_dense_row(m),
                              &m->ops_state);
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
    moe__model_free_activations(m);
    moe_tied_grads_free(&m->tied);
    void *bufs[] = {m->params, m->grads, m->compute, m->tp_dh1, m->tp_dh3};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs && m->rt; i++) moe_runtime_free(m->rt, bufs[i]);
    moe_runtime_destroy(m->owned_rt);
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
void moe_model_set_dropless(moe_model *m, int dropless) {
    for (int i = 0; i < m->stage.chunks * m->stage.passes; i++)
        for (int l = 0; l < m->cfg.num_layers; l++) moe_layer_set_dropless(m->passes[i].moe[l], dropless);
}
moe_real *moe_model_expert_bias(moe_model *m, int l) { /* the chunk's first pass owns the bias the others share */
    const int c = moe__model_chunk_of(m, l);
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

/* Before layer l's backward: what cfg.moe.recompute did not keep, rebuilt from what forward kept by the forward's
 * own ops on the same inputs (bitwise the same); an MoE layer reuses its routing (moe_layer_recompute). */
static moe_status recompute_layer(moe_model *m, int l, int T) {
    const moe_recompute r = m->cfg.moe.recompute;
    if (r >= MOE_RECOMPUTE_ATTENTION) MOE_TRY(moe__model_attention_forward(m, l, m->P->num_seqs));
    if (r == MOE_RECOMPUTE_FULL) MOE_TRY(moe__model_attention_residual_forward(m, l, T));
    return moe__model_ffn_recompute(m, l, T);
}

moe_status moe_model_select_pass(moe_model *m, int chunk, int pass) {
    if (chunk < 0 || chunk >= m->stage.chunks || pass < 0 || pass >= m->stage.passes) return MOE_ERR_INVALID_ARG;
    m->P = &m->passes[chunk * m->stage.passes + pass];
    return MOE_OK;
}

int moe_model_num_passes(const moe_model *m) { return m->stage.passes; }

/* A stage forward's end: the stream drained — by the head's loss, which waited (waited), else one wait — so that
 * the tokens' staging (head.c) is free for the next forward and what the pass's MoE layers (chunk layers [first, last))
 * queued for the host has landed (moe_layer_finish_forward: the router losses, the layout's counts), then each such
 * layer's check and sum over the stage. */
static moe_status end_forward(moe_model *m, int first, int last, int waited) {
    model_pass *P = m->P;
    if (!waited) MOE_TRY(moe_runtime_synchronize(m->rt));
    for (int l = first; l < last; l++)
        if (P->moe[l]) MOE_TRY(moe_layer_finish_forward(P->moe[l], &P->stats[l]));
    return MOE_OK;
}

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
    MOE_TRY(moe__model_refresh_compute_weights(m));
    if (embeds) {
        MOE_TRY(moe__model_embed(m, inputs, T));
        MOE_TRY(moe__model_watch(m, P->resid[0], Td, "the embedding output"));
    } else {
        MOE_TRY(moe_runtime_copy(m->rt, P->resid[first], x, Td * sizeof(moe_real)));
    }
    for (int l = first; l < last; l++) {
        const layer_acts *a = &P->acts[l];
        MOE_TRY(moe__model_attention_forward(m, l, num_seqs));
        MOE_TRY(moe__model_attention_residual_forward(m, l, T));
        MOE_TRY(moe__model_ffn_forward(m, l, T));
        MOE_TRY(moe__model_watch(m, m->tmp, Td, "layer %d: the %s output", l, P->moe[l] ? "MoE" : "dense FFN"));
        MOE_TRY(dense->add(s, a->resid_mid, m->tmp, Td, P->resid[l + 1]));
    }
    if (!heads) {
        MOE_TRY(end_forward(m, first, last, 0));
        return P->has_forward = 1, MOE_OK;
    }
    MOE_TRY(moe__model_head_forward(m, targets, T, loss_sum, logits_out));
    MOE_TRY(end_forward(m, first, last, targets != NULL)); /* the loss is a host value: it waited */
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

moe_status moe_model_sync_tied(moe_model *m) {
    if (!m->tied.grad) return MOE_OK;
    m->params_version++; /* the last stage's lm_head is written: its kept GEMM copies must be made again */
    return moe_tied_grads_sync_weights(&m->tied, m->embeds ? m->p.embedding : m->p.lm_head);
}

/* Layer l's backward, from dL/dresid[l+1] (m->dresid, this rank's slice) to dL/dresid[l], after rebuilding what
 * --recompute did not keep; under ZeRO-2 (zg) its gradients summed as it ends. */
static moe_status layer_backward(moe_model *m, int l, int T, moe_zero_grads *zg) {
    const moe_model_config *c = &m->cfg;
    const moe_model_layer_params *w = &m->c.layers[l];
    moe_model_layer_params *gw = &m->g.layers[l];
    const layer_acts *a = &m->P->acts[l];
    const size_t Td = (size_t)(T / m->seq.tp) * c->d_model; /* the slice's residual stream */
    if (zg) MOE_TRY(moe_zero_grads_begin_layer(zg, l));
    MOE_TRY(recompute_layer(m, l, T));
    /* resid[l+1] = resid_mid + ffn(ln2(resid_mid)): dresid flows to both */
    MOE_TRY(moe__model_ffn_backward(m, l, T));
    MOE_TRY(moe__model_watch(m, m->dln, Td, "layer %d: the gradient into the %s", l,
                             m->P->moe[l] ? "MoE layer" : "dense FFN"));
    MOE_TRY(moe_shard_grads_rmsnorm(&m->shard_grads, a->resid_mid, w->ffn_norm, a->rstd2, m->dln, c->d_model,
                                    m->dresid, gw->ffn_norm));
    MOE_TRY(moe__model_watch(m, m->dresid, Td, "layer %d: the gradient of the residual after attention", l));
    /* resid_mid = resid[l] + wo(attention(ln1(resid[l]))) */
    MOE_TRY(moe__model_attention_backward(m, l, T));
    return zg ? moe_zero_grads_end_layer(zg, l) : MOE_OK;
}

/* A tied lm_head's gradient (its vocabulary block's at tp > 1) after the head's backward: with combine_tied
 * (moe_model_backward) added into the embedding's at once, as one rank adds them; else kept apart for the step's sum
 * (models/tied_grads.h) — here without the world-invariant sums and under ZeRO-2 (which sums each layer in
 * backward), by moe_model_reduce_chunk_grads with them. */
static moe_status tied_head_backward(moe_model *m, int combine_tied) {
    if (combine_tied)
        return m->dense->add(m->ops_state, m->g.embedding, m->tied.grad,
                             (size_t)(m->cfg.vocab_size / m->seq.tp) * m->cfg.d_model, m->g.embedding);
    if (m->cfg.zero == 2 || !m->local_shards)
        return moe_tied_grads_accumulate(&m->tied, moe_parallel_data(m->par), m->local_shards > 0);
    return MOE_OK;
}

/* The selected pass's backward through this stage, from the loss (last stage, dL/dloss_t = loss_scale) or from dy,
 * the gradient of the stage's output, down to the embedding (first stage) or to dL/dx in m->dresid. */
static moe_status stage_backward(moe_model *m, moe_real loss_scale, const moe_real *dy, int combine_tied) {
    model_pass *P = m->P;
    const int first = m->first[P->chunk], last = m->last[P->chunk], embeds = first == 0,
              heads = last == m->cfg.num_layers;
    if (!P->has_forward) return MOE_ERR_NO_FORWARD;
    if (!heads && !dy) return MOE_ERR_INVALID_ARG;
    const int T = P->num_seqs * m->cfg.seq_len;
    /* the weight gradients: per shard, or over all rows, of this rank's slice; the tensor-parallel pieces' over the
     * tensor group's rows */
    m->shard_grads.num_tokens = T / m->seq.tp, m->tp_grads.num_tokens = T;
    moe_zero_grads *zg = m->cfg.zero == 2 ? &m->zero_grads : NULL; /* ZeRO-2: each layer's gradients summed as it ends */
    if (zg) MOE_TRY(moe_zero_grads_begin_backward(zg));
    if (heads) MOE_TRY(moe__model_head_backward(m, T, loss_scale));
    else MOE_TRY(moe_runtime_copy(m->rt, m->dresid, dy, (size_t)(T / m->seq.tp) * m->cfg.d_model * sizeof(moe_real)));
    for (int l = last - 1; l >= first; l--) MOE_TRY(layer_backward(m, l, T, zg));
    if (embeds) MOE_TRY(moe__model_embed_backward(m, T));
    if (heads && m->tied.grad) MOE_TRY(tied_head_backward(m, combine_tied));
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

int moe_model_chunk_heads(const moe_model *m, int chunk) { return moe__model_chunk_heads(m, chunk); }

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
    if (m->local_shards && moe__model_chunk_heads(m, chunk) && m->tied.grad) /* the micro-batch's tied lm_head gradient, apart */
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

moe_status moe_model_update_expert_bias(moe_model *m, const double *selected) {
    if (m->cfg.moe.score_func != MOE_SCORE_SIGMOID) return MOE_OK;
    for (int c = 0; c < m->stage.chunks; c++) { /* one bias per layer: the chunk's first pass owns it */
        const model_pass *owner = &m->passes[c * m->stage.passes];
        for (int l = m->first[c]; l < m->last[c]; l++)
            if (owner->moe[l])
                MOE_TRY(moe_layer_update_expert_bias_counts(owner->moe[l],
                                                            selected + (size_t)l * m->cfg.moe.num_experts));
    }
    return MOE_OK;
}

