/* plan_model.c — parameter counts, FLOPs per token and per-GPU memory of a plan model (models/plan_model.h).
 * The formulas and their sources: docs/SCALING.md. */
#include "models/plan_model.h"

moe_plan_model moe_plan_model_from_config(const moe_model_config *c) {
    return (moe_plan_model){.vocab_size = c->vocab_size,
                            .num_layers = c->num_layers,
                            .d_model = c->d_model,
                            .num_heads = c->num_heads,
                            .num_kv_heads = c->num_kv_heads,
                            .head_dim = c->num_heads > 0 ? c->d_model / c->num_heads : 0,
                            .d_ff_expert = c->d_ff,
                            .d_ff_dense = c->d_ff,
                            .num_experts = c->moe.num_experts,
                            .top_k = c->moe.top_k,
                            .moe_every = c->moe_every,
                            .tie_embeddings = c->tie_embeddings,
                            .capacity_factor = c->moe.capacity_factor};
}

const char *moe_plan_model_problem(const moe_plan_model *m) {
    if (m->vocab_size < 2) return "the vocabulary needs at least 2 tokens";
    if (m->num_layers < 1) return "the model needs at least 1 layer";
    if (m->d_model < 1) return "d_model must be at least 1";
    if (m->num_heads < 1 || m->head_dim < 1) return "the number of heads and head_dim must be at least 1";
    if (m->num_kv_heads < 1 || m->num_heads % m->num_kv_heads != 0)
        return "the number of kv heads must divide the number of heads";
    if (m->num_experts < 1) return "the number of experts must be at least 1";
    if (m->top_k < 1 || m->top_k > m->num_experts) return "top-k must be in [1, experts]";
    if (m->num_experts > 1 && m->d_ff_expert < 1) return "the experts' hidden width must be at least 1";
    if (m->moe_every < 1) return "moe_every must be at least 1";
    if (m->d_ff_dense < 0 || m->d_ff_shared < 0) return "FFN widths cannot be negative";
    if (moe_plan_model_num_moe_layers(m) < m->num_layers && m->d_ff_dense < 1)
        return "the model has dense FFN layers but their width (intermediate_size / --d-ff) is 0";
    if (m->tie_embeddings != 0 && m->tie_embeddings != 1) return "tie_embeddings must be 0 or 1";
    if (m->irregular_moe_layers && (m->num_moe_layers_listed < 0 || m->num_moe_layers_listed > m->num_layers))
        return "the number of MoE layers must be in [0, layers]";
    return 0;
}

int64_t moe_plan_model_num_moe_layers(const moe_plan_model *m) {
    if (m->num_experts <= 1) return 0;
    return m->irregular_moe_layers ? m->num_moe_layers_listed : m->num_layers / m->moe_every; /* (l+1) % n == 0 */
}

int moe_plan_model_unsupported(const moe_plan_model *m, const char **notes, int max_notes) {
    const char *all[] = {
        m->head_dim * m->num_heads != m->d_model
            ? "head_dim * heads != d_model: this project's attention has head_dim = d_model / heads" : 0,
        m->qk_norm ? "RMSNorm on q and k per head (Qwen3's q_norm/k_norm): this project's attention has none" : 0,
        m->d_ff_shared > 0 ? "a shared expert beside the routed ones: this project's MoE layer has none" : 0,
        m->irregular_moe_layers ? "MoE layers in no every-n-th pattern (mlp_only_layers): this project has only "
                                  "--moe-every" : 0,
        m->sliding_window > 0 ? "sliding-window attention: this project's attention is full causal" : 0,
        m->head_dim % 2 != 0 ? "odd head_dim: this project's RoPE rotates pairs" : 0,
        moe_plan_model_num_moe_layers(m) < m->num_layers && m->num_experts > 1 && m->d_ff_dense != m->d_ff_expert
            ? "dense FFN layers wider or narrower than the experts: this project's --d-ff is both" : 0,
    };
    int n = 0;
    for (unsigned i = 0; i < sizeof all / sizeof *all; i++)
        if (all[i] && n < max_notes) notes[n++] = all[i];
    return n;
}

moe_plan_params moe_plan_model_params(const moe_plan_model *m) {
    const int64_t d = m->d_model, A = m->num_heads * m->head_dim, B = m->num_kv_heads * m->head_dim;
    const int64_t L = m->num_layers, Lm = moe_plan_model_num_moe_layers(m), E = m->num_experts;
    const int64_t attention = d * A + 2 * d * B + A * d;         /* q, k, v, o projections */
    const int64_t norms = 2 * d + (m->qk_norm ? 2 * m->head_dim : 0); /* input and post-attention, q and k */
    const int64_t expert = 3 * d * m->d_ff_expert;                /* w1, w3: [F, d]; w2: [d, F] */
    const int64_t router = E * d, shared = 3 * d * m->d_ff_shared + (m->d_ff_shared > 0 ? d : 0); /* + its gate */
    const int64_t dense_ffn = 3 * d * m->d_ff_dense;
    const int64_t V = m->vocab_size, embedding = V * d, lm_head = m->tie_embeddings ? 0 : V * d;
    moe_plan_params p = {.embedding = embedding};
    p.dense = embedding + lm_head + d /* final norm */ + L * (attention + norms) + Lm * (router + shared) +
              (L - Lm) * dense_ffn;
    p.expert = Lm * E * expert;
    p.total = p.dense + p.expert;
    p.active = p.dense + Lm * m->top_k * expert;
    p.dense_matrix = p.dense - d - L * norms;
    /* the lm_head product is V * d per token whether or not it shares the embedding's storage */
    p.matmul_active = p.active - embedding - d - L * norms + (m->tie_embeddings ? embedding : 0);
    return p;
}

double moe_plan_model_flops_per_token(const moe_plan_model *m, int64_t seq_len) {
    const moe_plan_params p = moe_plan_model_params(m);
    return 6.0 * (double)p.matmul_active + 12.0 * (double)m->num_layers * (double)(m->num_heads * m->head_dim) *
                                               (double)seq_len;
}

double moe_plan_model_moe_flops_per_token(const moe_plan_model *m) {
    const double d = (double)m->d_model, shared = 3 * d * (double)m->d_ff_shared + (m->d_ff_shared > 0 ? d : 0);
    const double per_layer = (double)m->num_experts * d + (double)m->top_k * 3 * d * (double)m->d_ff_expert + shared;
    return 6.0 * (double)moe_plan_model_num_moe_layers(m) * per_layer;
}

moe_plan_recompute_flops moe_plan_model_recompute_flops_per_token(const moe_plan_model *m, int64_t seq_len,
                                                                  moe_recompute recompute) {
    const double d = (double)m->d_model, A = (double)(m->num_heads * m->head_dim),
                 B = (double)(m->num_kv_heads * m->head_dim), S = (double)seq_len, k = (double)m->top_k;
    const double L = (double)m->num_layers, Lm = (double)moe_plan_model_num_moe_layers(m);
    const double F = (double)m->d_ff_expert, Fd = (double)m->d_ff_dense, Fs = (double)m->d_ff_shared;
    moe_plan_recompute_flops f = {0, 0};
    const int full = recompute == MOE_RECOMPUTE_FULL;
    /* 2 FLOPs per multiply-add of a forward: q, k, v and the attention scores and their product with V (4 A S, the
     * whole matrix as the model FLOPs count it), then o_proj under full */
    if (recompute >= MOE_RECOMPUTE_ATTENTION) f.dense += L * (2 * d * (A + 2 * B) + 4 * A * S + (full ? 2 * A * d : 0));
    if (recompute >= MOE_RECOMPUTE_MOE) {
        f.dense += (L - Lm) * 2 * 3 * d * Fd;                      /* a dense FFN runs whole (model.c)   */
        f.moe += Lm * 2 * (full ? 3 : 2) * d * (k * F + Fs);       /* w1, w3; and w2 under full         */
    }
    return f;
}

/* What models/model.c keeps for T = micro_batch * S tokens (its layer_acts and model buffers, moe_real = fp32):
 * the same sum as moe_model_config_footprint for the shapes that function takes (tests/test_plan.c). What the
 * recompute setting rebuilds in backward is one buffer for every layer (model.c's layer_buffer_shared). */
static double model_activation_nbytes(const moe_plan_model *m, const moe_plan_layout *lay) {
    const double T = (double)lay->micro_batch * lay->seq_len, S = (double)lay->seq_len, d = (double)m->d_model;
    const double A = (double)(m->num_heads * m->head_dim), B = (double)(m->num_kv_heads * m->head_dim);
    const double H = (double)m->num_heads, L = (double)m->num_layers, Lm = (double)moe_plan_model_num_moe_layers(m);
    /* the attention probabilities [seqs, H, S, S], or a fused kernel's row statistics [T, H] */
    const double att = lay->attention == MOE_PLAN_ATTENTION_MATERIALIZED ? (double)lay->micro_batch * H * S * S : T * H;
    const double attention_block = T * d /* ln1 */ + T /* rstd1 */ + T * (A + 2 * B) /* q k v */ + att +
                                   T * A /* attn_y */;
    const double mid = T * d /* resid_mid */ + T * d /* ln2 */ + T /* rstd2 */;
    const double dense_ffn = 3 * T * (double)m->d_ff_dense; /* h1, h3, act of a dense FFN layer */
    const moe_recompute r = lay->recompute;
    const double copies_attention = r >= MOE_RECOMPUTE_ATTENTION ? 1 : L, copies_mid = r == MOE_RECOMPUTE_FULL ? 1 : L;
    const double copies_ffn = r >= MOE_RECOMPUTE_MOE ? (L > Lm ? 1 : 0) : L - Lm;
    const double model = 2 * T /* inputs, targets (int, as many bytes as fp32) */ + T * d + T /* lnf, rstdf */ +
                         T * (double)m->vocab_size /* logits */ + 3 * T * d /* dresid, dln, tmp */ +
                         T * (2 * A + 2 * B) /* dq, dk, dv, dattn */;
    return 4 * ((L + 1) * T * d /* residual stream */ + copies_attention * attention_block + copies_mid * mid +
                copies_ffn * dense_ffn + model);
}

double moe_plan_model_busiest_rows(const moe_plan_model *m, const moe_plan_layout *lay) {
    const double Tk = (double)lay->micro_batch * lay->seq_len * m->top_k, cf = m->capacity_factor;
    const double skew = lay->ep > 1 && lay->routing_skew > 1 ? lay->routing_skew : 1;
    return cf > 0 && cf < skew ? cf * Tk : skew * Tk;
}

moe_plan_memory moe_plan_model_memory(const moe_plan_model *m, const moe_plan_layout *lay) {
    const moe_plan_params p = moe_plan_model_params(m);
    const double local_expert = (double)p.expert / (double)lay->ep, dense = (double)p.dense;
    const double T = (double)lay->micro_batch * lay->seq_len, d = (double)m->d_model, k = (double)m->top_k;
    const double E = (double)m->num_experts, Lm = (double)moe_plan_model_num_moe_layers(m);
    const double row = lay->bf16 ? 2 : 4, N = moe_plan_model_busiest_rows(m, lay);
    moe_plan_memory mem = {0};
    mem.weights = lay->bf16 ? 2 * ((double)p.dense_matrix + local_expert) : 0;
    mem.masters = 4 * (dense + local_expert);
    mem.gradients = mem.masters;
    const double expert_dp = (double)lay->world / (double)lay->ep; /* the ranks holding the same experts */
    mem.optimizer = 8 * (lay->zero ? dense / (double)lay->world + local_expert / expert_dp : dense + local_expert);
    /* per MoE layer (moe/layer.c): the routing arrays (router/routing.h: logits, scores, select scores [T, E] fp32;
     * expert, gate, score, kept, slot, perm_token [T, k]: 21 bytes) and dgate [T, k]; kept for backward unless
     * recomputed (then one copy serves every layer): x [T, d] fp32 (full), the experts' h1, h3, act (moe and full;
     * moe/layer_ops_cpu.c: 3 [N, F] fp32); the backward scratch dh1, dh3 (2 [N, F] fp32), once */
    const moe_recompute r = lay->recompute;
    const double layers = Lm > 0 ? 1 : 0, F = (double)m->d_ff_expert;
    const double copies_rows = r == MOE_RECOMPUTE_FULL ? layers : Lm, copies_h = r >= MOE_RECOMPUTE_MOE ? layers : Lm;
    const double routing = T * (12 * E + 21 * k) + 4 * T * k;
    mem.activations = model_activation_nbytes(m, lay) + Lm * routing + copies_rows * 4 * T * d +
                      copies_h * 3 * N * F * 4 + layers * 2 * N * F * 4;
    /* in the exchanged precision: kept, y [T k, d] (the outputs back from the combine) and the received rows x [N, d];
     * one pass's scratch, once: xp, dy, dxp [T k, d] and the received rows' staging, y, dy, dx [N, d] */
    mem.exchange = copies_rows * (T * k * d + N * d) * row + layers * (3 * T * k * d + 4 * N * d) * row;
    mem.workspace = lay->workspace_bytes;
    mem.total = mem.weights + mem.masters + mem.gradients + mem.optimizer + mem.activations + mem.exchange +
                mem.workspace;
    return mem;
}
