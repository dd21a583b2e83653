/* model.h — the MoE decoder language model (Mixtral's architecture), CPU, on one rank of any layout.
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
#include "moe/moe.h"

typedef struct {
    int vocab_size;     /* V                                                                  */
    int num_layers;     /* L                                                                  */
    int d_model;        /* d                                                                  */
    int num_heads;      /* H; head_dim = d / H, even (RoPE)                                   */
    int num_kv_heads;   /* KV, divides H (KV < H: grouped-query attention)                     */
    int d_ff;           /* hidden width of each expert, and of the dense FFNs                 */
    int seq_len;        /* S, tokens per sequence                                             */
    int moe_every;      /* layer l's FFN is MoE iff (l + 1) % moe_every == 0 (and E > 1)        */
    int tie_embeddings; /* 1: lm_head is the embedding matrix                                 */
    float rope_theta;
    float norm_eps;
    moe_config moe;     /* experts, top-k, routing, capacity, aux/z coefficients, ep_size      */
} moe_model_config;

/* Mixtral-like defaults for a small model: V=256, L=4, d=128, H=4, KV=4, d_ff=256, S=128, E=8, k=2. */
moe_model_config moe_model_config_default(void);
/* NULL when valid, else a sentence naming the first wrong field. */
const char *moe_model_config_problem(const moe_model_config *cfg);
int moe_model_layer_is_moe(const moe_model_config *cfg, int layer);

/* Views of one layer's parameters (or gradients) in the rank's buffer. */
typedef struct {
    moe_real *attn_norm;      /* [d]               input_layernorm                      */
    moe_real *wq, *wk, *wv;   /* [H*hd, d], [KV*hd, d], [KV*hd, d]                      */
    moe_real *wo;             /* [d, H*hd]                                              */
    moe_real *ffn_norm;       /* [d]               post_attention_layernorm             */
    moe_layer_weights ffn;    /* MoE: router + local experts; dense: w1, w3, w2 of one "expert",
                                 router_w NULL                                          */
} moe_model_layer_params;

typedef struct {
    moe_real *embedding;      /* [V, d]                                                 */
    moe_model_layer_params *layers;
    moe_real *final_norm;     /* [d]                                                    */
    moe_real *lm_head;        /* [V, d]; the embedding when tied                        */
} moe_model_views;

/* A span of the parameter buffer with its weight-decay rule (norms are not decayed). */
typedef struct {
    size_t offset, count;
    int decay;
    const char *name;         /* "embedding", "layers.3.wq", ... for messages */
} moe_model_param_span;

typedef struct moe_model moe_model;

/* max_seqs: the most sequences one forward will see on this rank. accum_steps: micro-batches per step
 * (the aux and z-loss coefficients are divided by it, as the cross-entropy is). */
moe_status moe_model_create(const moe_model_config *cfg, const moe_parallel *par, int max_seqs, int accum_steps,
                            moe_model **out);
void moe_model_destroy(moe_model *m);

moe_real *moe_model_params(moe_model *m);
moe_real *moe_model_grads(moe_model *m);
size_t moe_model_num_dense(const moe_model *m);   /* reals in the dense region  */
size_t moe_model_num_expert(const moe_model *m);  /* reals in the expert region */
int moe_model_num_local_experts(const moe_model *m); /* E / ep */
const moe_model_param_span *moe_model_spans(const moe_model *m, int *count);
const moe_model_views *moe_model_param_views(const moe_model *m);
const moe_model_views *moe_model_grad_views(const moe_model *m);

/* Initialises the weights from seed: every tensor (and every global expert) from its own stream, so
 * the same seed gives the same global model for any world size and ep. */
void moe_model_init_weights(moe_model *m, unsigned long long seed);

/* Forward over num_seqs sequences of seq_len tokens (inputs [num_seqs*S]); with targets, returns the
 * sum of this rank's token losses in *loss_sum and keeps what backward needs; logits_out (optional)
 * receives [num_seqs*S, V]. Collective over the layout (MoE layers exchange tokens). */
moe_status moe_model_forward(moe_model *m, const int *inputs, const int *targets, int num_seqs, double *loss_sum,
                             moe_real *logits_out);

/* Backward of the last forward with dL/dloss_t = loss_scale for every token: ACCUMULATES into the
 * gradient buffer (call moe_model_zero_grads first on a new step). Collective. */
moe_status moe_model_backward(moe_model *m, moe_real loss_scale);
void moe_model_zero_grads(moe_model *m);

/* Sums the gradients over the ranks that share them (dense: world; experts: expert-data-parallel). */
moe_status moe_model_reduce_grads(moe_model *m);

/* Routing statistics of the last forward, per MoE layer (layer index l, or NULL for a dense layer). */
const moe_layer_stats *moe_model_layer_stats(const moe_model *m, int layer);
/* The MoE layer of layer l, or NULL for a dense layer. */
moe_layer *moe_model_moe_layer(moe_model *m, int layer);
/* The selection bias [E] of MoE layer l (state of sigmoid routing, saved in checkpoints), or NULL. */
moe_real *moe_model_expert_bias(moe_model *m, int layer);
/* Sigmoid routing: applies every MoE layer's bias update after a step. */
moe_status moe_model_update_expert_bias(moe_model *m);

#endif
