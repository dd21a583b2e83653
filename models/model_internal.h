/* model_internal.h — inside models/ only: the model's structures, shared by model.c (creation, the stage's forward
 * and backward) and the files it orchestrates, and the functions they give it (tensors.h has the table's). */
#ifndef MOE_MODELS_MODEL_INTERNAL_H
#define MOE_MODELS_MODEL_INTERNAL_H

#include "kernels/nonfinite.h"
#include "models/model.h"
#include "models/model_activations.h"
#include "models/shard_grads.h"
#include "models/tied_grads.h"
#include "models/zero_grads.h"
#include "moe/dense_ops.h"
#include "tp/linear.h"
#include "tp/sequence.h"
#include "tp/vocab_cross_entropy.h"

/* Activations of one layer for T = max_seqs * S tokens: models/model_activations.h's list. What cfg.moe.recompute
 * rebuilds in backward is one buffer that every layer's pointer shares (layer_buffer_shared). */
typedef struct {
#define LAYER_FIELD(name, count, rebuilt_from) moe_real *name;
    MOE_MODEL_LAYER_ACTIVATIONS(LAYER_FIELD)
#undef LAYER_FIELD
} layer_acts;

/* One forward's activations, kept from its forward to its backward: an entry of the stash. A pipeline schedule keeps
 * several forwards of a stage in flight (pipeline/schedule.h); one-stage training keeps one. */
typedef struct {
    int chunk;              /* the stage's chunk whose layers it holds (model.h)                                    */
    int num_seqs;
    int has_forward;
    moe_real **resid;       /* [L + 1] of [T, d]: the residual stream entering each layer (this stage's, first .. last) */
    layer_acts *acts;       /* [L] (this stage's layers)                                                             */
    moe_layer **moe;        /* [L]: this pass's MoE layers (routing, expert activations); NULL for dense layers       */
    moe_layer_stats *stats; /* [L]                                                                                    */
#define PASS_FIELD(name, type, count) type *name;
    MOE_MODEL_PASS_BUFFERS(PASS_FIELD)
#undef PASS_FIELD
} model_pass;

struct moe_model {
    moe_model_config cfg;
    moe_model_stage stage;     /* the chunks of decoder layers this model holds (model.h), and the ends */
    int first[MOE_MODEL_MAX_CHUNKS], last[MOE_MODEL_MAX_CHUNKS]; /* chunk c: layers [first[c], last[c])           */
    int embeds, heads;         /* chunk 0 starts with the embedding; the last chunk ends with the head           */
    moe_runtime *rt, *owned_rt;
    const moe_parallel *par;
    const moe_dense_ops *dense; /* the runtime's dense ops */
    moe_dense_state *ops_state;
    int max_seqs, head_dim, num_local_experts;
    moe_rope rope;             /* RoPE's frequencies and amplitude (moe_model_rope) */
    size_t num_dense, num_expert;
    moe_real *params, *grads; /* grads: NULL under ZeRO-2, which keeps a window, the ends and a shard (zero_grads) */
    moe_model_views p, g;
    moe_zero_layout zero;      /* the ZeRO ranges (cfg.zero) and the norm's atoms                              */
    moe_zero_grads zero_grads; /* cfg.zero 2: where backward's gradients go                                    */
    /* what the GEMMs read: p itself (fp32), or under bf16 precision the same views with the dense GEMM weights
     * (attention projections, dense FFNs, lm_head) pointing into `compute`, their bf16 copies made at the first
     * forward after the parameters changed (core/precision.h). Norms, the embedding lookup, the routers and the
     * experts stay p's (an MoE layer keeps its experts' copies itself, by c's layers' ffn.version). */
    moe_real *compute;
    moe_model_views c;
    /* params_version: bumped by every moe_model_params (whoever may write the parameters gets them there);
     * compute_version: the one `compute` and c's ffn.version were made for */
    unsigned long long params_version, compute_version;
    moe_model_tensor *tensors;
    int num_tensors;
    model_pass *passes;         /* [stage.chunks * stage.passes]: chunk c's are c * stage.passes + 0, 1, ... */
    model_pass *P;              /* the selected one: what the next forward writes and backward reads */
    moe_zero_slice chunk_dense[MOE_MODEL_MAX_CHUNKS], chunk_expert[MOE_MODEL_MAX_CHUNKS]; /* in each region */
    struct {                    /* the model's scratch (backward's gradients, forward's temporaries) */
#define MODEL_FIELD(name, type, count) type *name;
        MOE_MODEL_SCRATCH_BUFFERS(MODEL_FIELD)
#undef MODEL_FIELD
    };
    moe_nonfinite_finding *finding; /* while checking for NaN (moe_model_set_checks) */
    /* host memory of the runtime's (pinned on CUDA), [2 TG]: a forward's inputs and targets on their way to the
     * device, queued (head.c); free again once the forward ends, which it does with the stream drained */
    int *staged_tokens;
    /* tied embeddings on a stage holding an end: the lm_head's gradient, summed apart from the embedding's
     * (models/tied_grads.h); tied.grad NULL otherwise */
    moe_tied_grads tied;
    /* cfg.moe.num_shards > 0: the weight gradients and the loss are summed per shard of this rank (S / W of them)
     * in the shard tree (models/shard_grads.h); local_shards 0: one sum over the rank's rows */
    int local_shards;
    moe_shard_grads shard_grads;
    /* tensor parallelism (model.h): tp ranks in the group (1: none), this rank's place; the group's products in fixed
     * pieces; the pieces' weight gradients, formed over the group's T rows in their tp x local_shards shards (the
     * slice's own rows are shard_grads') */
    moe_tp_sequence seq; /* the group, tp and this rank's place in it: the slices' row moves (tp/sequence.h) */
    moe_tp_linear tpl;
    moe_shard_grads tp_grads;
    int pieces;                /* tp_shards > 1: a dense FFN runs as tensor-parallel products too (tp_dense_ffn_*) */
    moe_tp_cross_entropy vocab_ce; /* with pieces: the head's loss over the vocabulary's pieces (vocab_head_*) */
    moe_real *tp_dh1, *tp_dh3; /* its backward's [T, d_ff / tp] gradients (with dense layers) */
    /* grouped-query attention in pieces (model.h): k_proj and v_proj in kv_blocks blocks over the group; the rank's
     * kv_heads kv heads, which attention reads kv_copies times each; their products (&tpl, or kv_block_linear when
     * kv_blocks < tp: the rank's block, no sums); the tree that adds a head's copies' gradients */
    int kv_blocks, kv_heads, kv_copies;
    moe_tp_linear kv_block_linear, *kv_linear;
    moe_shard_tree kv_tree;
};

/* While checking (moe_model_set_checks): records the first NaN or Inf of an op's output once, naming the op. */
moe_status moe__model_watch(moe_model *m, const moe_real *data, size_t count, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* head.c. The selected pass's embedding of the group's T tokens into resid[0] (this rank's slice). */
moe_status moe__model_embed(moe_model *m, const int *tokens, int T);
/* The last chunk's head: the final norm, the logits (into logits_out when asked: the slice's rows [Ts, V], or with
 * pieces this rank's columns of every row of the group [T, V / tp]) and with targets the loss (into *loss_sum). */
moe_status moe__model_head_forward(moe_model *m, const int *targets, int T, double *loss_sum, moe_real *logits_out);
/* Its backward, from dL/dresid[0] of the slice (m->dresid): the embedding's gradient. */
moe_status moe__model_embed_backward(moe_model *m, int T);
/* Its backward from dL/dloss_t = loss_scale: lm_head's and the final norm's gradients, and the slice's dL/dresid
 * into m->dresid. */
moe_status moe__model_head_backward(moe_model *m, int T, moe_real loss_scale);

/* model_activations.c. Every pass's activations and the scratch, for T = max_seqs * S tokens, in the runtime's
 * memory; and their release (what was allocated of them). */
moe_status moe__model_alloc_activations(moe_model *m);
void moe__model_free_activations(moe_model *m);

/* attention.c. An RMSNorm's backward over T tokens of `width` values each, normalised in rows_per_token rows (1, or
 * a head's): dx overwritten, the weight gradient added into dw per shard (models/shard_grads.h). */
moe_status moe__model_norm_backward(moe_model *m, const moe_real *x, const moe_real *w, const moe_real *rstd,
                                   const moe_real *dy, int T, int width, int rows_per_token, moe_real *dx,
                                   moe_real *dw);
/* Grouped-query attention's kv heads in pieces (model.h): their counts, products and tree. */
moe_status moe__model_init_kv_heads(moe_model *m);
/* The attention kernel of layer l (fused or materialized, cfg.attention) on the pass's q, k, v of the rank's H heads
 * and KV kv heads of head_dim hd: forward into attn_y and att; backward from m->dattn into m->dq, m->dk, m->dv. */
moe_status moe__model_attention_kernel_forward(moe_model *m, int l, int num_seqs, int H, int KV, int hd);
moe_status moe__model_attention_kernel_backward(moe_model *m, int l, int H, int KV, int hd);
/* o_proj's backward (row-parallel): its output gradient, the slice's m->dresid, over the group's T rows (gathered
 * into m->dln at tp > 1); its weight gradient from x_local [T, K / tp] (the rank's heads of its K-wide input) and
 * their gradient into dx_local. */
moe_status moe__model_o_proj_backward(moe_model *m, int l, int T, const moe_real *x_local, int K, moe_real *dx_local);
/* Layer l's attention block up to its output attn_y, for num_seqs sequences (the tensor group's). */
moe_status moe__model_attention_forward(moe_model *m, int l, int num_seqs);
/* From attn_y (T rows) to the FFN's input on this rank's slice: resid_mid = resid[l] + o_proj(attn_y), ln2. */
moe_status moe__model_attention_residual_forward(moe_model *m, int l, int T);
/* The block's backward, from dL/dresid_mid to dL/dresid[l] (both in m->dresid, the slice's). */
moe_status moe__model_attention_backward(moe_model *m, int l, int T);

/* mla.c. Multi-head latent attention (moe_model_mla): forward from ln1 (the slice's rows) to attn_y and mla_y (the
 * rank's heads over the group's num_seqs sequences); backward from dL/dresid_mid (m->dresid, the slice's) to dL/dln1
 * in m->dln (the slice's rows of it), its weight gradients added. */
moe_status moe__model_mla_forward(moe_model *m, int l, int num_seqs);
moe_status moe__model_mla_backward(moe_model *m, int l, int T);

/* ffn.c. Layer l's FFN on the slice of the group's T rows: forward (ln2 to m->tmp), backward (m->dresid to m->dln),
 * and the intermediates --recompute did not keep. */
moe_status moe__model_ffn_forward(moe_model *m, int l, int T);
moe_status moe__model_ffn_backward(moe_model *m, int l, int T);
moe_status moe__model_ffn_recompute(moe_model *m, int l, int T);

#endif
