/* model_activations.h — the one list of the decoder model's activation buffers: models/model_activations.c allocates and names
 * them from it (and sums them for moe-train's memory check), plan/model.c (moe-plan) counts them from it.
 *
 * Each entry: X(field, elements, rebuilt_from). Elements are an expression in
 *   T    tokens of a forward on this rank: max_seqs * S, or under tensor parallelism (models/model.h) this rank's slice
 *        of its tensor group's, TG / tp; a rank's heads [TG, A / tp] are then T * A values
 *   TG   the tensor group's tokens (max_seqs * S): what a buffer holds gathered over the group (T at tp 1)
 *   d    d_model;  A = H * head_dim;  B = KV * head_dim
 *   BK   the k and v attention reads: B x the kv chunks (models/model.h, grouped-query attention; B but with pieces)
 *   KVG  with fewer kv heads than tp, TG * B (a gradient of k or v summed over the group); else 0
 *   ATT  what attention keeps per layer: the probabilities [seqs, H, S, S] (materialized) or the row statistics
 *        [seqs, H, S] (fused), of this rank's H / tp heads
 *   FD   a dense FFN layer's T * its width ([TG, width / tp]; the width d_ff or dense_d_ff; 0 on an MoE layer, whose
 *        FFN buffers are the MoE layer's)
 *   QK   1 with q/k norms (models/model.h's families), else 0;  QR, KR  the rows per token of T of the q and k
 *        norms (H and max(KV, tp) for each head's: with fewer kv heads than tp a rank norms its kv head over the TG =
 *        tp T rows; 1 for the whole projection's; 0 without);  KN  the k norm's width (head_dim for each head's, B for
 *        the projection's);  QT  1 with q/k norms at tp > 1, else 0;  QH  1 for each head's norms (Qwen3's), else 0;
 *        QB  1 with q/k/v biases
 *   QL, KL, ML, HV  multi-head latent attention's (models/mla.c): q_lora_rank, kv_lora_rank, 1 with it (else all
 *        0), H v_head_dim (T * HV: the rank's heads over the group's rows, as A);  HNV, LAT, DR  H (qk_nope +
 *        v_head_dim), max(kv_lora_rank + qk_rope_dim, q_lora_rank), qk_rope_dim
 *   SH   1 on an MoE layer with a shared expert (shared_d_ff), else 0 (in the model's buffers: 1 when any layer has
 *        one);  SF  T * shared_d_ff there;  SG  1 where that shared expert is gated (Qwen2-MoE)
 *   V    the vocabulary
 * rebuilt_from: the --recompute level (moe/moe.h's moe_recompute) from which backward rebuilds the buffer, so that one
 * buffer serves every layer instead of one per layer; MOE_MODEL_KEPT: always one per layer (the residual stream
 * entering a layer is what recomputation starts from).
 *
 * Every value is a moe_real unless typed; the model's own buffers are MOE_MODEL_BUFFERS. The MoE layers' buffers
 * are moe/layer.c's (counted in plan_model.c from the same rules). */
#ifndef MOE_MODELS_MODEL_ACTIVATIONS_H
#define MOE_MODELS_MODEL_ACTIVATIONS_H

#include "moe/moe.h"

#define MOE_MODEL_KEPT (MOE_RECOMPUTE_FULL + 1)

/* One decoder layer's (model_internal.h's layer_acts), in the order forward writes them. */
#define MOE_MODEL_LAYER_ACTIVATIONS(X)                                                                             \
    X(ln1, T * d, MOE_RECOMPUTE_ATTENTION)        /* rmsnorm(resid[l]) (gathered into tmp where read)     */      \
    X(rstd1, T, MOE_RECOMPUTE_ATTENTION)          /* its 1 / rms per token                                */      \
    X(q_raw, QK * T * A, MOE_RECOMPUTE_ATTENTION)  /* q and k before their norms (with q/k norms; the whole */     \
    X(k_raw, T * KR * KN, MOE_RECOMPUTE_ATTENTION) /* projection's at tp > 1: the slice's rows, every head) */     \
    X(rstd_q, T * QR, MOE_RECOMPUTE_ATTENTION)    /* the norms' 1 / rms per row                           */      \
    X(rstd_k, T * KR, MOE_RECOMPUTE_ATTENTION)                                                                   \
    X(mla_qa, T * QL, MOE_RECOMPUTE_ATTENTION)    /* MLA: q_a's output, its 1 / rms, its norm's output    */      \
    X(mla_rstd_qa, T * (QL > 0), MOE_RECOMPUTE_ATTENTION) /* (the slice's rows, gathered where read)      */      \
    X(mla_qan, T * QL, MOE_RECOMPUTE_ATTENTION)                                                                 \
    X(mla_c, T * KL, MOE_RECOMPUTE_ATTENTION)     /* the kv latent, its 1 / rms, its norm's output        */      \
    X(mla_rstd_c, T * ML, MOE_RECOMPUTE_ATTENTION) /* (likewise)                                          */      \
    X(mla_cn, T * KL, MOE_RECOMPUTE_ATTENTION)                                                                  \
    X(mla_y, T * HV, MOE_RECOMPUTE_ATTENTION)     /* attention's output of v_head_dim per head, o_proj's in */    \
    X(q, T * A, MOE_RECOMPUTE_ATTENTION)          /* after RoPE                                           */      \
    X(k, T * BK, MOE_RECOMPUTE_ATTENTION)         /* after RoPE; a copy per kv chunk                      */      \
    X(v, T * BK, MOE_RECOMPUTE_ATTENTION)                                                                        \
    X(att, ATT, MOE_RECOMPUTE_ATTENTION)          /* probabilities, or each row's log-sum-exp (fused)     */      \
    X(attn_y, T * A, MOE_RECOMPUTE_ATTENTION)     /* attention output, o_proj's input                     */      \
    X(resid_mid, T * d, MOE_RECOMPUTE_FULL)       /* resid[l] + o_proj(attn_y)                            */      \
    X(ln2, (FD ? TG : T) * d, MOE_RECOMPUTE_FULL) /* rmsnorm(resid_mid), the FFN's input (a dense one's:  */      \
                                                  /* gathered)                                            */      \
    X(rstd2, T, MOE_RECOMPUTE_FULL)                                                                              \
    X(h1, FD, MOE_RECOMPUTE_MOE)                  /* a dense FFN's gate and up projections, silu(h1) * h3 */      \
    X(h3, FD, MOE_RECOMPUTE_MOE)                                                                                 \
    X(act, FD, MOE_RECOMPUTE_MOE)                                                                                \
    X(sh1, SF, MOE_RECOMPUTE_MOE)                 /* the shared expert's h1, h3, act, its output and its  */      \
    X(sh3, SF, MOE_RECOMPUTE_MOE)                 /* gate's logit (on the slice's rows)                   */      \
    X(sact, SF, MOE_RECOMPUTE_MOE)                                                                               \
    X(sout, SH * T * d, MOE_RECOMPUTE_MOE)                                                                       \
    X(sgate, SG * T, MOE_RECOMPUTE_MOE)

/* The model's own: X(field, element type, elements). One per forward kept (a stash entry, model.h's passes), the
 * ends' only on the stage that holds them: */
#define MOE_MODEL_PASS_BUFFERS(X)                                                                                  \
    X(inputs, int, TG)             /* the first stage's tokens (the tensor group's) */                             \
    X(targets, int, TG)            /* the last stage's: its final norm, logits and loss */                          \
    X(lnf, moe_real, TG * d)       /* the final norm's output (gathered at tp > 1) and 1 / rms */                   \
    X(rstdf, moe_real, T)                                                                                          \
    X(logits, moe_real, T * V)     /* in backward, their gradient, in place */
/* One per model: */
#define MOE_MODEL_SCRATCH_BUFFERS(X)                                                                               \
    X(dresid, moe_real, T * d)     /* backward scratch */                                                          \
    X(dln, moe_real, TG * d)       /* gathers and sums over the tensor group's rows land here and in tmp */        \
    X(tmp, moe_real, TG * d)       /* forward: o_proj's and the FFN's outputs */                                   \
    X(dq, moe_real, T * A)                                                                                         \
    X(dk, moe_real, T * BK)        /* forward: k and v before their copies are made */                            \
    X(dv, moe_real, T * BK)                                                                                        \
    X(kv_group, moe_real, KVG)                                                                                     \
    X(dattn, moe_real, T * A)                                                                                      \
    X(ones, moe_real, QB * TG)     /* 1.0s: a bias's gradient is a weight gradient against a column of them */     \
    X(dshared, moe_real, SH * T * d) /* the shared expert's backward: its output's and input's gradients */       \
    X(dshared_x, moe_real, SH * T * d)                                                                             \
    X(dgate, moe_real, SG * T)                                                                                     \
    X(mla_dkvb, moe_real, T * HNV) /* MLA: kv_b's output, then its gradient (the rank's heads)            */     \
    X(mla_lat, moe_real, TG * LAT) /* MLA: the latents, gathered; their gradients (over the group's rows)   */     \
    X(mla_lat2, moe_real, TG * LAT)                                                                                \
    X(mla_kpe, moe_real, TG * DR)  /* MLA: the shared RoPE key, then its gradient (the group's rows)        */     \
    X(qk_slice, moe_real, QT * (2 + QH) * T * A) /* q/k norms at tp > 1 (models/attention.c): the slice's rows of */ \
    X(qk_recv, moe_real, QT * T * A)      /* every head (x (QH), dy, dx; forward: the projections' outputs, the   */ \
    X(qk_rstd, moe_real, QT * QH * T * H) /* normed rows), the all-to-alls' landing, each head's 1 / rms, and a   */ \
    X(qk_dw, moe_real, QT * QH * HD)      /* discarded weight gradient                                            */
/* All of them, for a model of one stage and one pass. */
#define MOE_MODEL_BUFFERS(X) MOE_MODEL_PASS_BUFFERS(X) MOE_MODEL_SCRATCH_BUFFERS(X)

#endif
