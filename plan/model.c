/* plan/model.c — parameter counts, FLOPs per token and per-GPU memory of a plan model (plan/model.h).
 * The formulas and their sources: docs/SCALING.md. */
#include "plan/model.h"

#include "alltoall/tree_allreduce.h"
#include "kernels/gemm_rows.h"
#include "models/model_activations.h"
#include "moe/layer_buffers.h"
#include "plan/pipeline.h"
#include "router/routing.h"

#include <math.h>

moe_plan_model moe_plan_model_from_config(const moe_model_config *c) {
    return (moe_plan_model){.vocab_size = c->vocab_size,
                            .num_layers = c->num_layers,
                            .d_model = c->d_model,
                            .num_heads = c->num_heads,
                            .num_kv_heads = c->num_kv_heads,
                            .head_dim = moe_model_head_dim(c),
                            .q_lora_rank = c->q_lora_rank,
                            .kv_lora_rank = c->kv_lora_rank,
                            .qk_rope_dim = c->qk_rope_dim,
                            .v_head_dim = c->v_head_dim,
                            .d_ff_expert = c->d_ff,
                            .d_ff_dense = moe_model_dense_d_ff(c),
                            .first_dense = c->first_dense,
                            .num_experts = c->moe.num_experts,
                            .top_k = c->moe.top_k,
                            .moe_every = c->moe_every,
                            .tie_embeddings = c->tie_embeddings,
                            .qk_norm = (int)moe_model_qk_norm(c),
                            .d_ff_shared = c->moe.num_experts > 1 ? c->shared_d_ff : 0,
                            .shared_gate = moe_model_shared_gate(c),
                            .qkv_bias = moe_model_qkv_bias(c),
                            .capacity_factor = c->moe.capacity_factor};
}

/* An upper bound of the parameters, in double: every attention matrix at most w^2 (w the widest of d, the heads'
 * widths and MLA's ranks), the FFNs and routers exact, the embedding and lm_head. */
static double params_bound(const moe_plan_model *m) {
    const double d = (double)m->d_model, H = (double)m->num_heads, E = (double)m->num_experts;
    const double widths[] = {d, H * m->head_dim, (double)m->q_lora_rank, (double)m->kv_lora_rank + m->qk_rope_dim,
                             H * ((double)m->head_dim + m->v_head_dim)};
    double w = 0;
    for (size_t i = 0; i < sizeof widths / sizeof *widths; i++) w = widths[i] > w ? widths[i] : w;
    const double ffn = 3 * d * (E * m->d_ff_expert + m->d_ff_dense + m->d_ff_shared) + E * d;
    return 2 * (double)m->vocab_size * d + (double)m->num_layers * (6 * w * w + ffn);
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
    if (params_bound(m) > 0x1p50) /* ~1,000x the largest published model: the int64 counts below stay exact */
        return "the shapes make more than 2^50 parameters (hidden_size, the FFN widths, the experts, the layers): past "
               "what the planner counts";
    return 0;
}

int64_t moe_plan_model_moe_layers_below(const moe_plan_model *m, int64_t end) {
    /* layers l in [first_dense, end) with (l + 1) % n == 0: there are x / n such l in [0, x) */
    const int64_t n = m->moe_every, first = m->first_dense < end ? m->first_dense : end;
    return end / n - first / n;
}

int64_t moe_plan_model_num_moe_layers(const moe_plan_model *m) {
    if (m->num_experts <= 1) return 0;
    return m->irregular_moe_layers ? m->num_moe_layers_listed : moe_plan_model_moe_layers_below(m, m->num_layers);
}

int moe_plan_model_unsupported(const moe_plan_model *m, const char **notes, int max_notes) {
    const char *all[] = {
        m->head_dim * m->num_heads != m->d_model && m->qk_norm != MOE_QK_NORM_HEAD && !m->kv_lora_rank
            ? "head_dim * heads != d_model: this project has a head_dim of its own in Qwen3-MoE's family and MLA only"
            : 0,
        m->irregular_moe_layers ? "MoE layers in no every-n-th pattern (mlp_only_layers): this project has only "
                                  "--moe-every" : 0,
        m->sliding_window > 0 ? "sliding-window attention: this project's attention is full causal" : 0,
        m->head_dim % 2 != 0 ? "odd head_dim: this project's RoPE rotates pairs" : 0,
        m->unsupported_key[0] ? m->unsupported_key : 0,
    };
    int n = 0;
    for (unsigned i = 0; i < sizeof all / sizeof *all; i++)
        if (all[i] && n < max_notes) notes[n++] = all[i];
    return n;
}

/* One layer's parameters by tensor, and the ends' (what params and ZeRO-2's gradient buffers both count). */
typedef struct {
    int64_t attention;      /* q, k, v, o projections                                */
    int64_t norms;          /* input and post-attention; q and k per head (Qwen3)     */
    int64_t expert;         /* one routed expert: w1, w3: [F, d]; w2: [d, F]          */
    int64_t router, shared; /* an MoE layer's; a shared expert with its gate          */
    int64_t dense_ffn;      /* a dense layer's FFN                                    */
    int64_t embedding, lm_head, final_norm; /* the ends; lm_head 0 when tied          */
} parameter_counts;

static parameter_counts parameter_counts_of(const moe_plan_model *m) {
    const int64_t d = m->d_model, A = m->num_heads * m->head_dim, B = m->num_kv_heads * m->head_dim;
    parameter_counts c = {.attention = d * A + 2 * d * B + A * d + (m->qkv_bias ? A + 2 * B : 0),
                          .norms = 2 * d + (m->qk_norm == MOE_QK_NORM_HEAD ? 2 * m->head_dim
                                            : m->qk_norm == MOE_QK_NORM_PROJECTION ? A + B : 0),
                          .expert = 3 * d * m->d_ff_expert,
                          .router = m->num_experts * d,
                          .shared = 3 * d * m->d_ff_shared + (m->d_ff_shared > 0 && m->shared_gate ? d : 0),
                          .dense_ffn = 3 * d * m->d_ff_dense,
                          .embedding = m->vocab_size * d,
                          .lm_head = m->tie_embeddings ? 0 : m->vocab_size * d,
                          .final_norm = d};
    if (m->kv_lora_rank > 0) { /* multi-head latent attention: q (or its bottleneck), kv_a, kv_b, o; their norms */
        const int64_t QL = m->q_lora_rank, KL = m->kv_lora_rank, H = m->num_heads, dv = m->v_head_dim;
        c.attention = (QL ? d * QL + QL * A : d * A) + d * (KL + m->qk_rope_dim) +
                      KL * H * (m->head_dim - m->qk_rope_dim + dv) + H * dv * d;
        c.norms = 2 * d + QL + KL;
    }
    return c;
}

moe_plan_params moe_plan_model_params(const moe_plan_model *m) {
    const parameter_counts c = parameter_counts_of(m);
    const int64_t L = m->num_layers, Lm = moe_plan_model_num_moe_layers(m), E = m->num_experts, d = m->d_model;
    moe_plan_params p = {.embedding = c.embedding};
    p.dense = c.embedding + c.lm_head + c.final_norm + L * (c.attention + c.norms) + Lm * (c.router + c.shared) +
              (L - Lm) * c.dense_ffn;
    p.expert = Lm * E * c.expert;
    p.total = p.dense + p.expert;
    p.active = p.dense + Lm * m->top_k * c.expert;
    p.dense_matrix = p.dense - d - L * c.norms;
    /* the lm_head product is V * d per token whether or not it shares the embedding's storage */
    p.matmul_active = p.active - c.embedding - d - L * c.norms + (m->tie_embeddings ? c.embedding : 0);
    return p;
}

/* The ends a pipeline stage holds: the embedding on the first; the final norm and lm_head on the last, where with tied
 * embeddings the lm_head is the embedding's copy (one table when one stage holds both ends). */
static int64_t stage_ends(const moe_plan_model *m, const moe_plan_stage *s) {
    const parameter_counts c = parameter_counts_of(m);
    return (s->embedding || (s->head && m->tie_embeddings) ? c.embedding : 0) +
           (s->head ? c.lm_head + c.final_norm : 0);
}

moe_plan_params moe_plan_model_stage_params(const moe_plan_model *m, const moe_plan_stage *s) {
    const parameter_counts c = parameter_counts_of(m);
    const int64_t L = s->layers, Lm = s->moe_layers;
    moe_plan_params p = moe_plan_model_params(m);
    p.dense = stage_ends(m, s) + L * (c.attention + c.norms) + Lm * (c.router + c.shared) + (L - Lm) * c.dense_ffn;
    p.expert = Lm * m->num_experts * c.expert;
    p.total = p.dense + p.expert;
    p.dense_matrix = p.dense - (s->head ? c.final_norm : 0) - L * c.norms;
    return p;
}

/* The blocks k_proj and v_proj are cut into over tp GPUs: by kv heads where tp divides them; with fewer kv heads than
 * tp each GPU keeps the one its query heads read (models/model.h), KV blocks. */
static int64_t kv_parts(const moe_plan_model *m, int64_t tp) {
    return m->num_kv_heads % tp == 0 ? tp : tp % m->num_kv_heads == 0 ? m->num_kv_heads : 1;
}

/* The attention projections' values one GPU of a tensor group of tp holds: q and o by heads, k and v by kv_parts
 * (their biases with them); multi-head latent attention's q_b (or q_proj), kv_b and o by heads, its low-rank q_a and
 * kv_a whole (models/mla.c). */
static int64_t attention_share(const moe_plan_model *m, int64_t tp) {
    const int64_t d = m->d_model, A = m->num_heads * m->head_dim, B = m->num_kv_heads * m->head_dim;
    if (m->kv_lora_rank > 0) {
        const int64_t QL = m->q_lora_rank, KL = m->kv_lora_rank, H = m->num_heads, dv = m->v_head_dim;
        return (QL ? d * QL + QL * A / tp : d * A / tp) + d * (KL + m->qk_rope_dim) +
               KL * H * (m->head_dim - m->qk_rope_dim + dv) / tp + H * dv * d / tp;
    }
    const int64_t bias = m->qkv_bias ? A / tp + 2 * B / kv_parts(m, tp) : 0;
    return 2 * d * A / tp + 2 * d * B / kv_parts(m, tp) + bias;
}

moe_plan_gradient_buffers moe_plan_model_gradient_buffers(const moe_plan_model *m, int64_t ep, int64_t tp) {
    const parameter_counts c = parameter_counts_of(m);
    tp = tp > 1 ? tp : 1;
    const int64_t Lm = moe_plan_model_num_moe_layers(m), local_experts = m->num_experts / (ep > 0 ? ep : 1);
    const int64_t attention = attention_share(m, tp);
    const int64_t moe_layer = attention + c.norms + c.router + c.shared + local_experts * c.expert; /* the shared
                                                                         expert replicated (models/model.h) */
    const int64_t dense_layer = attention + c.norms + c.dense_ffn / tp;
    int64_t window = Lm > 0 ? moe_layer : 0;
    if (Lm < m->num_layers && dense_layer > window) window = dense_layer;
    return (moe_plan_gradient_buffers){.window = window, .ends = (c.embedding + c.lm_head) / tp + c.final_norm};
}

moe_plan_tp_share moe_plan_model_tp_share(const moe_plan_model *m, const moe_plan_stage *s, int64_t tp) {
    const moe_plan_params p = moe_plan_model_stage_params(m, s);
    if (tp <= 1) return (moe_plan_tp_share){(double)p.dense, (double)p.dense_matrix};
    const parameter_counts c = parameter_counts_of(m);
    const double L = (double)s->layers, Lm = (double)s->moe_layers;
    const double ends = (s->embedding || (s->head && m->tie_embeddings) ? (double)c.embedding : 0) +
                        (s->head ? (double)c.lm_head : 0);
    const double split = (L - Lm) * (double)c.dense_ffn + ends; /* the shared expert is replicated */
    /* what the other GPUs of the group hold instead */
    const double kept = split - split / (double)tp + L * (double)(c.attention - attention_share(m, tp));
    return (moe_plan_tp_share){(double)p.dense - kept, (double)p.dense_matrix - kept};
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

/* The tokens of a micro-batch one GPU holds between blocks: micro_batch * S, split over a tensor-parallel group
 * (sequence parallelism); inside a block its GPUs hold 1/tp of every token's heads or columns instead, the same
 * count. */
static double tokens_per_gpu(const moe_plan_layout *lay) {
    return (double)lay->micro_batch * (double)lay->seq_len / (double)moe_plan_layout_tp(lay);
}

/* What models/model.c keeps for T = micro_batch * S tokens (its layer_acts and model buffers: the list of
 * models/model_activations.h, with its rules): the same sum as moe_model_config_footprint for the shapes that function
 * takes (tests/test_plan.c). What the recompute setting rebuilds in backward is one buffer for every layer, of the
 * largest layer's size. A pipeline stage counts its layers, and keeps what they keep for backward (the residual stream
 * entering each layer and the buffers not rebuilt) for each micro-batch in flight; the model's own buffers once. */
static double model_activation_nbytes(const moe_plan_model *m, const moe_plan_layout *lay, const moe_plan_stage *st) {
    const double T = tokens_per_gpu(lay), S = (double)lay->seq_len, d = (double)m->d_model;
    const double TG = T; /* the planner's sequence parallelism gathers nothing it keeps (model.c keeps a dense FFN's
                            ln2, the final norm's output, two scratch buffers and MLA's three latent ones gathered:
                            more than this at tp > 1) */
    const double A = (double)(m->num_heads * m->head_dim), B = (double)(m->num_kv_heads * m->head_dim);
    /* fewer kv heads than tp: each GPU holds its query heads' kv head, [TG, head_dim] (T B tp / KV values), and in
     * backward a whole gradient of k or v (models/model.h, grouped-query attention; --tp-shards = tp) */
    const double tp = (double)moe_plan_layout_tp(lay), kv_copies = tp > m->num_kv_heads ? tp / m->num_kv_heads : 1;
    const double BK = B * kv_copies, KVG = kv_copies > 1 ? TG * B : 0;
    const double H = (double)m->num_heads, L = (double)st->layers, Lm = (double)st->moe_layers;
    /* the q/k norms' inputs and statistics (model_activations.h: the tensor group's rows of the GPU's heads, its kv
     * head's where it holds one of fewer than tp, or the slice's rows of every head for the whole projection's at tp
     * > 1), and at tp > 1 their all-to-alls' scratch */
    const double QK = m->qk_norm != MOE_QK_NORM_NONE,
                 QR = m->qk_norm == MOE_QK_NORM_HEAD ? H : QK,
                 KR = m->qk_norm == MOE_QK_NORM_HEAD ? fmax((double)m->num_kv_heads, tp) : QK,
                 KN = m->qk_norm == MOE_QK_NORM_HEAD ? (double)m->head_dim : B;
    const double QT = QK && tp > 1, QH = m->qk_norm == MOE_QK_NORM_HEAD, HD = (double)m->head_dim;
    /* the model's own buffers: with q/k/v biases a column of ones; with a shared expert its backward's scratch */
    const double QB = m->qkv_bias, SH = m->d_ff_shared > 0 && m->num_experts > 1, SG = SH && m->shared_gate;
    /* multi-head latent attention's (models/mla.c) */
    const double ML = m->kv_lora_rank > 0, QL = ML * (double)m->q_lora_rank, KL = ML * (double)m->kv_lora_rank,
                 HV = ML * H * (double)m->v_head_dim, DR = ML * (double)m->qk_rope_dim,
                 HNV = ML * H * (double)(m->head_dim - m->qk_rope_dim + m->v_head_dim),
                 LAT = ML * fmax(KL + DR, QL);
    const double V = (double)m->vocab_size, real = sizeof(moe_real), in_flight = st->in_flight;
    const double ATT = (double)lay->micro_batch * H * S * (lay->attention == MOE_PLAN_ATTENTION_FUSED ? 1 : S) /
                       (double)moe_plan_layout_tp(lay); /* its heads */
    double bytes = (L * in_flight + 1) * T * d * real; /* the residual stream entering each layer, the output */
    /* each buffer on the L - Lm dense FFN layers (FD = T d_ff) and on the Lm MoE layers (FD = 0) */
#define LAYER_NBYTES(name, count, rebuilt_from)                                                                    \
    {                                                                                                             \
        double on_dense, on_moe;                                                                                  \
        {                                                                                                         \
            const double FD = T * (double)m->d_ff_dense, SH = 0, SF = 0, SG = 0;                                  \
            on_dense = (count) * real, (void)FD, (void)SH, (void)SF, (void)SG;                                    \
        }                                                                                                         \
        {                                                                                                         \
            const double FD = 0, SH = m->d_ff_shared > 0, SF = T * (double)m->d_ff_shared, SG = m->shared_gate;   \
            on_moe = (count) * real, (void)FD, (void)SH, (void)SF, (void)SG;                                      \
        }                                                                                                         \
        if ((int)lay->recompute >= (rebuilt_from)) /* one buffer, the largest layer's */                          \
            bytes += L > Lm && on_dense > on_moe ? on_dense : on_moe;                                             \
        else                                                                                                      \
            bytes += ((L - Lm) * on_dense + Lm * on_moe) * in_flight;                                             \
    }
    MOE_MODEL_LAYER_ACTIVATIONS(LAYER_NBYTES)
#undef LAYER_NBYTES
#define MODEL_NBYTES(name, type, count) bytes += (count) * sizeof(type);
    MOE_MODEL_BUFFERS(MODEL_NBYTES)
#undef MODEL_NBYTES
    return bytes;
}

double moe_plan_layout_skew(const moe_plan_layout *lay) {
    if (lay->ep <= 1 || !(lay->routing_skew > 1)) return 1;
    return lay->routing_skew < (double)lay->ep ? lay->routing_skew : (double)lay->ep;
}

double moe_plan_model_busiest_rows(const moe_plan_model *m, const moe_plan_layout *lay) {
    const double Tk = tokens_per_gpu(lay) * (double)m->top_k, cf = m->capacity_factor;
    const double skew = moe_plan_layout_skew(lay);
    return cf > 0 && cf < skew ? cf * Tk : skew * Tk;
}

int64_t moe_plan_default_local_shards(int64_t data_ranks, int64_t stage_ranks, int64_t micro_batch) {
    const int64_t batch = data_ranks * micro_batch;
    int64_t S = 1;
    while (S < 64 && batch % (2 * S) == 0) S *= 2;
    return !(stage_ranks & (stage_ranks - 1)) && S % stage_ranks == 0 ? S / data_ranks : 0;
}

int64_t moe_plan_layout_local_shards(const moe_plan_layout *lay) {
    return lay->local_shards < 0 ? moe_plan_default_local_shards(moe_plan_layout_data_ranks(lay),
                                                                 moe_plan_layout_stage_ranks(lay), lay->micro_batch)
                                 : lay->local_shards;
}

static double log2_of(double n) { return n > 1 ? ceil(log2(n)) : 0; }

/* mem.reduce_scratch (plan/model.h), of a pipeline stage: its sums run over its ranks (world / pp), its largest
 * slices and gradients are its own (the vocabulary's only where it holds an end), a GPU's share of them under tensor
 * parallelism. dense: what this GPU holds of the stage's dense parameters. */
static double reduce_scratch_nbytes(const moe_plan_model *m, const moe_plan_layout *lay, const moe_plan_stage *st,
                                    double dense, double local_expert) {
    const int64_t ranks = moe_plan_layout_stage_ranks(lay), tp = moe_plan_layout_tp(lay);
    const int vocab = st->embedding || (st->head && m->tie_embeddings), untied_head = st->head && !m->tie_embeddings;
    const double real = sizeof(moe_real), d = (double)m->d_model, dp = (double)(ranks / lay->ep);
    const int64_t LS = moe_plan_layout_local_shards(lay);
    const double larger = dense > local_expert || dp < 2 ? dense : local_expert;
    if (LS == 0) return lay->cpu && ranks > 1 ? real * larger : 0; /* MPI_Allreduce's copy; NCCL: in place */
    const double piece = (double)MOE__TREE_PIECE_NBYTES / real;
    double bytes = 0;
    if (ranks > 1 && lay->zero == 2) {
        /* the reduce-scatter's one chunk (alltoall/tree_allreduce.h): half a piece, or at most half the largest slice
         * it reduces: a layer's window, the embedding, or the final norm with an untied lm_head */
        const double V = (double)m->vocab_size / (double)tp, tail = d + (m->tie_embeddings ? 0 : V * d);
        double slice = (double)moe_plan_model_gradient_buffers(m, lay->ep, tp).window;
        if (vocab) slice = slice > V * d ? slice : V * d;
        if (st->head) slice = slice > tail ? slice : tail;
        bytes = real * (ceil(slice / 2) < ceil(piece / 2) ? ceil(slice / 2) : ceil(piece / 2));
    } else if (ranks > 1) { /* the tree all-reduce: half of a piece (alltoall/tree_allreduce.h) */
        const double region = larger < piece ? larger : piece;
        bytes = real * ceil(region / 2);
    }
    /* the shard tree of the dense weight gradients: log2(LS) + 2 slots of the largest (models/shard_grads.c) */
    const double A = (double)(m->num_heads * m->head_dim), B = (double)(m->num_kv_heads * m->head_dim);
    const double t = (double)tp, kv_t = (double)kv_parts(m, tp);
    double largest = vocab || untied_head ? (double)m->vocab_size * d / t : 0;
    const double other[] = {3 * (double)m->d_ff_dense * d / t, A * d / t, B * d / kv_t};
    for (int i = 0; i < 3; i++) largest = other[i] > largest ? other[i] : largest;
    bytes += (log2_of((double)LS) + 2) * largest * real;
    /* the experts' per-segment weight-gradient leaves, one per (EP rank, shard) segment (core/tree_schedule.h) */
    if (st->moe_layers > 0)
        bytes += (log2_of((double)(lay->ep * LS)) + 2) * d * (double)m->d_ff_expert * real;
    return bytes;
}

/* On the CPU path, the row-wise GEMM plans' scratch (kernels/gemm_rows_cpu.c: MOE_GEMM_ROUND_ROWS x 2 x the widest
 * operand for each thread's worker, of which the calls touch their rows' share, one worker's rows each, so about a
 * product's rows in all whatever the threads): the dense ops' one plan, whose widest is the vocabulary at the
 * lm_head (256 MB at V = 1M and 32 tokens), and each MoE layer's router and expert plans; and the dense ops' RoPE
 * cos/sin table, [seq_len, head_dim] (kernels/rope.h). */
static double cpu_dense_scratch_nbytes(const moe_plan_model *m, const moe_plan_layout *lay, const moe_plan_stage *st) {
    if (!lay->cpu) return 0;
    const double T = (double)lay->micro_batch * lay->seq_len, rows = T < MOE_GEMM_ROUND_ROWS ? T : MOE_GEMM_ROUND_ROWS;
    const double d = (double)m->d_model, F = (double)m->d_ff_expert, E = (double)m->num_experts;
    double dense_widest = (double)m->vocab_size, layer_widest = d > F ? d : F;
    dense_widest = dense_widest > layer_widest ? dense_widest : layer_widest;
    layer_widest = layer_widest > E ? layer_widest : E;
    const double gemm = 2 * (rows * dense_widest + (double)st->moe_layers * 2 * MOE_GEMM_ROUND_ROWS * layer_widest);
    return sizeof(moe_real) * (gemm + (double)lay->seq_len * (double)m->head_dim);
}

/* One pipeline stage's bytes (the whole model's without a pipeline). */
static moe_plan_memory stage_memory(const moe_plan_model *m, const moe_plan_layout *lay, const moe_plan_stage *st) {
    const moe_plan_params p = moe_plan_model_stage_params(m, st);
    const int64_t tp = moe_plan_layout_tp(lay);
    const moe_plan_tp_share held = moe_plan_model_tp_share(m, st, tp); /* of the dense parameters */
    /* the dense parameters are sharded (ZeRO) over the GPUs holding the same share: a stage's data ranks; the experts
     * over the stage's GPUs holding the same experts (tensor-parallel GPUs feed their experts distinct tokens) */
    const double ranks = (double)moe_plan_layout_data_ranks(lay), in_flight = st->in_flight;
    const double local_expert = (double)p.expert / (double)lay->ep, dense = held.dense;
    const double T = tokens_per_gpu(lay), d = (double)m->d_model, k = (double)m->top_k;
    const double E = (double)m->num_experts, Lm = (double)st->moe_layers;
    const double row = lay->cpu ? sizeof(moe_real) : 2, N = moe_plan_model_busiest_rows(m, lay);
    moe_plan_memory mem = {0};
    /* the bf16 copies: 2 bytes a value on the CUDA path; on the CPU path the dense matrices' rounded moe_real copy,
     * and the two prepared copies kept between optimizer steps (forward and backward layouts, kernels/gemm_rows.h) of
     * every expert matrix, and of every dense one at tp 1 (tensor-parallel pieces keep none: models/model.c): 2 bytes
     * a value on bf16 kernels, moe_real on fp32 units (MOE_BF16_GEMM; the smaller counted, the estimate is a floor) */
    const double prepared = tp == 1 ? held.dense_matrix + local_expert : local_expert;
    const double cpu_copies = sizeof(moe_real) * held.dense_matrix + 2 * 2 * prepared;
    mem.weights = lay->bf16 ? (lay->cpu ? cpu_copies : 2 * (held.dense_matrix + local_expert)) : 0;
    mem.masters = 4 * (dense + local_expert);
    const double expert_dp = (double)moe_plan_layout_stage_ranks(lay) / (double)lay->ep;
    if (lay->zero == 2) { /* the shard (the moments' ranges), one layer's window, the ends */
        const moe_plan_gradient_buffers g = moe_plan_model_gradient_buffers(m, lay->ep, tp);
        const double ends = (double)stage_ends(m, st), final_norm = st->head ? (double)m->d_model : 0;
        mem.gradients = 4 * (dense / ranks + local_expert / expert_dp + (double)g.window +
                             (ends - final_norm) / (double)tp + final_norm);
    } else { /* the whole gradient, and with world-invariant micro-batches the step's sum beside it */
        const int accumulator = lay->accum_steps > 1 && moe_plan_layout_local_shards(lay) > 0;
        mem.gradients = mem.masters * (1 + accumulator);
    }
    mem.optimizer = 8 * (lay->zero ? dense / ranks + local_expert / expert_dp : dense + local_expert);
    /* per MoE layer (moe/layer.c): the routing arrays (router/routing.h's list: [T, E] fp32 scores, [T, k] choices)
     * and dgate [T, k]; the experts' SwiGLU intermediates, kept for backward unless recomputed (moe and full: then
     * one copy serves every layer): 3 [N, F] values, h1, h3, act in fp32 on the CPU, h13 and act in bf16 on CUDA;
     * their backward scratch, once (dh1, dh3: 2 [N, F] fp32 on the CPU; dh13, dact: 3 [N, F] bf16 on CUDA) */
    const moe_recompute r = lay->recompute;
    const double layers = Lm > 0 ? 1 : 0, F = (double)m->d_ff_expert;
    const double copies_h = r >= MOE_RECOMPUTE_MOE ? layers : Lm * in_flight;
    double routing = 4 * T * k; /* dgate, then router/routing.h's per-token arrays */
#define ROUTING_NBYTES(type, name, per_token, what) routing += T * (per_token) * sizeof(type);
    MOE_TOKEN_ROUTING_ARRAYS(ROUTING_NBYTES)
#undef ROUTING_NBYTES
    const double h = lay->cpu ? sizeof(moe_real) : 2, scratch_h = lay->cpu ? 2 : 3;
    mem.activations = model_activation_nbytes(m, lay, st) + Lm * in_flight * routing + copies_h * 3 * N * F * h +
                      layers * scratch_h * N * F * h + cpu_dense_scratch_nbytes(m, lay, st);
    /* the layer's buffers of a pass (moe/layer_buffers.h's lists, `row` the exchanged precision): what each layer
     * keeps for backward, and once for every layer the scratch of one pass */
    double kept = 0, pass = 0;
    const double A = T * k, real = sizeof(moe_real);
#define LAYER_BUFFER(name, n_rows, elem, slot, kept_below) *(r < (kept_below) ? &kept : &pass) += (n_rows) * d * (elem);
    MOE_LAYER_TOKEN_BUFFERS(LAYER_BUFFER)
    MOE_LAYER_ROW_BUFFERS(LAYER_BUFFER)
#undef LAYER_BUFFER
    mem.exchange = Lm * in_flight * kept + layers * pass;
    mem.reduce_scratch = reduce_scratch_nbytes(m, lay, st, dense, local_expert);
    mem.workspace = lay->workspace_bytes;
    mem.total = mem.weights + mem.masters + mem.gradients + mem.optimizer + mem.activations + mem.exchange +
                mem.reduce_scratch + mem.workspace;
    return mem;
}

/* The stage needing the most: the first (the most micro-batches in flight, the embedding) or the last (the head), or
 * a middle one holding more layers or MoE layers than the first (uneven stages, moe_every above 1); the others hold
 * no more than those. */
moe_plan_memory moe_plan_model_memory(const moe_plan_model *m, const moe_plan_layout *lay) {
    const int64_t pp = moe_plan_layout_pp(lay);
    moe_plan_stage first = moe_plan_pipeline_stage(m, lay, 0);
    moe_plan_memory most = stage_memory(m, lay, &first);
    for (int64_t s = 1; s < pp; s++) {
        const moe_plan_stage st = moe_plan_pipeline_stage(m, lay, s);
        if (s < pp - 1 && st.layers <= first.layers && st.moe_layers <= first.moe_layers) continue;
        moe_plan_memory mem = stage_memory(m, lay, &st);
        mem.stage = s;
        if (mem.total > most.total) most = mem;
    }
    return most;
}
