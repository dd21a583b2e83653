/* moe.h — the public API of libmoe: one sparse mixture-of-experts (MoE) layer, forward and backward,
 * on one rank of an expert-parallel job (or on its own).
 *
 *   x [T, d] -> router (logits = x Wr^T, scores, top-k, capacity) -> permute rows by expert
 *            -> all-to-all to the ranks that own the experts -> SwiGLU experts (grouped GEMM)
 *            -> all-to-all back -> combine: out[t] = sum_j gate[t,j] * y[slot(t,j)]
 *
 * Under expert parallelism (alltoall/parallel.h) each rank passes its own tokens; capacity, the aux
 * losses and their gradients are those of the global batch (all ranks' tokens), and the results are
 * those of a single-rank run on that batch (tests/test_ep_layer.c states which are bitwise).
 *
 * The layer owns its activations and workspace; the caller owns the weights and gradients (views into
 * one contiguous buffer, see moe_layer_weights_view) so that a model can all-reduce them as one region.
 * Every function returns a moe_status (core/types.h) and records what went wrong (core/fail.h); none
 * prints or exits.
 */
#ifndef MOE_MOE_H
#define MOE_MOE_H

#include "alltoall/parallel.h"
#include "core/rng.h"
#include "core/fail.h"      /* moe_failure_message: what a failed call's status means, in its words */
#include "core/precision.h"
#include "core/types.h"
#include "moe/runtime.h"
#include "router/group.h"

/* Activation recomputation (Megatron's selective and full recompute): what forward does not keep, rebuilt in
 * backward from what it did keep, bitwise what forward computed (the same ops on the same inputs; an MoE layer
 * reuses the forward's routing, capacity decisions and exchange plan, so nothing is decided twice).
 *   NONE: everything is kept.  ATTENTION: a model's attention block (norm, q, k, v, attention output) is rebuilt
 *   from the layer's input.  MOE: the experts' (and dense FFNs') SwiGLU intermediates are rebuilt from their input
 *   rows.  FULL: only each layer's input is kept; the whole layer runs again (the MoE layer's dispatch and combine
 *   exchanges included) before its backward. The order matters: each level recomputes what the ones before do. */
typedef enum {
    MOE_RECOMPUTE_NONE = 0,
    MOE_RECOMPUTE_ATTENTION = 1,
    MOE_RECOMPUTE_MOE = 2,
    MOE_RECOMPUTE_FULL = 3
} moe_recompute;

typedef struct {
    int d_model;          /* d: width of the token rows                                       */
    int d_ff;             /* hidden width of each SwiGLU expert                               */
    int num_experts;      /* E (global)                                                       */
    int top_k;            /* k experts per token, 1 <= k <= E; k = 1 is Switch routing         */
    int layer_index;      /* which layer this is, for error messages                          */
    moe_score_func score_func;
    int renormalize;      /* 1: gate weights of the k chosen experts are divided by their sum */
    float routed_scaling; /* the gates times this after any renormalisation (DeepSeek's routed_scaling_factor);
                           * 0 reads as 1 (moe_config_gate_scale)                                               */
    int num_groups;       /* group-limited routing (DeepSeek-V3's n_group): the E experts in this many groups of
                           * E / num_groups (router/group.h); 0 or 1: none                                       */
    int topk_groups;      /* the groups a token chooses its k experts from (topk_group): the best by group_score */
    int group_score;      /* a group's score: MOE_GROUP_SCORE_TOP2, the sum of its two best selection scores
                           * (DeepSeek-V3's), or MOE_GROUP_SCORE_MAX, its best (DeepSeek-V2's group_limited_greedy) */
    float capacity_factor; /* cf: C = ceil(cf * T * k / E) slots per expert; cf <= 0: dropless */
    moe_drop_priority drop_priority;
    float aux_loss_coef;  /* Switch/GShard load-balancing loss  E * sum_e f_e * P_e            */
    float z_loss_coef;    /* router z-loss  mean_t logsumexp(logits_t)^2                       */
    float bias_update_rate; /* sigmoid only: gamma of DeepSeek-V3's aux-loss-free bias update  */
    int layout_invariant; /* 1 (default): row-wise GEMMs in fixed 64-row calls, so every result is
                           * bitwise the same for any ep and world size (costs ~15% on the CPU);
                           * 0: one call per expert, faster, the last bits may depend on the layout */
    moe_precision precision; /* fp32 (default), or bf16 inputs to the expert GEMMs (core/precision.h) */
    moe_recompute recompute; /* what backward recomputes instead of keeping from forward (none by default) */
    int num_shards;       /* 0 (default): sums over the batch per rank, then the transport's all-reduce (bitwise on
                           * one layout only). S > 0, a power of two that the world size divides: the global batch
                           * is S virtual shards (world rank r holds [r S/W, (r+1) S/W)), every sum over the batch is
                           * formed per shard and added in one fixed binary tree over the S shards, so results are
                           * bitwise the same for every power-of-two world size and ep (docs/DETERMINISM.md). */
} moe_config;

/* A config with the usual defaults: softmax, renormalised when k > 1 (Mixtral; with k = 1 the gate is the
 * probability, as in Switch), dropless, aux 0.01, z-loss 0.001. */
moe_config moe_config_default(int d_model, int d_ff, int num_experts, int top_k);
moe_status moe_config_validate(const moe_config *cfg);
/* cfg->routed_scaling, with 0 read as 1. */
float moe_config_gate_scale(const moe_config *cfg);
/* Whether the router limits each token to topk_groups of num_groups groups. */
int moe_config_grouped(const moe_config *cfg);
/* NULL for a valid config, else a sentence naming the first field that is wrong (for error messages). */
const char *moe_config_problem(const moe_config *cfg);

/* The expert-parallel size is the layout's (moe_parallel_ranks(par).ep_size, alltoall/parallel.h), never the
 * config's: what depends on it takes it. NULL when ep ranks can shard the experts (ep >= 1 divides E), else why not. */
const char *moe_config_ep_problem(const moe_config *cfg, int ep);
/* E_local = E / ep: the experts each rank of an expert-parallel group of ep holds (0 for ep < 1). */
int moe_config_num_local_experts(const moe_config *cfg, int ep);

/* The layer's parameters are a moe_layer_weights (core/types.h): the router and this rank's experts.
 * Number of reals in this rank's parameter buffer at expert-parallel size ep: E*d (router) + 3*E_local*d_ff*d
 * (experts); 0 for a configuration or ep no layer takes. */
size_t moe_layer_num_params(const moe_config *cfg, int ep);
/* Carves the views out of one buffer of moe_layer_num_params() reals: [router | w1 | w3 | w2], i.e.
 * [dense | local experts], so each gradient all-reduce is one call over one region. */
moe_layer_weights moe_layer_weights_view(const moe_config *cfg, int ep, moe_real *buffer);
/* Fills a layer's weights (this rank's view at ep) uniformly with bound sqrt(3 / fan_in): unit-variance rows
 * stay unit scale. */
void moe_layer_weights_init(const moe_config *cfg, int ep, moe_layer_weights *w, moe_rng *rng);

/* What the last forward did, for logs and tests. */
typedef struct {
    double aux_loss;        /* unweighted load-balancing loss of the global batch (1.0 if balanced) */
    double z_loss;          /* unweighted router z-loss of the global batch                        */
    double weighted_loss;   /* aux_loss_coef * aux_loss + z_loss_coef * z_loss (what backward adds) */
    int num_tokens_global;  /* T summed over the world                                           */
    int num_assignments;    /* T * k of this rank                                                */
    int num_dropped;        /* this rank's assignments over capacity; they contribute zero      */
    int capacity;           /* C = ceil(cf * T_global * k / E), or 0 when dropless               */
    int num_rows_received;  /* rows this rank's experts processed (from its EP group)            */
    const int *num_tokens_per_expert; /* [E] this rank's kept assignments per expert              */
    const int *num_selected_per_expert; /* [E] global top-k assignments per expert, before capacity */
} moe_layer_stats;

typedef struct moe_layer moe_layer;

/* rt: where the layer runs (moe/runtime.h), or NULL for the CPU; par: who it exchanges tokens with, or NULL for a
 * world of one; its ep_size shards the experts (MOE_ERR_INVALID_CONFIG where moe_config_ep_problem says it cannot).
 * Both must outlive the layer. On a CUDA runtime every tensor the layer takes is device memory, and par's transports
 * must be GPU ones (alltoall/parallel_gpu.h). */
moe_status moe_layer_create(const moe_config *cfg, moe_runtime *rt, const moe_parallel *par, moe_layer **out_layer);
void moe_layer_destroy(moe_layer *layer);

/* out[T, d] = MoE(x[T, d]) for this rank's T tokens. Keeps what backward needs (a copy of x, routing,
 * expert activations). stats may be NULL. Collective: every rank of the layout calls it. A transport error
 * (MOE_ERR_COMM, MOE_ERR_COUNT_MISMATCH, MOE_ERR_TIMEOUT) leaves the job unusable: print the failure message
 * and abort it (MPI_Abort).
 * Host syncs on CUDA: two (the routing choices to the host for the capacity rule; the router losses and the
 * layout's counts, or one with them deferred: moe_layer_defer_finish), plus whatever the layout's transport waits
 * for (comm_gpu.h), plus buffer growth on the first calls. Control traffic per rank: O(E + T*k) ints
 * (router/capacity.h), never the whole global routing. */
moe_status moe_layer_forward(moe_layer *layer, const moe_layer_weights *weights, const moe_real *x,
                             int num_tokens, moe_real *out, moe_layer_stats *stats);

/* A forward without a wait of its own for what it hands to the host last (the router losses' shares and the device
 * layout's counts): after moe_layer_defer_finish(layer, 1) a forward queues them (stats' aux_loss, z_loss and
 * weighted_loss are not set) and the caller finishes it after the runtime's next synchronisation
 * (moe_runtime_synchronize, or a wait it makes anyway), before the layer's next forward: moe_layer_finish_forward
 * checks the layout's counts against the capacity rule's, sums this rank's loss shares and all-reduces them over the
 * stage (collective: every rank of the stage calls it, in the same order as its other collectives), into the layer
 * and stats (may be NULL). Without a forward pending it does nothing. A model waits once for all of a forward's
 * layers (models/model.c). */
void moe_layer_defer_finish(moe_layer *layer, int defer);
moe_status moe_layer_finish_forward(moe_layer *layer, moe_layer_stats *stats);
/* dropless 1: the forwards route with no capacity limit whatever cfg.capacity_factor says, until set back to 0 — for
 * inference (a sample, logits to compare with another implementation): a capacity over the stage's tokens makes a
 * sequence's output depend on the others forwarded beside it (every data-parallel rank's copy of the one sampled
 * sequence, a probe: the text changed with the world size). */
void moe_layer_set_dropless(moe_layer *layer, int dropless);

/* Given dL/dout of the last forward, writes dL/dx and ACCUMULATES (+=) into the weight gradients this
 * rank's tokens and experts contribute. The gradient includes the weighted aux and z losses reported by
 * the forward. dx may be NULL. Collective. Host syncs on CUDA: none of its own (dx and the gradients are queued on
 * the runtime's stream, which the transports order themselves after and a download waits for), plus the
 * transport's. */
moe_status moe_layer_backward(moe_layer *layer, const moe_layer_weights *weights, const moe_real *dout,
                              moe_real *dx, moe_layer_weights *grads);

/* Under cfg.recompute FULL, before moe_layer_backward: rebuilds what the last forward kept (its input copy, the
 * dispatched rows, the expert activations and outputs) from the same input x, bitwise, reusing the forward's routing,
 * capacity decisions and exchange plan (the dispatch and combine exchanges run again; nothing is routed or counted
 * again). Allowed, and a repeat of the same work, under any other setting. Collective over the EP group. */
moe_status moe_layer_recompute(moe_layer *layer, const moe_layer_weights *weights, const moe_real *x);

/* Sums the gradients over the ranks that share them: the router over the world, the experts over the
 * expert-data-parallel group. grads must be a moe_layer_weights_view. Collective. */
moe_status moe_layer_reduce_gradients(moe_layer *layer, moe_layer_weights *grads);

/* Routing replay: the next forward takes the k experts of each of its tokens from experts[T * k] (this
 * rank's tokens, best first) instead of the router's top-k; gates, capacity and aux losses are computed
 * from this router's scores as usual. The array must stay valid until that forward, which checks it
 * (MOE_ERR_INVALID_ARG for an id outside [0, E) or a repeated id). NULL cancels. */
moe_status moe_layer_force_routing(moe_layer *layer, const int *experts);
/* The top-k choices of every token of the global batch in the last forward, in world-rank order, into
 * experts[T_global * k] on every rank (a routing trace records these). Collective over the world: an
 * all-gather of the choices, only for this purpose. */
moe_status moe_layer_gather_routing(moe_layer *layer, int *experts, int *num_tokens_global);

/* NaN provenance. With a finding (not NULL), forward and backward look at what each step produced (each
 * expert's output rows, the combined output, each expert's input-gradient rows and weight gradients, the
 * router's gradient); the first NaN or Inf sets found = 1 and writes into `where` the layer, the expert and
 * what it was, once; the layer goes on computing, so every rank stays in step. Every rank looks at the same
 * things in the same order, so `order` (the looks before the finding) tells which of several ranks' findings
 * came first. Slow (each look waits for the device): for finding where a bad value came from, not for
 * training. NULL turns it off. A non-finite router logit is always an error of the forward, on every rank at
 * once (the capacity scan tells them all). */
typedef struct {
    int found;
    long looks, order; /* looks so far; when found, the looks before it */
    char where[512];
} moe_nonfinite_finding;
moe_status moe_layer_set_checks(moe_layer *layer, moe_nonfinite_finding *finding);

/* Sigmoid routing's selection bias b[E] (used for top-k selection only, never for gate values). */
moe_real *moe_layer_expert_bias(moe_layer *layer);
/* From now on `layer` selects with owner's bias (its own is dropped): the layers that hold the same MoE layer's
 * forwards in flight (a pipeline's stash, models/model.h) route with one bias. owner must outlive layer. */
moe_status moe_layer_share_expert_bias(moe_layer *layer, moe_layer *owner);
/* DeepSeek-V3's aux-loss-free balancing, after a step: b_e += rate * sign(mean_e' n_e' - n_e), with n
 * the global top-k counts (overloaded experts become less attractive); every rank makes the same update.
 * From the last forward's counts, or (_counts) from num_selected[E] given: a step of several forwards (micro-batches)
 * moves the bias by the sum of theirs, as one forward of all its tokens would. */
moe_status moe_layer_update_expert_bias(moe_layer *layer);
moe_status moe_layer_update_expert_bias_counts(moe_layer *layer, const double *num_selected);

#endif
