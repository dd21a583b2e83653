/* mla.c — multi-head latent attention (DeepSeek-V2/V3's MLA; models/model.h), forward and backward on one rank at tp 1,
 * composed of the dense table's ops (moe/dense_ops.h), so that it runs on every runtime that has them:
 *
 *   q   = ln1 Wq^T, or q_b(rmsnorm(ln1 Wqa^T))                            [T, H dqk], dqk = dn + dr
 *   ckv = ln1 Wkva^T = [c | k_pe]                                         [T, KL + dr]
 *   kv  = rmsnorm(c) Wkvb^T = per head [k_nope_h | v_h]                   [T, H (dn + dv)]
 *   RoPE on each q head's last dr columns and on k_pe (one key shared by the heads)
 *   K_h = [k_nope_h | k_pe],  V_h = [v_h | 0]  (v padded to dqk, so attention is the plain kernel with head_dim dqk
 *   and its softmax scale 1 / sqrt(dqk), DeepSeek's without YaRN)
 *   y_h = attention(q_h, K_h, V_h)[:, :dv]                                [T, H dv], o_proj's input
 *
 * Backward runs the same in reverse; k_pe's gradient is the sum over the heads of their keys' last dr columns, added
 * in head order. Every product is a row-wise GEMM and every weight gradient is formed per shard (models/shard_grads.h),
 * so MLA is bitwise the same across ep, pp and the world size as the rest of the model. */
#include "core/fail.h"
#include "models/model_internal.h"

/* The model's MLA shapes. */
typedef struct {
    int H, dqk, dr, dn, dv, QL, KL, KLR;
} mla_dims;

static mla_dims dims_of(const moe_model *m) {
    const moe_model_config *c = &m->cfg;
    const int dqk = m->head_dim, dr = c->qk_rope_dim;
    return (mla_dims){.H = c->num_heads, .dqk = dqk, .dr = dr, .dn = dqk - dr, .dv = c->v_head_dim,
                      .QL = c->q_lora_rank, .KL = c->kv_lora_rank, .KLR = c->kv_lora_rank + dr};
}

/* dst[t, h * dst_width + dst_col + j] = src[t, h * src_width + src_col + j] for j < width, every head h, T rows. */
static moe_status copy_head_columns(moe_model *m, int T, int H, int width, moe_real *dst, int dst_width, int dst_col,
                                    const moe_real *src, int src_width, int src_col) {
    const size_t r = sizeof(moe_real);
    for (int h = 0; h < H; h++)
        MOE_TRY(moe_runtime_copy_2d(m->rt, dst + (size_t)h * dst_width + dst_col, (size_t)H * dst_width * r,
                                    src + (size_t)h * src_width + src_col, (size_t)H * src_width * r, width * r,
                                    (size_t)T));
    return MOE_OK;
}

/* RoPE (forward or backward) on each head's last dr columns of x [T, H dqk], through scratch [T, H dr] (m->dq in
 * forward, m->dattn in backward: free at those points). */
static moe_status rope_tail(moe_model *m, moe_real *x, int num_seqs, const mla_dims *D, int backward,
                            moe_real *scratch) {
    const int S = m->cfg.seq_len, T = num_seqs * S;
    MOE_TRY(copy_head_columns(m, T, D->H, D->dr, scratch, D->dr, 0, x, D->dqk, D->dn));
    if (backward) MOE_TRY(m->dense->rope_backward(m->ops_state, scratch, num_seqs, S, D->H, D->dr, m->cfg.rope_theta));
    else MOE_TRY(m->dense->rope_forward(m->ops_state, scratch, num_seqs, S, D->H, D->dr, m->cfg.rope_theta));
    return copy_head_columns(m, T, D->H, D->dr, x, D->dqk, D->dn, scratch, D->dr, 0);
}

moe_status moe__model_mla_forward(moe_model *m, int l, int num_seqs, const moe_real *ln1) {
    const moe_model_config *c = &m->cfg;
    const mla_dims D = dims_of(m);
    const int S = c->seq_len, T = num_seqs * S, d = c->d_model, A = D.H * D.dqk, HNV = D.H * (D.dn + D.dv);
    const moe_dense_ops *dense = m->dense;
    moe_dense_state *s = m->ops_state;
    const moe_model_layer_params *w = &m->c.layers[l];
    layer_acts *a = &m->P->acts[l];
    if (D.QL) { /* q through its low-rank bottleneck and norm */
        MOE_TRY(dense->linear_forward(s, ln1, w->mla.q_a, T, d, D.QL, a->mla_qa));
        MOE_TRY(dense->rmsnorm_forward(s, a->mla_qa, w->mla.q_a_norm, T, D.QL, c->norm_eps, a->mla_qan,
                                       a->mla_rstd_qa));
        MOE_TRY(dense->linear_forward(s, a->mla_qan, w->mla.q_b, T, D.QL, A, a->q));
    } else {
        MOE_TRY(dense->linear_forward(s, ln1, w->wq, T, d, A, a->q));
    }
    /* the latent and the shared RoPE key: ckv [T, KL + dr] in mla_lat */
    MOE_TRY(dense->linear_forward(s, ln1, w->mla.kv_a, T, d, D.KLR, m->mla_lat));
    const size_t r = sizeof(moe_real);
    MOE_TRY(moe_runtime_copy_2d(m->rt, a->mla_c, D.KL * r, m->mla_lat, D.KLR * r, D.KL * r, (size_t)T));
    MOE_TRY(moe_runtime_copy_2d(m->rt, m->mla_kpe, D.dr * r, m->mla_lat + D.KL, D.KLR * r, D.dr * r, (size_t)T));
    MOE_TRY(dense->rmsnorm_forward(s, a->mla_c, w->mla.kv_a_norm, T, D.KL, c->norm_eps, a->mla_cn, a->mla_rstd_c));
    MOE_TRY(dense->linear_forward(s, a->mla_cn, w->mla.kv_b, T, D.KL, HNV, m->mla_dkvb));
    MOE_TRY(moe__model_watch(m, m->mla_dkvb, (size_t)T * HNV, "layer %d: MLA's k_nope and v", l));
    /* RoPE: q's tails and the shared key, then K_h = [k_nope_h | k_pe], V_h = [v_h | 0] */
    MOE_TRY(rope_tail(m, a->q, num_seqs, &D, 0, m->dq));
    MOE_TRY(dense->rope_forward(s, m->mla_kpe, num_seqs, S, 1, D.dr, c->rope_theta));
    MOE_TRY(copy_head_columns(m, T, D.H, D.dn, a->k, D.dqk, 0, m->mla_dkvb, D.dn + D.dv, 0));
    for (int h = 0; h < D.H; h++) /* the one RoPE'd key, every head's tail */
        MOE_TRY(moe_runtime_copy_2d(m->rt, a->k + (size_t)h * D.dqk + D.dn, (size_t)A * r, m->mla_kpe, D.dr * r,
                                    D.dr * r, (size_t)T));
    MOE_TRY(moe_runtime_zero(m->rt, a->v, (size_t)T * A * r));
    MOE_TRY(copy_head_columns(m, T, D.H, D.dv, a->v, D.dqk, 0, m->mla_dkvb, D.dn + D.dv, D.dn));
    if (c->attention == MOE_ATTENTION_FUSED)
        MOE_TRY(dense->attention_fused_forward(s, a->q, a->k, a->v, num_seqs, S, D.H, D.H, D.dqk, a->att, a->attn_y));
    else
        MOE_TRY(dense->attention_forward(s, a->q, a->k, a->v, num_seqs, S, D.H, D.H, D.dqk, a->att, a->attn_y));
    MOE_TRY(copy_head_columns(m, T, D.H, D.dv, a->mla_y, D.dv, 0, a->attn_y, D.dqk, 0));
    return moe__model_watch(m, a->mla_y, (size_t)T * D.H * D.dv, "layer %d: the attention output", l);
}

moe_status moe__model_mla_backward(moe_model *m, int l, int T, const moe_real *ln1) {
    const moe_model_config *c = &m->cfg;
    const mla_dims D = dims_of(m);
    const model_pass *P = m->P;
    const int S = c->seq_len, d = c->d_model, A = D.H * D.dqk, HNV = D.H * (D.dn + D.dv), HV = D.H * D.dv;
    const moe_dense_ops *dense = m->dense;
    moe_dense_state *s = m->ops_state;
    moe_shard_grads *sg = &m->shard_grads;
    const moe_model_layer_params *w = &m->c.layers[l];
    moe_model_layer_params *gw = &m->g.layers[l];
    const layer_acts *a = &P->acts[l];
    const size_t r = sizeof(moe_real);
    /* o_proj: its weight gradient, and dy of the attention output's v columns, padded to [T, H dqk] in dattn */
    MOE_TRY(moe_shard_grads_linear(sg, m->dresid, a->mla_y, HV, d, gw->wo));
    MOE_TRY(dense->linear_backward_input(s, m->dresid, w->wo, T, HV, d, 0, m->mla_dkvb));
    MOE_TRY(moe_runtime_zero(m->rt, m->dattn, (size_t)T * A * r));
    MOE_TRY(copy_head_columns(m, T, D.H, D.dv, m->dattn, D.dqk, 0, m->mla_dkvb, D.dv, 0));
    if (c->attention == MOE_ATTENTION_FUSED)
        MOE_TRY(dense->attention_fused_backward(s, a->q, a->k, a->v, a->attn_y, a->att, m->dattn, P->num_seqs, S, D.H,
                                                D.H, D.dqk, m->dq, m->dk, m->dv));
    else
        MOE_TRY(dense->attention_backward(s, a->q, a->k, a->v, a->att, m->dattn, P->num_seqs, S, D.H, D.H, D.dqk,
                                          m->dq, m->dk, m->dv));
    /* kv_b's output gradient per head [dk_nope_h | dv_h]; k_pe's, the heads' key tails added in head order */
    MOE_TRY(copy_head_columns(m, T, D.H, D.dn, m->mla_dkvb, D.dn + D.dv, 0, m->dk, D.dqk, 0));
    MOE_TRY(copy_head_columns(m, T, D.H, D.dv, m->mla_dkvb, D.dn + D.dv, D.dn, m->dv, D.dqk, 0));
    MOE_TRY(moe_runtime_copy_2d(m->rt, m->mla_kpe, D.dr * r, m->dk + D.dn, (size_t)A * r, D.dr * r, (size_t)T));
    for (int h = 1; h < D.H; h++) { /* head h's tail into dattn (free once attention's backward has read it) */
        MOE_TRY(moe_runtime_copy_2d(m->rt, m->dattn, D.dr * r, m->dk + (size_t)h * D.dqk + D.dn, (size_t)A * r,
                                    D.dr * r, (size_t)T));
        MOE_TRY(dense->add(s, m->mla_kpe, m->dattn, (size_t)T * D.dr, m->mla_kpe));
    }
    MOE_TRY(dense->rope_backward(s, m->mla_kpe, P->num_seqs, S, 1, D.dr, c->rope_theta));
    /* kv_b, the latent's norm, kv_a: ckv's gradient [dc | dk_pe] in mla_lat, ln1's into dln (overwritten) */
    MOE_TRY(moe_shard_grads_linear(sg, m->mla_dkvb, a->mla_cn, D.KL, HNV, gw->mla.kv_b));
    MOE_TRY(dense->linear_backward_input(s, m->mla_dkvb, w->mla.kv_b, T, D.KL, HNV, 0, m->mla_lat2));
    MOE_TRY(moe__model_norm_backward(m, a->mla_c, w->mla.kv_a_norm, a->mla_rstd_c, m->mla_lat2, T, D.KL, 1,
                                     m->mla_lat, gw->mla.kv_a_norm));
    MOE_TRY(moe_runtime_copy_2d(m->rt, m->mla_lat2, D.KLR * r, m->mla_lat, D.KL * r, D.KL * r, (size_t)T));
    MOE_TRY(moe_runtime_copy_2d(m->rt, m->mla_lat2 + D.KL, D.KLR * r, m->mla_kpe, D.dr * r, D.dr * r, (size_t)T));
    MOE_TRY(moe_shard_grads_linear(sg, m->mla_lat2, ln1, d, D.KLR, gw->mla.kv_a));
    MOE_TRY(dense->linear_backward_input(s, m->mla_lat2, w->mla.kv_a, T, d, D.KLR, 0, m->dln));
    /* q: RoPE's backward on the tails, then q_b, its norm and q_a (or q_proj); ln1's gradient added into dln */
    MOE_TRY(rope_tail(m, m->dq, P->num_seqs, &D, 1, m->dattn));
    if (D.QL) {
        MOE_TRY(moe_shard_grads_linear(sg, m->dq, a->mla_qan, D.QL, A, gw->mla.q_b));
        MOE_TRY(dense->linear_backward_input(s, m->dq, w->mla.q_b, T, D.QL, A, 0, m->mla_lat2));
        MOE_TRY(moe__model_norm_backward(m, a->mla_qa, w->mla.q_a_norm, a->mla_rstd_qa, m->mla_lat2, T, D.QL, 1,
                                         m->mla_lat, gw->mla.q_a_norm));
        MOE_TRY(moe_shard_grads_linear(sg, m->mla_lat, ln1, d, D.QL, gw->mla.q_a));
        MOE_TRY(dense->linear_backward_input(s, m->mla_lat, w->mla.q_a, T, d, D.QL, 1, m->dln));
    } else {
        MOE_TRY(moe_shard_grads_linear(sg, m->dq, ln1, d, A, gw->wq));
        MOE_TRY(dense->linear_backward_input(s, m->dq, w->wq, T, d, A, 1, m->dln));
    }
    return MOE_OK;
}
