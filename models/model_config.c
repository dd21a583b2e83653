/* model_config.c — defaults and validation of moe_model_config. */
#include "models/model.h"

#include <math.h>

moe_model_config moe_model_config_default(void) {
    moe_model_config c = {
        .vocab_size = 256,
        .num_layers = 4,
        .d_model = 128,
        .num_heads = 4,
        .num_kv_heads = 4,
        .d_ff = 256,
        .seq_len = 128,
        .moe_every = 1,
        .tie_embeddings = 0,
        .rope_theta = 10000.0f,
        .yarn = {.beta_fast = 32, .beta_slow = 1}, /* transformers' defaults: a ramp between 32 and 1 rotations */
        .norm_eps = 1e-5f,
        /* fused: as fast at the default model on the dev VM (2 ranks: 86.8 / 83.9 ms a step against 87.0 / 84.4
         * materialized), 14% faster and 162 MiB a rank lighter at S = 1024 (docs/BENCHMARKS.md) */
        .attention = MOE_ATTENTION_FUSED,
    };
    c.moe = moe_config_default(c.d_model, c.d_ff, 8, 2);
    return c;
}

moe_qk_norm moe_model_qk_norm(const moe_model_config *c) {
    return c->family == MOE_MODEL_FAMILY_QWEN3_MOE ? MOE_QK_NORM_HEAD
           : c->family == MOE_MODEL_FAMILY_OLMOE   ? MOE_QK_NORM_PROJECTION
                                                   : MOE_QK_NORM_NONE;
}

int moe_model_qkv_bias(const moe_model_config *c) { return c->family == MOE_MODEL_FAMILY_QWEN2_MOE; }
int moe_model_shared_gate(const moe_model_config *c) {
    return c->family == MOE_MODEL_FAMILY_QWEN2_MOE && c->shared_d_ff > 0;
}

int moe_model_deepseek(const moe_model_config *c) {
    return c->family == MOE_MODEL_FAMILY_DEEPSEEK_V3 || c->family == MOE_MODEL_FAMILY_DEEPSEEK_V2;
}

int moe_model_head_dim(const moe_model_config *c) {
    return c->head_dim > 0 ? c->head_dim : c->num_heads > 0 ? c->d_model / c->num_heads : 0;
}

/* YaRN's m(s, k) (model.h) */
static double yarn_mscale(double s, double k) { return s <= 1 ? 1.0 : 0.1 * k * log(s) + 1.0; }

moe_rope moe_model_rope(const moe_model_config *c) {
    moe_rope r = moe_rope_plain(c->rope_theta);
    const moe_yarn_config *y = &c->yarn;
    if (!(y->factor > 0)) return r;
    r.yarn_factor = y->factor, r.original_positions = y->original_positions;
    r.beta_fast = y->beta_fast, r.beta_slow = y->beta_slow;
    r.amplitude = y->attention_factor > 0                ? y->attention_factor
                  : y->mscale > 0 && y->mscale_all_dim > 0 ? yarn_mscale(y->factor, y->mscale) /
                                                                yarn_mscale(y->factor, y->mscale_all_dim)
                                                          : yarn_mscale(y->factor, 1);
    return r;
}

double moe_model_mla_softmax_factor(const moe_model_config *c) {
    const double m = c->yarn.factor > 0 && c->yarn.mscale_all_dim > 0 ? yarn_mscale(c->yarn.factor,
                                                                                    c->yarn.mscale_all_dim)
                                                                       : 1.0;
    return m * m;
}

/* YaRN's parameters: a message naming the one that cannot be, or NULL */
static const char *yarn_problem(const moe_yarn_config *y) {
    if (y->factor == 0) {
        const moe_yarn_config none = moe_model_config_default().yarn;
        return y->original_positions != none.original_positions || y->beta_fast != none.beta_fast ||
                       y->beta_slow != none.beta_slow || y->mscale != none.mscale ||
                       y->mscale_all_dim != none.mscale_all_dim || y->attention_factor != none.attention_factor
                   ? "YaRN's parameters are given without its factor (--yarn-factor; 0: plain RoPE)"
                   : NULL;
    }
    if (!(y->factor >= 1) || !isfinite(y->factor)) return "YaRN's factor must be 0 (none) or at least 1";
    if (y->original_positions < 1)
        return "YaRN needs the context pretrained on (original_max_position_embeddings: --yarn-original-positions)";
    if (!(y->beta_fast > 0) || !(y->beta_slow > 0) || !isfinite(y->beta_fast) || !isfinite(y->beta_slow))
        return "YaRN's beta_fast and beta_slow must be positive";
    if (!(y->mscale >= 0) || !(y->mscale_all_dim >= 0) || !(y->attention_factor >= 0) || !isfinite(y->mscale) ||
        !isfinite(y->mscale_all_dim) || !isfinite(y->attention_factor))
        return "YaRN's mscale, mscale_all_dim and attention_factor must be 0 (not given) or positive";
    return NULL;
}

const char *moe_model_family_name(int family) {
    static const char *const names[MOE_MODEL_FAMILIES] = {"mixtral", "qwen3_moe", "olmoe", "qwen2_moe",
                                                                   "deepseek_v3", "deepseek_v2"};
    return family >= 0 && family < MOE_MODEL_FAMILIES ? names[family] : NULL;
}

int moe_model_layer_is_moe(const moe_model_config *c, int layer) {
    return c->moe.num_experts > 1 && c->moe_every > 0 && layer >= c->first_dense && (layer + 1) % c->moe_every == 0;
}

int moe_model_moe_layers(const moe_model_config *c) {
    int n = 0;
    for (int l = 0; l < c->num_layers; l++) n += moe_model_layer_is_moe(c, l);
    return n;
}

int moe_model_mla(const moe_model_config *c) { return c->kv_lora_rank > 0; }

/* Multi-head latent attention against the rest of the config (model.h). */
static const char *mla_problem(const moe_model_config *c) {
    if (c->q_lora_rank < 0 || c->kv_lora_rank < 0 || c->qk_rope_dim < 0 || c->v_head_dim < 0)
        return "q_lora_rank, kv_lora_rank, qk_rope_dim and v_head_dim cannot be negative";
    if (!moe_model_mla(c))
        return c->q_lora_rank || c->qk_rope_dim || c->v_head_dim
                   ? "q_lora_rank, qk_rope_dim and v_head_dim are multi-head latent attention's: they need "
                     "kv_lora_rank > 0"
                   : NULL;
    const int hd = moe_model_head_dim(c);
    if (c->qk_rope_dim < 2 || c->qk_rope_dim % 2 || c->qk_rope_dim >= hd)
        return "qk_rope_dim must be even, at least 2 and below head_dim (qk_nope_head_dim + qk_rope_head_dim)";
    if (c->v_head_dim < 1 || c->v_head_dim > hd)
        return "v_head_dim must be between 1 and head_dim (v is padded to the q/k heads' width)";
    if (c->num_kv_heads != c->num_heads)
        return "multi-head latent attention has a key and a value per head: kv heads must equal heads";
    if (moe_model_qk_norm(c) != MOE_QK_NORM_NONE || moe_model_qkv_bias(c))
        return "multi-head latent attention replaces the family's attention: use --family deepseek_v3, deepseek_v2 "
               "(or mixtral)";
    return NULL;
}

int moe_model_dense_d_ff(const moe_model_config *c) { return c->dense_d_ff > 0 ? c->dense_d_ff : c->d_ff; }

static int power_of_two(int n) { return n > 0 && (n & (n - 1)) == 0; }

int moe_model_tp_pieces(const moe_model_config *c, int tp) { return c->tp_shards > 0 ? c->tp_shards : tp; }

int moe_model_kv_chunks(const moe_model_config *c, int tp) {
    const int S = moe_model_tp_pieces(c, tp), KV = c->num_kv_heads;
    int P = 1; /* the largest tp the pieces and the heads allow: the largest power of two dividing S and H */
    while (S % (2 * P) == 0 && c->num_heads % (2 * P) == 0) P *= 2;
    return P > KV && P % KV == 0 ? P / KV : 1;
}

int moe_model_kv_blocks(const moe_model_config *c, int tp) { return c->num_kv_heads < tp ? c->num_kv_heads : tp; }

/* tp and tp_shards against the shapes of a valid config (model.h, "Tensor parallelism"). */
static const char *tensor_parallel_problem(const moe_model_config *c, int tp) {
    if (tp < 1 || !power_of_two(tp))
        return "tp must be a power of two (a tensor group's sums run in the fixed binary tree)";
    const int S = moe_model_tp_pieces(c, tp), hd = moe_model_head_dim(c);
    if (c->num_heads % tp != 0) return "tp must divide the number of heads (each rank holds whole heads)";
    if (moe_model_mla(c) && c->num_heads % S != 0)
        return "tp_shards must divide the number of heads under multi-head latent attention (each fixed piece holds "
               "whole heads: the shared RoPE key's gradient is summed over the heads piece by piece)";
    if (c->num_kv_heads % tp != 0 && tp % c->num_kv_heads != 0)
        return "tp and the number of kv heads: one must divide the other (the kv heads are split over the ranks, or "
               "each kv head is replicated over the tp / kv heads ranks whose query heads read it)";
    if (c->tp_shards < 0 || !power_of_two(S) || S % tp != 0)
        return "tp_shards must be a power of two that tp divides (the fixed pieces of the tensor-parallel sums)";
    if (((long)c->num_heads * hd) % S != 0 || ((long)c->num_kv_heads * hd) % S != 0)
        return "tp_shards must divide heads x head_dim and kv heads x head_dim (the split widths)";
    if (c->vocab_size % S != 0) /* the embedding and lm_head are split by vocabulary rows, its loss by pieces */
        return "tp_shards must divide the vocabulary size (pad the vocabulary to a multiple of it: the tokenizer's ids "
               "stay below the real size, the extra rows are never a target)";
    for (int l = 0; l < c->num_layers; l++)
        if (!moe_model_layer_is_moe(c, l) && moe_model_dense_d_ff(c) % S != 0)
            return "tp_shards must divide d_ff (or dense_d_ff where given: the split width of the dense FFN layers)";
    return NULL;
}

const char *moe_model_config_problem(const moe_model_config *c) {
    if (c->vocab_size < 2) return "vocab size must be at least 2"; /* token files hold up to 2^32 - 1 */
    if (c->num_layers < 1 || c->num_layers > MOE_MODEL_MAX_LAYERS) return "the number of layers must be 1 to 256";
    if (c->d_model < 2) return "d_model must be at least 2";
    if (c->family < 0 || c->family >= MOE_MODEL_FAMILIES)
        return "family must be mixtral, qwen3_moe, olmoe, qwen2_moe, deepseek_v3 or deepseek_v2";
    if (c->shared_d_ff < 0) return "the shared expert's width must be 0 (none) or positive";
    if (c->shared_d_ff > 0 && c->moe_every >= 1 && c->first_dense >= 0 && !moe_model_moe_layers(c))
        return "a shared expert (--shared-d-ff) runs beside the routed experts of the MoE layers, and this model has "
               "none (one expert, or no layer an MoE layer by --moe-every and --first-dense-layers): drop it";
    if (moe_model_deepseek(c) && c->d_ff > 0 && c->shared_d_ff % c->d_ff)
        return "DeepSeek's shared experts are n_shared_experts x moe_intermediate_size wide: the shared expert's "
               "width (--shared-d-ff) must be a multiple of d_ff";
    if (c->num_heads < 1) return "the number of heads must be at least 1";
    if (c->head_dim < 0) return "head_dim must be positive (0: d_model / heads)";
    if (c->head_dim == 0 && c->d_model % c->num_heads != 0)
        return "the number of heads must divide d_model (or head_dim be given: --head-dim, Qwen3-MoE's)";
    if (c->head_dim > 0 && c->family != MOE_MODEL_FAMILY_QWEN3_MOE && !moe_model_mla(c) &&
        (long long)c->head_dim * c->num_heads != c->d_model)
        return "head_dim other than d_model / heads is Qwen3-MoE's (--family qwen3_moe) or multi-head latent "
               "attention's (--kv-lora-rank): Mixtral's and OLMoE's attention derive it";
    if (moe_model_head_dim(c) % 2 != 0) return "head_dim must be even (RoPE rotates pairs)";
    if (c->num_kv_heads < 1 || c->num_heads % c->num_kv_heads != 0)
        return "the number of kv heads must divide the number of heads";
    if (c->d_ff < 1) return "d_ff must be at least 1";
    if (c->dense_d_ff < 0) return "dense_d_ff must be 0 (d_ff) or positive";
    if (c->first_dense < 0 || c->first_dense > c->num_layers)
        return "first_dense (first_k_dense_replace) must be between 0 and the number of layers";
    if (c->seq_len < 1) return "the sequence length must be at least 1";
    if (c->moe_every < 1) return "moe_every (--moe-every; Qwen's decoder_sparse_step) must be at least 1";
    if (c->tie_embeddings != 0 && c->tie_embeddings != 1) return "tie_embeddings must be 0 or 1";
    if (!(c->rope_theta > 0) || !isfinite(c->rope_theta)) return "rope theta must be a positive number";
    const char *yarn = yarn_problem(&c->yarn);
    if (yarn) return yarn;
    if (c->yarn.factor > 0 && !(c->rope_theta > 1)) /* its ramp divides by log theta: NaN frequencies (a probe) */
        return "YaRN needs a RoPE theta above 1 (its ramp between beta_fast and beta_slow divides by log theta)";
    if (!(c->norm_eps > 0) || !isfinite(c->norm_eps)) return "the norm epsilon must be a positive number";
    if (c->moe.d_model != c->d_model || c->moe.d_ff != c->d_ff) return "the MoE config's d_model/d_ff must match";
    if (c->attention != MOE_ATTENTION_MATERIALIZED && c->attention != MOE_ATTENTION_FUSED)
        return "attention must be materialized or fused";
    if (c->zero < 0 || c->zero > 2) return "zero must be 0, 1 or 2";
    const char *mla = mla_problem(c);
    if (mla) return mla;
    return moe_config_problem(&c->moe);
}

const char *moe_model_layout_problem(const moe_model_config *c, int tp, int ep) {
    const char *problem = moe_model_config_problem(c);
    if (!problem) problem = tensor_parallel_problem(c, tp);
    return problem ? problem : moe_config_ep_problem(&c->moe, ep);
}
