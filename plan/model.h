/* plan/model.h — moe-plan's model: a decoder MoE shape (Mixtral's, or Qwen3-MoE's with its extra features), its
 * exact parameter counts, its FLOPs per token and the memory one GPU needs for it under a layout. Pure
 * arithmetic, no allocation, no I/O; every formula and its source is written out in docs/SCALING.md.
 *
 * Counts are exact integers (int64): the unit test holds them to the published totals of Mixtral 8x7B and 8x22B
 * and Qwen3-30B-A3B and 235B-A22B. Memory follows what this project keeps (models/model.c, moe/layer.c), not an
 * idealised trainer, so that the planner answers "can moe-train run this". */
#ifndef MOE_PLAN_MODEL_H
#define MOE_PLAN_MODEL_H

#include <stdint.h>

#include "models/model.h"

typedef struct {
    int64_t vocab_size, num_layers, d_model, num_heads, num_kv_heads;
    int64_t head_dim;        /* per q/k head                                                               */
    int64_t q_lora_rank, kv_lora_rank, qk_rope_dim, v_head_dim; /* multi-head latent attention (DeepSeek's MLA) where
                                kv_lora_rank > 0: models/model.h; head_dim = qk_nope + qk_rope_dim                  */
    int64_t d_ff_expert;     /* hidden width of each routed expert                                         */
    int64_t d_ff_dense;      /* hidden width of the dense FFN of non-MoE layers                            */
    int64_t num_experts, top_k;
    int64_t moe_every;       /* layer l is MoE iff (l + 1) % moe_every == 0, l >= first_dense and E > 1 (model.h's
                                rule)                                                                  */
    int64_t first_dense;     /* the first this many layers dense (DeepSeek's first_k_dense_replace)          */
    int64_t d_ff_shared;     /* a shared expert's hidden width (Qwen2-MoE), 0: none                          */
    int shared_gate;         /* 1: the shared expert has a sigmoid gate [1, d] (Qwen2-MoE's)                 */
    int qkv_bias;            /* 1: q, k and v have biases (Qwen2-MoE's)                                     */
    int tie_embeddings;
    int qk_norm;             /* moe_qk_norm (models/model.h): over each head's q and k (Qwen3, head_dim weights
                                each per layer) or over the whole projections (OLMoE, H and KV x head_dim)   */
    int irregular_moe_layers;/* 1: the MoE layers follow no moe_every rule (HF mlp_only_layers) ...         */
    int64_t num_moe_layers_listed; /* ... and this many of them are MoE layers                            */
    int64_t sliding_window;  /* 0: full attention                                                          */
    char unsupported_key[256];   /* a config.json key moe-train refuses, with why; "": none */
    float capacity_factor;   /* <= 0: dropless                                                            */
} moe_plan_model;

/* moe-train's model (its flags map 1:1 onto moe_model_config) as a plan model. */
moe_plan_model moe_plan_model_from_config(const moe_model_config *cfg);

/* NULL when the shape is countable, else a sentence naming the first impossible field. */
const char *moe_plan_model_problem(const moe_plan_model *m);

/* What this project's trainer cannot do for m, one sentence each, written into notes[] (at most max_notes);
 * returns how many. None means moe-train can train the shape as it is. */
int moe_plan_model_unsupported(const moe_plan_model *m, const char **notes, int max_notes);

int64_t moe_plan_model_num_moe_layers(const moe_plan_model *m);
/* The MoE layers among layers [0, end) by the regular rule (moe_every, first_dense). */
int64_t moe_plan_model_moe_layers_below(const moe_plan_model *m, int64_t end);

/* Exact parameter counts. dense: replicated on every rank (embedding, attention, norms, routers, dense and
 * shared FFNs, lm_head); expert: every routed expert of every MoE layer; active: what one token uses
 * (dense + top_k experts per MoE layer); matmul_active: active minus what is not a matrix product per token (the
 * input embedding table when untied, the norm vectors) — the N of the 6N FLOP rule. */
typedef struct {
    int64_t total, active, dense, expert, matmul_active;
    int64_t embedding;    /* V * d, the input table (the lm_head too when tied) */
    int64_t dense_matrix; /* the dense region's matrices (what the bf16 GEMM copies hold); dense minus norms */
} moe_plan_params;
moe_plan_params moe_plan_model_params(const moe_plan_model *m);

struct moe_plan_stage;
/* What one GPU of a tensor-parallel group of tp holds of a stage's dense parameters (tp 1: the stage's dense and
 * dense_matrix): 1/tp of the split tensors — q and o by heads, k and v by kv heads where tp divides them (else whole:
 * each GPU keeps the kv heads its query heads use, as Megatron-LM replicates them for GQA), the dense and shared FFNs
 * by d_ff, the embedding and lm_head by vocabulary rows — and the rest whole (norms, routers, a shared expert's gate). */
typedef struct {
    double dense, dense_matrix;
} moe_plan_tp_share;
moe_plan_tp_share moe_plan_model_tp_share(const moe_plan_model *m, const struct moe_plan_stage *stage, int64_t tp);

/* The parameters of one pipeline stage's share (plan/pipeline.h: its layers, and the ends it holds): dense,
 * expert and dense_matrix as above, over that share (total = dense + expert; active, matmul_active and embedding
 * are the whole model's). The whole model's stage gives moe_plan_model_params's numbers. */
moe_plan_params moe_plan_model_stage_params(const moe_plan_model *m, const struct moe_plan_stage *stage);

/* Training FLOPs per token at sequence length S: 6 * matmul_active + 12 * L * (H * head_dim) * S (PaLM's
 * appendix B; Megatron-LM's formula without its recompute pass). The attention term counts the whole S x S score
 * matrix, as MFU's model FLOPs do (the materialized attention computes it whole; the fused one skips the tiles above
 * the diagonal). */
double moe_plan_model_flops_per_token(const moe_plan_model *m, int64_t seq_len);

/* The part of moe_plan_model_flops_per_token that the MoE layers do: 6 * L_m * (E d (the router) + k 3 d F (the
 * experts a token goes to) + the shared expert's matrices). The rest is the dense path (attention, its projections,
 * dense FFNs, lm_head), which moe-plan --dense-us-per-token replaces by a measured time. */
double moe_plan_model_moe_flops_per_token(const moe_plan_model *m);

typedef enum { MOE_PLAN_ATTENTION_MATERIALIZED = 0, MOE_PLAN_ATTENTION_FUSED = 1 } moe_plan_attention;

/* The FLOPs per token that activation recomputation (moe/moe.h's moe_recompute) adds to a step: hardware FLOPs,
 * which the step time counts, not model FLOPs, which MFU counts (Megatron-LM and PaLM leave recomputation out of
 * MFU). moe: the MoE layers' share (their experts' products run again; the router does not, its routing is reused),
 * dense: the rest (the attention block from attention up; its o_proj and the dense FFNs' under full). */
typedef struct {
    double dense, moe;
} moe_plan_recompute_flops;
moe_plan_recompute_flops moe_plan_model_recompute_flops_per_token(const moe_plan_model *m, int64_t seq_len,
                                                                  moe_recompute recompute);

/* The layout of one GPU's share of a run. */
typedef struct {
    int64_t world;            /* GPUs                                                                    */
    int64_t ep;               /* expert-parallel group size; divides world / pp and E                    */
    int64_t pp;               /* pipeline stages (moe-train --pp; 0 or 1: none), outermost in the rank grid: each
                               * stage is world / pp ranks holding its layers (plan/pipeline.h)                  */
    int64_t virtual_stages;   /* model chunks per stage (--virtual-stages; 0 or 1: 1F1B, above: interleaved)       */
    int64_t first_stage_layers, last_stage_layers; /* the pipeline's ends' layers (--first-stage-layers,
                               * --last-stage-layers; 0: an equal share; models/model.h's moe_pipeline_split)     */
    int64_t tp;               /* tensor-parallel size (moe-plan --tp; 0 or 1: none), innermost in the rank grid:
                               * Megatron-LM's tensor parallelism with sequence parallelism, as issue 28 builds it
                               * (moe-train --tp runs it on the CPU so far). A tp group shares its sequences: each
                               * GPU holds 1/tp of the split tensors (moe_plan_model_tp_share) and of every token-sized
                               * activation (the tokens between blocks, the heads and vocabulary columns inside them);
                               * its MoE layers take T/tp distinct tokens per GPU, the experts whole (E/ep per GPU,
                               * replicated over the stage's GPUs / ep). Per micro-batch and layer its GPUs all-gather
                               * the tokens before the attention block and a dense FFN and reduce-scatter after them,
                               * forward and backward (plan/cluster.h)                                               */
    int zero;                 /* 0: nothing sharded. 1: ZeRO-1 as this project does it: the AdamW moments of the dense
                               * parameters sharded over the world, of a GPU's experts over its expert-data-parallel
                               * group (dp = world / ep). 2: ZeRO-2: the moments as under 1, and the gradients never
                               * held whole: each layer's backward writes one window (moe_plan_gradient_buffers) that is
                               * reduce-scattered into a shard of the same ranges as the moments, per micro-batch; needs
                               * the world-invariant sums (moe_plan_layout_local_shards > 0, moe_plan_run_problem) */
    int64_t micro_batch;      /* sequences per GPU per micro-batch                                       */
    int64_t seq_len;
    int bf16;                 /* 1: bf16 GEMM inputs, fp32 masters (core/precision.h)                     */
    int cpu;                  /* the code path whose buffers are counted: 0, the CUDA path (moe-plan: bf16 exchanged
                               * rows and expert activations, moe/layer_ops_cuda.c); 1, the CPU path (moe-train's
                               * memory check: rows and expert activations in fp32 whatever the precision)        */
    moe_plan_attention attention;
    moe_recompute recompute;  /* what backward rebuilds instead of keeping (moe/moe.h): memory and hardware FLOPs */
    int64_t accum_steps;      /* micro-batches per step (0: one); with world-invariant sums and zero < 2, more than
                               * one keeps the step's gradient sum apart (moe-train's grad_accum: one more gradient) */
    int64_t local_shards;     /* the world-invariant sums' batch shards per GPU (moe-train --world-invariant): 0, off
                               * (the transport's all-reduce); -1, moe-train's default (moe_plan_default_local_shards) */
    double workspace_bytes;   /* libraries, CUDA context, allocator slack                               */
    double routing_skew;      /* the busiest EP rank's expert rows over the mean (plan/routing.h); 0 or 1:
                               * balanced. Its experts' rows, their memory and time, and the all-to-all wait for it */
} moe_plan_layout;

/* Bytes per GPU, by what holds them; with a pipeline, of the stage that needs the most (plan/pipeline.h): its
 * layers' and ends' weights, gradients and state, sharded over the stage's ranks (world / pp), and each layer's kept
 * activations times the micro-batches its schedule keeps at once. */
typedef struct {
    double weights;      /* bf16 copies of the GEMM weights (0 under fp32: the masters are the weights; fp32-sized
                          * on the CPU path)                                                             */
    double masters;      /* fp32 parameters: dense + this GPU's experts                                  */
    double gradients;    /* fp32: mirroring the masters; under ZeRO-2 the shard (dense / world + the experts' / dp,
                          * the moments' ranges), the window and the ends (moe_plan_gradient_buffers)       */
    double optimizer;    /* AdamW m and v, fp32; under ZeRO-1 and 2 the dense part / world, the experts' / dp */
    double activations;  /* what forward keeps for backward and the backward scratch, all layers         */
    double exchange;     /* the MoE layers' buffers of moe/layer_buffers.h (the input copy, the all-to-all
                          * send/receive and expert rows): what each layer keeps, and the scratch of one
                          * pass, which every layer shares                                                */
    double reduce_scratch; /* the gradient sums': with world-invariant sums, the fixed tree all-reduce's (half of a
                            * piece of the region it sums; under ZeRO-2 its reduce-scatter's one transfer chunk: half
                            * the largest slice it reduces, at most half a piece), the shard tree's slots for the
                            * largest dense gradient (models/shard_grads.c) and the experts' per-segment weight-gradient
                            * leaves;
                            * without, on the CPU path the transport's (MPI) copy of the larger region    */
    double workspace;
    double total;
    int64_t stage;       /* the pipeline stage these bytes are of: the one needing the most (0 without a pipeline) */
} moe_plan_memory;
moe_plan_memory moe_plan_model_memory(const moe_plan_model *m, const moe_plan_layout *lay);

/* moe-train's default shards per GPU reading distinct sequences (train/options.c, finish_shards): S, the largest
 * power-of-two divisor up to 64 of the batch (data_ranks x micro_batch sequences), over data_ranks; 0 (off) unless
 * the stage's ranks, its tensor-parallel ones included, are a power of two dividing S (a probe, 2026-12-07: with tp
 * the planner counted the data ranks only, and planned ZeRO-2 layouts moe-train refuses). */
int64_t moe_plan_default_local_shards(int64_t data_ranks, int64_t stage_ranks, int64_t micro_batch);

/* The layout's world-invariant shards per GPU: its local_shards, or moe_plan_default_local_shards for -1. 0: the sums
 * are the transport's all-reduce, and ZeRO-2 (whose reduce-scatter is the fixed tree's) is not possible. */
int64_t moe_plan_layout_local_shards(const moe_plan_layout *lay);

/* ZeRO-2's resident gradient buffers, in fp32 values. window: the largest decoder layer's weight gradients — its
 * attention q, k, v, o, its norms (q/k norms too), the router (and a shared expert) or the dense FFN's three matrices,
 * and this GPU's E/ep experts of that layer (3 d F each) — which each layer's backward writes and reduce-scatters;
 * ends: the embedding, the final norm and the lm_head when untied, held through the whole backward (of the whole model;
 * moe_plan_model_memory counts a pipeline stage's own ends). Under tensor parallelism (tp > 1), a GPU's share of them
 * (moe_plan_model_tp_share's split). */
typedef struct {
    int64_t window, ends;
} moe_plan_gradient_buffers;
moe_plan_gradient_buffers moe_plan_model_gradient_buffers(const moe_plan_model *m, int64_t ep, int64_t tp);

/* The layout's routing skew as the time and memory take it: 1 at ep 1 or below 1, and at most ep (the busiest of ep
 * ranks holds at most every row: s = max / (rows / ep); --search may pair a given skew with a smaller ep). */
double moe_plan_layout_skew(const moe_plan_layout *lay);
/* Rows the busiest GPU's experts keep per micro-batch: T k s under routing skew s (1 at ep 1: one EP rank holds every
 * expert), at most cf T k with a capacity factor (each of E/ep local experts keeps at most ceil(cf ep T k / E)). */
double moe_plan_model_busiest_rows(const moe_plan_model *m, const moe_plan_layout *lay);

#endif
