/* model.h — the MoE decoder language model (Mixtral's architecture), on one rank of any layout, on any runtime
 * with a dense-ops table (moe/dense_ops.h; today the CPU).
 *
 *   tokens -> embedding -> L x [ x += attn(rmsnorm(x));  x += ffn(rmsnorm(x)) ] -> rmsnorm -> lm_head
 *   attn: causal multi-head attention with RoPE (rotate-half) and grouped-query heads;
 *   ffn:  an MoE layer (router + SwiGLU experts, moe/moe.h) on MoE layers, a dense SwiGLU elsewhere;
 *   loss: cross-entropy of the next token.
 *
 * Parameters of a rank live in one buffer [dense | local experts] (DESIGN.md): dense = everything that is
 * replicated (embedding, attention, norms, routers, dense FFNs, lm_head), summed over the world;
 * experts = this rank's experts of every MoE layer, summed over the expert-data-parallel group.
 * Gradients mirror the buffer. Tensor shapes are Hugging Face Mixtral's (out_features x in_features). */
#ifndef MOE_MODELS_MODEL_H
#define MOE_MODELS_MODEL_H

#include <stddef.h>

#include "alltoall/parallel.h"
#include "moe/dense_ops.h"
#include "moe/moe.h"
#include "moe/runtime.h"

/* YaRN (Peng et al. 2023; a Hugging Face config's rope_scaling of type "yarn"): RoPE's frequencies blended between
 * the pretrained ones and those interpolated by `factor` (kernels/rope.h), cos and sin scaled by an attention factor
 * (given, else m(factor, mscale) / m(factor, mscale_all_dim) where both are given, else m(factor, 1), with
 * m(s, k) = 0.1 k ln s + 1 for s > 1, else 1), and multi-head latent attention's softmax scale times
 * m(factor, mscale_all_dim)^2 (DeepSeek's; where mscale_all_dim is given). transformers' formulas, field for field. */
typedef struct {
    float factor;           /* 0: no YaRN; else >= 1                                               */
    int original_positions; /* the context pretrained on (original_max_position_embeddings)         */
    float beta_fast, beta_slow; /* the ramp's ends in rotations over that context (32, 1)           */
    float mscale, mscale_all_dim, attention_factor; /* 0: not given                                 */
} moe_yarn_config;

/* The most decoder layers a model may have (moe-train's --layers; a config.json's num_hidden_layers of 2^31 made
 * every per-layer count loop for seconds: fuzzing, 2026-12-08). DeepSeek-V3 has 61. */
enum { MOE_MODEL_MAX_LAYERS = 256 };

typedef struct {
    int vocab_size;     /* V                                                                  */
    int num_layers;     /* L, 1 to MOE_MODEL_MAX_LAYERS                                       */
    int d_model;        /* d                                                                  */
    int num_heads;      /* H                                                                  */
    int num_kv_heads;   /* KV, divides H (KV < H: grouped-query attention)                     */
    int head_dim;       /* hd, even (RoPE); 0: d / H (Mixtral's and OLMoE's rule; Qwen3's is its own) */
    int family;         /* MOE_MODEL_FAMILY_*: the attention's q/k norms, the tensors' names, config.json */
    int d_ff;           /* hidden width of each expert (and of the dense FFNs, unless dense_d_ff) */
    int dense_d_ff;     /* hidden width of the dense FFN layers (Qwen's intermediate_size beside moe_intermediate_size,
                           DeepSeek's first layers); 0: d_ff                                     */
    int first_dense;    /* the first this many layers are dense (DeepSeek's first_k_dense_replace); 0: none */
    /* multi-head latent attention (DeepSeek-V2/V3's MLA; models/mla.c) where kv_lora_rank > 0: q from ln1 directly
     * or through a rank-q_lora_rank bottleneck with an RMSNorm; k and v of every head from a latent of kv_lora_rank
     * (RMSNorm'd) and one RoPE'd key of qk_rope_dim shared by the heads; head_dim (the q/k heads') = qk_nope +
     * qk_rope_dim; v heads of v_head_dim <= head_dim; num_kv_heads = num_heads; at any tp (tp_shards dividing the
     * heads: "Tensor parallelism" below) */
    int q_lora_rank, kv_lora_rank, qk_rope_dim, v_head_dim;
    int shared_d_ff;    /* hidden width of a shared expert beside the routed ones in every MoE layer (0: none): a
                           SwiGLU over every token, its weights replicated (data-parallel at any layout), gated by
                           a sigmoid in Qwen2-MoE (moe_model_shared_gate), added to the routed experts' output   */
    int seq_len;        /* S, tokens per sequence                                             */
    int moe_every;      /* layer l's FFN is MoE iff (l + 1) % moe_every == 0 (and E > 1)        */
    int tie_embeddings; /* 1: lm_head is the embedding matrix                                 */
    float rope_theta;
    moe_yarn_config yarn; /* YaRN's RoPE context extension (factor 0: plain RoPE): moe_model_rope */
    float norm_eps;
    int max_positions;  /* config.json's max_position_embeddings: max(S, a loaded checkpoint's, YaRN's factor x
                           original); a label (RoPE has no table), 0: S                          */
    moe_config moe;     /* experts, top-k, routing, capacity, aux/z coefficients               */
    int attention;      /* how attention runs (not the function: not in config.json): MOE_ATTENTION_* */
    int zero;           /* ZeRO level, 0-2 (not in config.json): 1 and 2 give each rank a range of every region to
                           update (models/zero.h); 2 also keeps no whole gradient (models/zero_grads.h) and needs
                           moe.num_shards > 0 */
    int tp_shards;      /* S, the fixed pieces of tp/linear.h (--tp-shards), a numerics choice: 0 means the layout's
                           tp (moe_model_tp_pieces); else a power of two that tp divides and that divides H * head_dim
                           and KV * head_dim. The same S gives the same bits at any tp                  */
} moe_model_config;
/* The layout's numbers (tp, ep, pp) are not the config's: they live in the rank grid (pipeline/grid.h) and its
 * moe_parallel (alltoall/parallel.h), which the model reads them from (moe_parallel_ranks: tp_size, ep_size); what
 * depends on them takes them as arguments. */

/* Tensor parallelism with sequence parallelism (Megatron-LM's, issue 28), on a layout of tp > 1 (alltoall/parallel.h;
 * tp a power of two dividing H, and dividing KV or a multiple of it: moe_model_layout_problem): q/k/v are
 * column-parallel (each rank holds H/tp heads and KV/tp kv heads), o_proj row-parallel, and so are a dense FFN's
 * gate/up and down (d_ff/tp each), through tp/linear.h's fixed pieces; the embedding and lm_head hold V/tp rows of the
 * vocabulary each: the lookup is added over the group (one value and -0.0s: exact), the logits are [T, V/tp] and the
 * loss tp/vocab_cross_entropy.h's (with tp_shards > 1 all of these run in pieces, even at tp 1). The residual stream,
 * the norms and the MoE layers run on each rank's slice of its tensor group's tokens (rows [tp_rank T/tp, (tp_rank + 1)
 * T/tp) of the group's T), gathered before the attention block, a dense FFN and the head, and cut again after the
 * row-parallel sums (those row moves: tp/sequence.h). So an MoE layer sees T/tp distinct tokens per rank and the layout
 * of tp 1 over the stage (grid.h's folding). Gradients: the tensor-parallel pieces' summed over the data-parallel
 * group, formed over the group's T rows in the batch tree's shards (models/shard_grads.h); the replicated tensors' over
 * the stage, over the slice. Pipeline stages pass each rank's slice. Activations are the slice's and the rank's heads'
 * and vocabulary columns' (models/model_activations.h; ln1 too, gathered again in backward as Megatron does), but for a
 * dense FFN's ln2 and the final norm's output, kept gathered, and two [T, d] scratch buffers of the group's rows. ZeRO
 * shards the dense state over the data-parallel group, whose members hold the same blocks; ZeRO-2 sums a layer's
 * replicated tensors over the tensor group before its reduce-scatter over that group (models/zero_grads.h), and the
 * norm gathers each tensor's gradient in turn (models/optimizer.c).
 *
 * Grouped-query attention: a kv head's gradients of k and v are sums over its G = H/KV query heads, which the
 * attention kernel adds in head order. When the pieces allow a tp above KV (P, the largest power of two dividing S and
 * H, above KV and a multiple of it), those sums are formed in the fixed tree instead, so that ranks holding different
 * query heads of one kv head give the same bits: the query heads are cut into C = P/KV chunks (moe_model_kv_chunks),
 * attention reads one copy of k and v per chunk (a rank's kv heads repeated C x KV / tp times: the same values, so the
 * forward is unchanged), and the copies' gradients are added in the tree, locally and then over the ranks sharing the
 * kv head, before RoPE's backward. With tp > KV (tp a multiple of KV) each rank holds its query heads' one kv head:
 * k_proj and v_proj are KV blocks (moe_model_kv_blocks), each held by tp/KV consecutive ranks, which compute the same
 * gradient of it; their input gradients are the plain split's (rank r: rows [r B/tp, (r+1) B/tp)), and the norm and
 * the checkpoints count each block once.
 *
 * The families' q/k norms (below; models/attention.c), at any tp: each head's (Qwen3) run on the rank's heads (with
 * tp > KV each sharer of a kv head norms its k, after the sharers' sum of its gradient in backward), their weight
 * gradient formed over the slice's rows of every head (x, dy and 1 / rms moved there by an all-to-all; a kv head's
 * from the first of the ranks holding it, so that each is counted once). The whole projection's (OLMoE) read a
 * token's every head, so its rows move instead of its sum: an all-to-all over the tensor group gives each rank its
 * slice's rows of every column (a kv head's block from the first of the ranks holding it), normed there as at tp 1,
 * and the inverse moves the normed rows back (tp/sequence.h); backward moves dy there and dx back, and forms the weight
 * gradient over the slice's rows, as any replicated tensor's.
 *
 * Multi-head latent attention (models/mla.c): q_a and kv_a with their norms replicated, run on the slice's rows and
 * their outputs gathered (instead of ln1); q_b (or q_proj) and kv_b column-parallel by heads, o_proj row-parallel;
 * the shared RoPE key's gradient, a sum over every head, added within each fixed piece in head order and over the
 * pieces in their tree (tp_shards must divide the heads). */

/* The model families (their Hugging Face names): the same decoder, with these differences:
 *   MIXTRAL    (MixtralForCausalLM): no q/k norms; the MoE block is "block_sparse_moe" (router "gate", experts w1,
 *              w3, w2); head_dim = d / H.
 *   QWEN3_MOE  (Qwen3MoeForCausalLM): an RMSNorm of each head's q and of each kv head's k, after the projections and
 *              before RoPE, one weight [hd] each per layer (q_norm, k_norm); head_dim its own; the MoE block is "mlp"
 *              (router "gate", experts gate_proj, up_proj, down_proj).
 *   OLMOE      (OlmoeForCausalLM): an RMSNorm over the whole q projection [H hd] and the whole k projection
 *              [KV hd] (weights of those widths); head_dim = d / H; the MoE block named as Qwen3's.
 *   QWEN2_MOE  (Qwen2MoeForCausalLM): biases on q, k and v (self_attn.*_proj.bias); a shared expert of its own
 *              width (shared_d_ff) beside the routed ones, scaled by a sigmoid gate (mlp.shared_expert_gate [1, d]);
 *              head_dim = d / H; the MoE block named as Qwen3's (the shared expert "mlp.shared_expert.*").
 *   DEEPSEEK_V3 (DeepseekV3ForCausalLM): multi-head latent attention (kv_lora_rank > 0, below), shared experts
 *              without a gate ("mlp.shared_experts.*", n_shared_experts x moe_intermediate_size wide), sigmoid router
 *              scores with the selection bias (mlp.gate.e_score_correction_bias), group-limited top-k, routed scaling,
 *              the first first_dense layers dense; the MoE block named as Qwen3's. Its checkpoints keep RoPE's pairs
 *              interleaved (rope_interleave): checkpoint/ reorders those rows on load (our RoPE is rotate-half).
 *   DEEPSEEK_V2 (DeepseekV2ForCausalLM: DeepSeek-V2 and V2-Lite): DeepSeek-V3's layers and names with softmax router
 *              scores, greedy top-k without renormalisation (transformers' V2 ignores norm_topk_prob), routed scaling
 *              and no selection bias; RoPE's pairs always interleaved in its files (reordered on load and on save).
 * The routing (softmax top-k, renormalised or not), RoPE (rotate-half), the SwiGLU experts and the norms are the same
 * function in all three. */
enum {
    MOE_MODEL_FAMILY_MIXTRAL = 0,
    MOE_MODEL_FAMILY_QWEN3_MOE = 1,
    MOE_MODEL_FAMILY_OLMOE = 2,
    MOE_MODEL_FAMILY_QWEN2_MOE = 3,
    MOE_MODEL_FAMILY_DEEPSEEK_V3 = 4,
    MOE_MODEL_FAMILY_DEEPSEEK_V2 = 5,
    MOE_MODEL_FAMILIES = 6
};
/* The q/k norms of a family: none, each head's (Qwen3), or the whole projection's (OLMoE). */
typedef enum { MOE_QK_NORM_NONE, MOE_QK_NORM_HEAD, MOE_QK_NORM_PROJECTION } moe_qk_norm;
moe_qk_norm moe_model_qk_norm(const moe_model_config *cfg);
/* Whether q, k and v have biases (Qwen2-MoE); whether the shared expert (shared_d_ff > 0) is gated (Qwen2-MoE). */
int moe_model_qkv_bias(const moe_model_config *cfg);
int moe_model_shared_gate(const moe_model_config *cfg);
/* cfg->head_dim, with 0 read as d_model / heads. */
int moe_model_head_dim(const moe_model_config *cfg);
/* RoPE's frequencies and amplitude (theta and YaRN: moe_yarn_config); the factor multi-head latent attention's softmax
 * scale 1 / sqrt(head_dim) is multiplied by (1 but with YaRN's mscale_all_dim). */
moe_rope moe_model_rope(const moe_model_config *cfg);
double moe_model_mla_softmax_factor(const moe_model_config *cfg);
/* Whether the family is DeepSeek's (V2 or V3): their tensor names, MLA and shared experts. */
int moe_model_deepseek(const moe_model_config *cfg);
/* "mixtral", "qwen3_moe", "olmoe", "qwen2_moe", "deepseek_v3", "deepseek_v2": config.json's model_type and --family's
 * names; NULL outside the range. */
const char *moe_model_family_name(int family);

/* MATERIALIZED keeps the probabilities [seqs, H, S, S] for backward; FUSED keeps each row's log-sum-exp [seqs, H, S]
 * and recomputes tiles of probabilities in backward (kernels/attention.h). The same function, rounded otherwise. */
enum { MOE_ATTENTION_MATERIALIZED = 0, MOE_ATTENTION_FUSED = 1 };

/* Mixtral-like defaults for a small model: V=256, L=4, d=128, H=4, KV=4, d_ff=256, S=128, E=8, k=2; fused
 * attention. */
moe_model_config moe_model_config_default(void);
/* NULL when the shapes are valid, else a sentence naming the first wrong field. */
const char *moe_model_config_problem(const moe_model_config *cfg);
/* NULL when the config is valid on a layout of tensor-parallel size tp and expert-parallel size ep (its shapes, then
 * tp and tp_shards against them, then ep against the experts), else the sentence of the first problem. */
const char *moe_model_layout_problem(const moe_model_config *cfg, int tp, int ep);
/* Layer l's FFN is MoE iff E > 1, l >= first_dense and (l + 1) % moe_every == 0. */
int moe_model_layer_is_moe(const moe_model_config *cfg, int layer);
/* How many of the layers are MoE layers (0: a dense model). */
int moe_model_moe_layers(const moe_model_config *cfg);
/* Whether the attention is multi-head latent attention (kv_lora_rank > 0). */
int moe_model_mla(const moe_model_config *cfg);
/* cfg->dense_d_ff, with 0 read as d_ff. */
int moe_model_dense_d_ff(const moe_model_config *cfg);
/* The fixed pieces at tensor-parallel size tp: cfg->tp_shards, with 0 read as tp. */
int moe_model_tp_pieces(const moe_model_config *cfg, int tp);
/* Grouped-query attention under fixed pieces at tensor-parallel size tp ("Tensor parallelism" below): the chunks C each
 * kv head's query heads are cut into, whose gradients of k and v are added in the fixed tree (1: one sum, the
 * kernel's); and the distinct blocks of k_proj and v_proj over the tensor group, min(tp, KV). */
int moe_model_kv_chunks(const moe_model_config *cfg, int tp);
int moe_model_kv_blocks(const moe_model_config *cfg, int tp);

/* The tensors of one decoder layer, as one list: X(field of moe_model_layer_params, Hugging Face name after
 * "model.layers.N.", rows, cols (0: a vector), kind, split). Rows and cols are the whole tensor's, expressions in d
 * (d_model), A (H * hd), B (KV * hd), F (d_ff), DF (the dense FFNs' width) and E (experts); split says how tensor parallelism cuts it: ROWS
 * (column-parallel: rows of the output features), COLS (row-parallel: columns of the input features) or NONE
 * (replicated). The list drives the buffer layout, the views, the checkpoint names, the optimizer's weight decay and
 * the initialisation, so a tensor is added here and nowhere else. */
/* (a layer's attention block: its norm, its projections (these, or multi-head latent attention's below), the FFN's
 * norm, in this order) */
#define MOE_MODEL_ATTENTION_NORM_TENSORS(X) X(attn_norm, "input_layernorm.weight", d, 0, MOE_TENSOR_NORM, NONE)
#define MOE_MODEL_ATTENTION_TENSORS(X)                                          \
    X(wq, "self_attn.q_proj.weight", A, d, MOE_TENSOR_WEIGHT, ROWS)            \
    X(wk, "self_attn.k_proj.weight", B, d, MOE_TENSOR_WEIGHT, KV_ROWS)         \
    X(wv, "self_attn.v_proj.weight", B, d, MOE_TENSOR_WEIGHT, KV_ROWS)         \
    X(wo, "self_attn.o_proj.weight", d, A, MOE_TENSOR_RESIDUAL, COLS)
#define MOE_MODEL_FFN_NORM_TENSORS(X) X(ffn_norm, "post_attention_layernorm.weight", d, 0, MOE_TENSOR_NORM, NONE)
/* a family's q/k norms (moe_model_qk_norm): QN = hd (each head's) or A (the projection's), KN = hd or B */
#define MOE_MODEL_QK_NORM_TENSORS(X)                                            \
    X(q_norm, "self_attn.q_norm.weight", QN, 0, MOE_TENSOR_NORM, NONE)         \
    X(k_norm, "self_attn.k_norm.weight", KN, 0, MOE_TENSOR_NORM, NONE)
/* Qwen2-MoE's q, k and v biases (moe_model_qkv_bias), split as their projections */
#define MOE_MODEL_QKV_BIAS_TENSORS(X)                                           \
    X(bq, "self_attn.q_proj.bias", A, 0, MOE_TENSOR_BIAS, ROWS)                \
    X(bk, "self_attn.k_proj.bias", B, 0, MOE_TENSOR_BIAS, KV_ROWS)             \
    X(bv, "self_attn.v_proj.bias", B, 0, MOE_TENSOR_BIAS, KV_ROWS)
/* Multi-head latent attention's projections instead of q/k/v/o (moe_model_mla; DeepSeek's names; the low-rank q_a and
 * kv_a replicated, q_b (or q_proj) and kv_b column-parallel by heads, o_proj row-parallel: models/mla.c):
 * QL = q_lora_rank (q_a, its norm, q_b; with QL 0 the plain q_proj above), KLR = kv_lora_rank + qk_rope_dim, KL =
 * kv_lora_rank, HNV = H (qk_nope + v_head_dim), HV = H v_head_dim */
#define MOE_MODEL_MLA_Q_LORA_TENSORS(X)                                         \
    X(mla.q_a, "self_attn.q_a_proj.weight", QL, d, MOE_TENSOR_WEIGHT, NONE)     \
    X(mla.q_a_norm, "self_attn.q_a_layernorm.weight", QL, 0, MOE_TENSOR_NORM, NONE) \
    X(mla.q_b, "self_attn.q_b_proj.weight", A, QL, MOE_TENSOR_WEIGHT, ROWS)
#define MOE_MODEL_MLA_Q_TENSORS(X) X(wq, "self_attn.q_proj.weight", A, d, MOE_TENSOR_WEIGHT, ROWS)
#define MOE_MODEL_MLA_KV_TENSORS(X)                                             \
    X(mla.kv_a, "self_attn.kv_a_proj_with_mqa.weight", KLR, d, MOE_TENSOR_WEIGHT, NONE) \
    X(mla.kv_a_norm, "self_attn.kv_a_layernorm.weight", KL, 0, MOE_TENSOR_NORM, NONE)   \
    X(mla.kv_b, "self_attn.kv_b_proj.weight", HNV, KL, MOE_TENSOR_WEIGHT, ROWS)          \
    X(wo, "self_attn.o_proj.weight", d, HV, MOE_TENSOR_RESIDUAL, COLS)
/* the FFN of an MoE layer: the router (dense, replicated) ... */
#define MOE_MODEL_ROUTER_TENSORS(X) X(ffn.router_w, "block_sparse_moe.gate.weight", E, d, MOE_TENSOR_WEIGHT, NONE)
/* ... and its experts, one tensor per expert ("block_sparse_moe.experts.J." + name), in the expert region */
#define MOE_MODEL_EXPERT_TENSORS(X)                                             \
    X(ffn.w1, "w1.weight", F, d, MOE_TENSOR_WEIGHT, NONE)                      \
    X(ffn.w3, "w3.weight", F, d, MOE_TENSOR_WEIGHT, NONE)                      \
    X(ffn.w2, "w2.weight", d, F, MOE_TENSOR_RESIDUAL, NONE)
/* ... a shared expert beside them (shared_d_ff = SF > 0; replicated), and its sigmoid gate (Qwen2-MoE) */
#define MOE_MODEL_SHARED_TENSORS(X)                                             \
    X(shared.w1, "mlp.shared_expert.gate_proj.weight", SF, d, MOE_TENSOR_WEIGHT, NONE) \
    X(shared.w3, "mlp.shared_expert.up_proj.weight", SF, d, MOE_TENSOR_WEIGHT, NONE)   \
    X(shared.w2, "mlp.shared_expert.down_proj.weight", d, SF, MOE_TENSOR_RESIDUAL, NONE)
#define MOE_MODEL_SHARED_GATE_TENSORS(X) X(shared_gate, "mlp.shared_expert_gate.weight", 1, d, MOE_TENSOR_WEIGHT, NONE)
/* (Qwen3-MoE, OLMoE and Qwen2-MoE name the MoE block "mlp.gate.weight" and "mlp.experts.J." + the dense FFN's names below:
 * models/tensors.c translates) */
/* the FFN of a dense layer (Mixtral has none: Llama's names) */
#define MOE_MODEL_DENSE_FFN_TENSORS(X)                                          \
    X(ffn.w1, "mlp.gate_proj.weight", DF, d, MOE_TENSOR_WEIGHT, ROWS)          \
    X(ffn.w3, "mlp.up_proj.weight", DF, d, MOE_TENSOR_WEIGHT, ROWS)            \
    X(ffn.w2, "mlp.down_proj.weight", d, DF, MOE_TENSOR_RESIDUAL, COLS)

/* How a tensor is initialised and decayed: norms start at 1 and biases at 0, neither decayed; weights are uniform
 * with standard deviation 0.02, residual output projections 0.02 / sqrt(2 L) (GPT-2). */
typedef enum { MOE_TENSOR_NORM, MOE_TENSOR_WEIGHT, MOE_TENSOR_RESIDUAL, MOE_TENSOR_BIAS } moe_tensor_kind;

/* How tensor parallelism cuts a tensor (the lists' last column): this rank holds block tp_rank of tp along it. KV_ROWS,
 * only in the lists: ROWS in whole kv heads, which are min(tp, KV) blocks (the table says ROWS, with its parts). */
typedef enum { MOE_SPLIT_NONE, MOE_SPLIT_ROWS, MOE_SPLIT_COLS, MOE_SPLIT_KV_ROWS } moe_tensor_split;

/* Views of one layer's parameters (or gradients) in the rank's buffer. */
typedef struct {
    moe_real *attn_norm;      /* [d]               input_layernorm                      */
    moe_real *wq, *wk, *wv;   /* [H*hd, d], [KV*hd, d], [KV*hd, d]                      */
    moe_real *q_norm, *k_norm; /* [QN], [KN] (MOE_MODEL_QK_NORM_TENSORS); NULL without  */
    moe_real *bq, *bk, *bv;   /* [H*hd], [KV*hd], [KV*hd] (Qwen2-MoE); NULL without       */
    struct {                  /* multi-head latent attention's (moe_model_mla); NULL without */
        moe_real *q_a, *q_a_norm, *q_b, *kv_a, *kv_a_norm, *kv_b;
    } mla;
    moe_real *wo;             /* [d, H*hd]                                              */
    moe_real *ffn_norm;       /* [d]               post_attention_layernorm             */
    moe_layer_weights ffn;    /* MoE: router + local experts; dense: w1, w3, w2 of one "expert",
                                 router_w NULL                                          */
    moe_layer_weights shared; /* an MoE layer's shared expert (shared_d_ff > 0): w1, w3, w2 */
    moe_real *shared_gate;    /* [1, d] its sigmoid gate (Qwen2-MoE); NULL without      */
} moe_model_layer_params;

typedef struct {
    moe_real *embedding;      /* [V, d]                                                 */
    moe_model_layer_params *layers;
    moe_real *final_norm;     /* [d]                                                    */
    moe_real *lm_head;        /* [V, d]; the embedding when tied                        */
} moe_model_views;

/* One tensor of the rank's parameter buffer, in buffer order: [dense | local experts]. */
typedef struct {
    char name[112];       /* Hugging Face name; an expert tensor's has "%d" where the global expert id goes */
    int layer;            /* its decoder layer; -1 for the embedding, num_layers for the final norm and lm_head */
    int experts;          /* 0: a dense tensor; else the local experts whose tensors it holds, back to back */
    int ndim;
    long rows, cols;      /* one tensor's (one expert's) shape as this rank holds it; cols 0 for a vector */
    moe_tensor_split split; /* under tensor parallelism: the whole tensor is `parts` blocks along it (rows or cols
                               above are the block's), this rank's moe_model_tensor_part; NONE: whole               */
    int parts;            /* 1 (NONE); tp; or for k_proj and v_proj with fewer kv heads than tp, KV: each block then
                             held by tp / KV consecutive ranks of the tensor group                                   */
    size_t offset, count; /* reals in the buffer: count = max(experts, 1) * rows * max(cols, 1) */
    moe_tensor_kind kind;
    int index;            /* its place in the table of the whole model (one stage): the same on every stage, so
                             what is keyed by it (the weights' random streams) does not depend on the stages */
    int replica;          /* 1: a copy of a tensor another stage holds — the tied embedding as the last stage's lm_head
                             (index 0, the embedding's): its gradient goes to the first stage, which updates the
                             tensor and sends it back (moe_model_sync_tied); never updated, counted in the norm or
                             saved here */
} moe_model_tensor;

/* Whether AdamW's weight decay applies to t (not to norms and biases). */
static inline int moe_tensor_decays(const moe_model_tensor *t) {
    return t->kind != MOE_TENSOR_NORM && t->kind != MOE_TENSOR_BIAS;
}

/* The block of tensor t that rank tp_rank of a tensor group of tp holds. */
static inline int moe_model_tensor_part(const moe_model_tensor *t, int tp, int tp_rank) {
    return tp_rank / (tp / t->parts);
}

typedef struct moe_model moe_model;
typedef struct moe_zero_layout moe_zero_layout; /* models/zero.h */

/* rt: where it runs (NULL: the CPU); it needs a dense-ops table (MOE_ERR_INVALID_CONFIG otherwise). par: the
 * layout. max_seqs: the most sequences one forward will see on this rank. accum_steps: micro-batches per step
 * (the aux and z-loss coefficients are divided by it, as the cross-entropy is). */
moe_status moe_model_create(const moe_model_config *cfg, moe_runtime *rt, const moe_parallel *par, int max_seqs,
                            int accum_steps, moe_model **out);

/* A pipeline stage's part of the model (pipeline/schedule.h): the decoder layers [first_layer, first_layer +
 * num_layers); the stage holding layer 0 also holds the embedding, the one holding the last layer the final norm,
 * the lm_head and the loss. Its buffer [dense | local experts] holds those tensors only, in the whole model's order.
 * passes: the forwards whose activations are kept at once for their backwards (the stash: a 1F1B schedule keeps up
 * to pipeline/schedule.h's max_in_flight); each pass has its own activations and MoE routing, the scratch is shared.
 * With chunks (the interleaved schedule: V model chunks per pipeline rank, chunk c of stage s being virtual stage
 * c p + s), a stage holds V equal ranges of layers, each with its own passes; a forward or backward runs one chunk
 * (the selected pass's), which embeds when it starts at layer 0 and ends with the head when it ends at the last.
 * Tied embeddings on a pipeline: the last stage holds a replica of the embedding as its lm_head (moe_model_tensor's
 * replica), its gradient summed there over the step and sent to the first stage (models/tied_grads.h,
 * moe_model_finish_tied_grads); the first stage's updated embedding is sent back after each step
 * (moe_model_sync_tied). Both over the layout's pipeline communicator (pipeline rank 0 and the last). */
/* How a pipeline cuts the decoder layers: pp stages of `chunks` equal chunks each (the interleaved schedule; pp x
 * chunks divides the layers), or with one chunk a stage, stages of equal layers but for the first and the last, which
 * hold first_layers and last_layers where given (Megatron's --decoder-first/last-pipeline-num-layers: a model whose
 * layers pp does not divide, DeepSeek-V3's 61 or Qwen3-235B's 94, and the ends' embedding and head balanced), the
 * stages between them an equal share of the rest. 0: an equal share. */
typedef struct {
    int pp, chunks;
    int first_layers, last_layers;
} moe_pipeline_split;
/* NULL when the split cuts num_layers layers (every stage at least one layer), else the sentence saying why not. */
const char *moe_pipeline_split_problem(const moe_pipeline_split *split, int num_layers);
/* With one chunk a stage: stage s's layers, the first of them in *first. */
int moe_pipeline_split_stage(const moe_pipeline_split *split, int num_layers, int s, int *first);

typedef struct {
    int first_layer, num_layers; /* chunk 0: layers [first_layer, first_layer + num_layers)                        */
    int chunks;                  /* V: chunks of num_layers layers each, chunk c from first_layer + c * chunk_stride
                                    (the interleaved schedule's model chunks); 0 or 1: one                          */
    int chunk_stride;
    int passes;                  /* per chunk */
    moe_pipeline_split split;    /* the pipeline's cut it is a stage of (pp 0 or 1: none) */
} moe_model_stage;
enum { MOE_MODEL_MAX_CHUNKS = 64 };
/* Every layer, one pass: what moe_model_create makes. */
moe_model_stage moe_model_stage_whole(const moe_model_config *cfg);
/* Stage `stage` of a pipeline cut by split (moe_pipeline_split_problem says it can), with `passes` per chunk: with
 * chunks, chunk c is virtual stage v = c pp + stage, layers [v n, (v + 1) n) with n = L / (pp chunks); and which stage
 * holds layer `layer` (-1, the embedding: the first; num_layers, the final norm and lm_head: the last). The one rule
 * the trainer and the checkpoints share (moe-plan's plan/pipeline.c counts the same). */
moe_model_stage moe_model_pipeline_stage(const moe_model_config *cfg, const moe_pipeline_split *split, int stage,
                                         int passes);
int moe_model_pipeline_stage_of(const moe_model_config *cfg, const moe_pipeline_split *split, int layer);
moe_status moe_model_create_stage(const moe_model_config *cfg, moe_runtime *rt, const moe_parallel *par,
                                  const moe_model_stage *stage, int max_seqs, int accum_steps, moe_model **out);
void moe_model_destroy(moe_model *m);

/* What moe_model_create will allocate for a cfg valid at tensor-parallel size tp and expert-parallel size ep, and
 * max_seqs, before anything is allocated (moe-train refuses a configuration that cannot fit): the reals of the dense
 * region and of this rank's experts, and the bytes of the activations the model keeps. The MoE layers' routing and
 * expert buffers come on top. */
typedef struct {
    size_t dense_params, expert_params;
    size_t activation_bytes;
} moe_model_footprint;
moe_model_footprint moe_model_config_footprint(const moe_model_config *cfg, int tp, int ep, int max_seqs);
/* The same for a stage (every pass's activations; zeros for a stage create refuses). */
moe_model_footprint moe_model_stage_footprint(const moe_model_config *cfg, int tp, int ep,
                                              const moe_model_stage *stage, int max_seqs);

/* The buffers are the runtime's memory (host memory on the CPU). moe_model_params counts as a change of the
 * parameters: the GEMMs' bf16 copies of them are made again at the next forward, and kept until the next call (once
 * per optimizer step). So write through the pointer before the next forward, never after it without calling again. */
moe_real *moe_model_params(moe_model *m);
/* The whole gradient buffer, laid out as the parameters; NULL under ZeRO-2 (cfg.zero 2), which has none. */
moe_real *moe_model_grads(moe_model *m);
/* The ZeRO ranges and the norm's atoms of this rank's buffer (models/zero.h). */
const moe_zero_layout *moe_model_zero(const moe_model *m);
/* The gradients of this rank's range of a region (expert 0: dense, 1: experts), once the step's are summed: in the
 * whole buffer, or in ZeRO-2's shard. What the optimizer reads (models/optimizer.h). */
moe_real *moe_model_range_grads(moe_model *m, int expert);
size_t moe_model_num_dense(const moe_model *m);   /* reals in the dense region  */
size_t moe_model_num_expert(const moe_model *m);  /* reals in the expert region */
int moe_model_num_local_experts(const moe_model *m); /* E / ep */
const moe_model_tensor *moe_model_tensors(const moe_model *m, int *count);
/* The table of the whole model (one stage) with m's local experts, whatever stage m holds: entry i has index i; offsets
 * are the one-stage buffer's. *tensors malloc'd (the caller frees it). What a checkpoint walks: every tensor of the
 * files, held here or not. */
moe_status moe_model_whole_tensors(const moe_model *m, moe_model_tensor **tensors, int *count);
moe_runtime *moe_model_runtime(const moe_model *m);
/* The runtime's dense-ops table and this model's state for it (the optimizer's arithmetic runs there). */
const moe_dense_ops *moe_model_dense_ops(const moe_model *m, moe_dense_state **state);
/* Tests only: the model runs ops instead of its runtime's table from now on; ops must work on the state that
 * table created (a wrapper of it: moe/dense_ops_fault.h). */
void moe_model_replace_dense_ops(moe_model *m, const moe_dense_ops *ops);
const moe_parallel *moe_model_parallel(const moe_model *m);
const moe_model_config *moe_model_config_of(const moe_model *m);
/* The stage this model holds (moe_model_stage_whole's for moe_model_create). */
const moe_model_stage *moe_model_stage_of(const moe_model *m);

/* Initialises the weights from seed: every tensor (and every global expert) from its own stream, so
 * the same seed gives the same global model for any world size and ep. */
moe_status moe_model_init_weights(moe_model *m, unsigned long long seed);

/* The passes (stash entries) of a chunk: forward writes the selected one, backward reads it (chunk 0's pass 0 until
 * selected otherwise). */
moe_status moe_model_select_pass(moe_model *m, int chunk, int pass);
int moe_model_num_passes(const moe_model *m); /* per chunk */

/* A chunk's part of the gradient: its values [from, from + count) of the dense region and of the expert region (one
 * chunk: both whole). Zeroed, or summed over the ranks that share them as moe_model_reduce_grads does, chunk by chunk:
 * the interleaved schedule runs a micro-batch's chunks at different times, so a micro-batch's sum is formed per chunk
 * (ZeRO-2 sums per layer anyway). */
void moe_model_chunk_slices(const moe_model *m, int chunk, size_t *dense_from, size_t *dense_count,
                            size_t *expert_from, size_t *expert_count);
moe_status moe_model_zero_chunk_grads(moe_model *m, int chunk);
moe_status moe_model_reduce_chunk_grads(moe_model *m, int chunk);
/* Whether chunk `chunk` of this model computes the loss (ends with the head). */
int moe_model_chunk_heads(const moe_model *m, int chunk);

/* The whole model's forward (a model of one stage) over num_seqs sequences of seq_len tokens (host inputs
 * [num_seqs*S]); with targets (host), returns the sum of this rank's token losses in *loss_sum and keeps what backward
 * needs; logits_out (optional, host) receives [num_seqs*S, V]. Collective over the layout (MoE layers exchange
 * tokens). */
moe_status moe_model_forward(moe_model *m, const int *inputs, const int *targets, int num_seqs, double *loss_sum,
                             moe_real *logits_out);

/* Backward of the last forward with dL/dloss_t = loss_scale for every token: ACCUMULATES into the
 * gradient buffer (call moe_model_zero_grads first on a new step); a tied lm_head's gradient is added into the
 * embedding's at once (per rank: the world-invariant step keeps it apart, moe_model_stage_backward). Collective. */
moe_status moe_model_backward(moe_model *m, moe_real loss_scale);

/* A stage's forward of the selected pass: the first stage embeds the host tokens `inputs`, the others start from x
 * [num_seqs*S, d] (the previous stage's output, in the runtime's memory); the last stage ends with the loss of the
 * host `targets` into *loss_sum (without targets it keeps nothing for backward) and, with logits_out (host), writes
 * the logits [num_seqs*S, V] there (ignored on the other stages). Every other stage keeps what
 * backward needs, and its output stays at moe_model_stage_output until the pass's next forward. */
moe_status moe_model_stage_forward(moe_model *m, const int *inputs, const moe_real *x, const int *targets,
                                   int num_seqs, double *loss_sum, moe_real *logits_out);
const moe_real *moe_model_stage_output(const moe_model *m);
/* A stage's backward of the selected pass, accumulating as moe_model_backward does: the last stage from the loss
 * (loss_scale), the others from dy, the gradient of their output [T, d]. Ends with the gradient of the stage's input
 * at moe_model_stage_input_grad (runtime memory, until the next backward) on every stage but the first. A tied lm_head's
 * gradient is kept apart over the step until moe_model_finish_tied_grads. */
moe_status moe_model_stage_backward(moe_model *m, moe_real loss_scale, const moe_real *dy);
const moe_real *moe_model_stage_input_grad(const moe_model *m);
/* After an optimizer step with tied embeddings on a pipeline: the first stage's embedding into the last stage's
 * replica (collective over the two; nothing elsewhere). Also completes the last backward's send of the replica's
 * gradient. */
moe_status moe_model_sync_tied(moe_model *m);
moe_status moe_model_zero_grads(moe_model *m);
/* With tied embeddings, after a step's backwards: the lm_head's gradient, summed apart over the step
 * (models/tied_grads.h), added to the embedding's — before moe_model_reduce_grads without the world-invariant sums,
 * after each micro-batch's sum with them. On a pipeline the last stage sends it to the first (collective over them). */
moe_status moe_model_finish_tied_grads(moe_model *m);

/* Sums the gradients over the ranks that share them (dense: world; experts: expert-data-parallel): with
 * cfg.moe.num_shards, in the fixed tree over ranks (the shard tree's upper levels: bitwise the same sum on any
 * power-of-two world, docs/DETERMINISM.md), else the transport's all-reduce. */
moe_status moe_model_reduce_grads(moe_model *m);
/* cfg.moe.num_shards / world size: the shards of the batch this rank sums over (the loss sum of a forward and
 * every gradient of a backward are this rank's subtree of the shard tree); 0 when num_shards is 0. */
int moe_model_local_shards(const moe_model *m);

/* The first NaN or Inf of a buffer laid out like the parameters (the parameters, the gradients, a moment),
 * named: MOE_ERR_NONFINITE with "WHAT: model.layers.3.block_sparse_moe.experts.5.w2.weight[17] is the first
 * NaN or Inf". Waits for the device. */
moe_status moe_model_check_finite(moe_model *m, const moe_real *buffer, const char *what);
/* The same for a buffer in host memory (a checkpoint's tensors before they are uploaded). */
moe_status moe_model_check_finite_host(moe_model *m, const moe_real *host_buffer, const char *what);
/* The same for the gradients of this rank's ranges (moe_model_range_grads: every rank looks at its own). */
moe_status moe_model_check_range_grads_finite(moe_model *m, const char *what);

/* NaN provenance (moe_layer_set_checks for the whole model): with a finding (not NULL), forward and backward
 * look at every op's output, and the first NaN or Inf sets finding->found and writes which layer and op (and
 * inside an MoE layer which expert) produced it; the passes go on, so every rank stays in step. Slow: for
 * explaining a bad step. */
void moe_model_set_checks(moe_model *m, moe_nonfinite_finding *finding);

/* Routing statistics of the last forward, per MoE layer (layer index l, or NULL for a dense layer). */
const moe_layer_stats *moe_model_layer_stats(const moe_model *m, int layer);
/* dropless 1: every MoE layer's forwards route without a capacity limit until set back to 0 (moe_layer_set_dropless:
 * inference, whose one sequence must not depend on the copies other ranks forward beside it). */
void moe_model_set_dropless(moe_model *m, int dropless);
/* The MoE layer of layer l, or NULL for a dense layer. */
moe_layer *moe_model_moe_layer(moe_model *m, int layer);
/* The selection bias [E] of MoE layer l (state of sigmoid routing, saved in checkpoints), or NULL. */
moe_real *moe_model_expert_bias(moe_model *m, int layer);
/* Sigmoid routing: applies the bias update of every MoE layer this stage holds after a step, from the step's global
 * top-k counts selected[L * E] (per layer and expert, summed over the step's micro-batches: moe_step_result's
 * expert_tokens; until 2026-12-07 the last micro-batch's alone moved the bias). */
moe_status moe_model_update_expert_bias(moe_model *m, const double *selected);

#endif
