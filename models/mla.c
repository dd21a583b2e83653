/* mla.c — multi-head latent attention (DeepSeek-V2/V3's MLA; models/model.h), forward and backward on one rank of a
 * tensor group of tp (1: none), composed of the dense table's ops (moe/dense_ops.h) and tensor parallelism's
 * (tp/linear.h, tp/sequence.h), so that it runs on every runtime that has them:
 *
 *   q   = ln1 Wq^T, or q_b(rmsnorm(ln1 Wqa^T))                            [T, H dqk], dqk = dn + dr
 *   ckv = ln1 Wkva^T = [c | k_pe]                                         [T, KL + dr]
 *   kv  = rmsnorm(c) Wkvb^T = per head [k_nope_h | v_h]                   [T, H (dn + dv)]
 *   RoPE on each q head's last dr columns and on k_pe (one key shared by the heads)
 *   K_h = [k_nope_h | k_pe],  V_h = [v_h | 0]  (v padded to dqk, so attention is the plain kernel with head_dim dqk
 *   and its softmax scale 1 / sqrt(dqk); with YaRN DeepSeek's is that times m^2 = moe_model_mla_softmax_factor, which
 *   multiplies q after RoPE, and q's gradient before RoPE's backward)
 *   y_h = attention(q_h, K_h, V_h)[:, :dv]                                [T, H dv], o_proj's input
 *
 * Under tensor parallelism (Megatron's split of MLA): the low-rank projections q_a and kv_a and their norms are
 * replicated and run on the slice's rows (a row's bits are its own), their outputs gathered over the group
 * (rmsnorm(q_a) and [rmsnorm(c) | k_pe], fewer values per token than ln1 itself, and gathered again in backward rather
 * than kept); q_b (or q_proj) and kv_b are column-parallel by
 * heads, o_proj row-parallel, so a rank attends with its H / tp heads over the group's rows. Backward runs the same in
 * reverse; k_pe's gradient, the sum over the heads of their keys' last dr columns, is added in head order within each
 * of the fixed pieces (--tp-shards: H / S heads each) and over the pieces in their fixed tree (moe_tp_sum_pieces), so
 * it has the same bits at any tp (at tp_shards 1, head order throughout). Every product is a row-wise GEMM or a
 * tensor-parallel one in fixed pieces, and every weight gradient is formed per shard (models/shard_grads.h), so MLA is
 * bitwise the same across tp, ep, pp and the world size as the rest of the model. */
#include "core/fail.h"
#include "models/model_internal.h"

/* The model's MLA shapes: H all heads, Hl this rank's (H / tp). */
typedef struct {
    int H, Hl, dqk, dr, dn, dv, QL, KL, KLR;
} mla_dims;

static mla_dims dims_of(const moe_model *m) {
    const moe_model_config *c = &m->cfg;
    const int dqk = m->head_dim, dr = c->qk_rope_dim;
    return (mla_dims){.H = c->num_heads, .Hl = c->num_heads / m->seq.tp, .dqk = dqk, .dr = dr, .dn = dqk - dr,
                      .dv = c->v_head_dim, .QL = c->q_lora_rank, .KL = c->kv_lora_rank, .KLR = c->kv_lora_rank + dr};
}

/* dst[t, h * dst_width + dst_col + j] = src[t, h * src_width + src_col + j] for j < width, every head h < H, T rows. */
static moe_status copy_head_columns(moe_model *m, int T, int H, int width, moe_real *dst, int dst_width, int dst_col,
                                    const moe_real *src, int src_width, int src_col) {
    const size_t r = sizeof(moe_real);
    for (int h = 0; h < H; h++)
        MOE_TRY(moe_runtime_copy_2d(m->rt, dst + (size_t)h * dst_width + dst_col, (size_t)H * dst_width * r,
                                    src + (size_t)h * src_width + src_col, (size_t)H * src_width * r, width * r,
                                    (size_t)T));
    return MOE_OK;
}

/* RoPE (forward or backward) on each of the rank's heads' last dr columns of x [T, Hl dqk], through scratch
 * [T, Hl dr] (m->dq in forward, m->dattn in backward: free at those points). */
static moe_status rope_tail(moe_model *m, moe_real *x, int num_seqs, const mla_dims *D, int backward,
                            moe_real *scratch) {
    const int S = m->cfg.seq_len, T = num_seqs * S;
    MOE_TRY(copy_head_columns(m, T, D->Hl, D->dr, scratch, D->dr, 0, x, D->dqk, D->dn));
    if (backward) MOE_TRY(m->dense->rope_backward(m->ops_state, scratch, num_seqs, S, D->Hl, D->dr, &m->rope));
    else MOE_TRY(m->dense->rope_forward(m->ops_state, scratch, num_seqs, S, D->Hl, D->dr, &m->rope));
    return copy_head_columns(m, T, D->Hl, D->dr, x, D->dqk, D->dn, scratch, D->dr, 0);
}

/* The kv latent: kv_a and its norm (replicated) on the slice's Ts rows of ln1, keeping c, its 1 / rms and rmsnorm(c)
 * there (mla_c, mla_rstd_c, mla_cn); over the group's T rows rmsnorm(c) (*cn: mla_cn itself at tp 1, else in
 * mla_lat2) and the shared key before RoPE (m->mla_kpe). At tp > 1 [rmsnorm(c) | k_pe] moves in one gather (into
 * mla_lat), then apart. */
static moe_status kv_latent_forward(moe_model *m, int l, int T, const mla_dims *D, const moe_real **cn) {
    const moe_model_config *c = &m->cfg;
    const int Ts = T / m->seq.tp;
    const moe_model_layer_params *w = &m->c.layers[l];
    layer_acts *a = &m->P->acts[l];
    const size_t r = sizeof(moe_real), KL = D->KL * r, KLR = D->KLR * r, dr = D->dr * r;
    MOE_TRY(m->dense->linear_forward(m->ops_state, a->ln1, w->mla.kv_a, Ts, c->d_model, D->KLR, m->mla_lat2));
    MOE_TRY(moe_runtime_copy_2d(m->rt, a->mla_c, KL, m->mla_lat2, KLR, KL, (size_t)Ts));
    MOE_TRY(m->dense->rmsnorm_forward(m->ops_state, a->mla_c, w->mla.kv_a_norm, Ts, D->KL, c->norm_eps, a->mla_cn,
                                      a->mla_rstd_c));
    if (m->seq.tp == 1) {
        *cn = a->mla_cn;
        return moe_runtime_copy_2d(m->rt, m->mla_kpe, dr, m->mla_lat2 + D->KL, KLR, dr, (size_t)T);
    }
    MOE_TRY(moe_runtime_copy_2d(m->rt, m->mla_lat2, KLR, a->mla_cn, KL, KL, (size_t)Ts));
    MOE_TRY(moe_tp_gather_slices(&m->seq, m->mla_lat2, T, D->KLR, m->mla_lat));
    MOE_TRY(moe_runtime_copy_2d(m->rt, m->mla_lat2, KL, m->mla_lat, KLR, KL, (size_t)T));
    *cn = m->mla_lat2;
    return moe_runtime_copy_2d(m->rt, m->mla_kpe, dr, m->mla_lat + D->KL, KLR, dr, (size_t)T);
}

moe_status moe__model_mla_forward(moe_model *m, int l, int num_seqs) {
    const moe_model_config *c = &m->cfg;
    const mla_dims D = dims_of(m);
    const int S = c->seq_len, T = num_seqs * S, d = c->d_model, A = D.H * D.dqk, HNV = D.H * (D.dn + D.dv),
              Al = D.Hl * D.dqk, HNVl = D.Hl * (D.dn + D.dv);
    const moe_dense_ops *dense = m->dense;
    moe_dense_state *s = m->ops_state;
    const moe_model_layer_params *w = &m->c.layers[l];
    layer_acts *a = &m->P->acts[l];
    /* the rank's heads of [k_nope | v] and of q over the group's rows, from the latents (replicated, on the slice's
     * rows: a row's bits are its own) gathered over the group */
    const moe_real *cn, *x;
    MOE_TRY(kv_latent_forward(m, l, T, &D, &cn));
    MOE_TRY(moe_tp_column_forward(&m->tpl, cn, w->mla.kv_b, T, D.KL, HNV, m->mla_dkvb));
    MOE_TRY(moe__model_watch(m, m->mla_dkvb, (size_t)T * HNVl, "layer %d: MLA's k_nope and v", l));
    if (D.QL) { /* q through its low-rank bottleneck and norm */
        MOE_TRY(dense->linear_forward(s, a->ln1, w->mla.q_a, T / m->seq.tp, d, D.QL, a->mla_qa));
        MOE_TRY(dense->rmsnorm_forward(s, a->mla_qa, w->mla.q_a_norm, T / m->seq.tp, D.QL, c->norm_eps, a->mla_qan,
                                       a->mla_rstd_qa));
        MOE_TRY(moe_tp_group_rows(&m->seq, a->mla_qan, T, D.QL, m->mla_lat, &x));
        MOE_TRY(moe_tp_column_forward(&m->tpl, x, w->mla.q_b, T, D.QL, A, a->q));
    } else { /* q_proj reads ln1 of the group's rows */
        MOE_TRY(moe_tp_group_rows(&m->seq, a->ln1, T, d, m->tmp, &x));
        MOE_TRY(moe_tp_column_forward(&m->tpl, x, w->wq, T, d, A, a->q));
    }
    /* RoPE: q's tails and the shared key, then K_h = [k_nope_h | k_pe], V_h = [v_h | 0] */
    MOE_TRY(rope_tail(m, a->q, num_seqs, &D, 0, m->dq));
    const double softmax_factor = moe_model_mla_softmax_factor(c);
    if (softmax_factor != 1) MOE_TRY(dense->scale(s, a->q, (size_t)T * Al, softmax_factor));
    MOE_TRY(dense->rope_forward(s, m->mla_kpe, num_seqs, S, 1, D.dr, &m->rope));
    MOE_TRY(copy_head_columns(m, T, D.Hl, D.dn, a->k, D.dqk, 0, m->mla_dkvb, D.dn + D.dv, 0));
    const size_t r = sizeof(moe_real);
    for (int h = 0; h < D.Hl; h++) /* the one RoPE'd key, every head's tail */
        MOE_TRY(moe_runtime_copy_2d(m->rt, a->k + (size_t)h * D.dqk + D.dn, (size_t)Al * r, m->mla_kpe, D.dr * r,
                                    D.dr * r, (size_t)T));
    MOE_TRY(moe_runtime_zero(m->rt, a->v, (size_t)T * Al * r));
    MOE_TRY(copy_head_columns(m, T, D.Hl, D.dv, a->v, D.dqk, 0, m->mla_dkvb, D.dn + D.dv, D.dn));
    MOE_TRY(moe__model_attention_kernel_forward(m, l, num_seqs, D.Hl, D.Hl, D.dqk));
    MOE_TRY(copy_head_columns(m, T, D.Hl, D.dv, a->mla_y, D.dv, 0, a->attn_y, D.dqk, 0));
    return moe__model_watch(m, a->mla_y, (size_t)T * D.Hl * D.dv, "layer %d: the attention output", l);
}

/* k_pe's gradient, piece j's part (moe_tp_sum_pieces): its heads' key tails (of the rank's dk [T, Hl dqk]) added in
 * head order into leaf [T, dr], through m->dattn (free once attention's backward has read it). */
typedef struct {
    moe_model *m;
    const mla_dims *D;
    int T, heads; /* heads per piece: H / S */
} kpe_pieces;

static moe_status kpe_piece(void *ctx, int j, moe_real *leaf) {
    const kpe_pieces *p = ctx;
    moe_model *m = p->m;
    const mla_dims *D = p->D;
    const size_t r = sizeof(moe_real), pitch = (size_t)D->Hl * D->dqk * r;
    const moe_real *tail = m->dk + D->dn; /* head h's: tail + h dqk */
    const int h0 = j * p->heads;
    MOE_TRY(moe_runtime_copy_2d(m->rt, leaf, D->dr * r, tail + (size_t)h0 * D->dqk, pitch, D->dr * r, (size_t)p->T));
    for (int h = h0 + 1; h < h0 + p->heads; h++) {
        MOE_TRY(moe_runtime_copy_2d(m->rt, m->dattn, D->dr * r, tail + (size_t)h * D->dqk, pitch, D->dr * r,
                                    (size_t)p->T));
        MOE_TRY(m->dense->add(m->ops_state, leaf, m->dattn, (size_t)p->T * D->dr, leaf));
    }
    return MOE_OK;
}

/* A replicated latent's norm's backward on the slice's rows (x, rstd: the slice's), from its output's gradient over the
 * group's T rows (dyn [T, width], read at the slice's): dx [T / tp, width] overwritten, the weight's gradient added. */
static moe_status latent_norm_backward(moe_model *m, int T, const moe_real *x, const moe_real *w, const moe_real *rstd,
                                       const moe_real *dyn, int width, moe_real *dx, moe_real *dw) {
    const moe_real *dy = dyn + moe_tp_slice_first(&m->seq, T) * width;
    return moe__model_norm_backward(m, x, w, rstd, dy, T / m->seq.tp, width, 1, dx, dw);
}

moe_status moe__model_mla_backward(moe_model *m, int l, int T) {
    const moe_model_config *c = &m->cfg;
    const mla_dims D = dims_of(m);
    const model_pass *P = m->P;
    const int S = c->seq_len, d = c->d_model, Ts = T / m->seq.tp, A = D.H * D.dqk, HNV = D.H * (D.dn + D.dv),
              HV = D.H * D.dv, Al = D.Hl * D.dqk;
    const moe_dense_ops *dense = m->dense;
    moe_dense_state *s = m->ops_state;
    moe_shard_grads *sg = &m->shard_grads, *tg = &m->tp_grads; /* the slice's rows; the pieces' over the group's */
    const moe_model_layer_params *w = &m->c.layers[l];
    moe_model_layer_params *gw = &m->g.layers[l];
    const layer_acts *a = &P->acts[l];
    const size_t r = sizeof(moe_real);
    moe_real *dln = m->dln + moe_tp_slice_first(&m->seq, T) * d; /* the slice's rows of ln1's gradient */
    /* o_proj (row-parallel, its output gradient over the group's rows): its weight gradient, and dy of the rank's
     * heads' v columns, padded to [T, Hl dqk] in dattn */
    MOE_TRY(moe__model_o_proj_backward(m, l, T, a->mla_y, HV, m->mla_dkvb));
    MOE_TRY(moe_runtime_zero(m->rt, m->dattn, (size_t)T * Al * r));
    MOE_TRY(copy_head_columns(m, T, D.Hl, D.dv, m->dattn, D.dqk, 0, m->mla_dkvb, D.dv, 0));
    MOE_TRY(moe__model_attention_kernel_backward(m, l, D.Hl, D.Hl, D.dqk));
    /* kv_b's output gradient per head [dk_nope_h | dv_h]; k_pe's, the heads' key tails added in the pieces' order */
    MOE_TRY(copy_head_columns(m, T, D.Hl, D.dn, m->mla_dkvb, D.dn + D.dv, 0, m->dk, D.dqk, 0));
    MOE_TRY(copy_head_columns(m, T, D.Hl, D.dv, m->mla_dkvb, D.dn + D.dv, D.dn, m->dv, D.dqk, 0));
    kpe_pieces kp = {m, &D, T, D.H / m->tpl.num_pieces};
    MOE_TRY(moe_tp_sum_pieces(&m->tpl, (size_t)T * D.dr, kpe_piece, &kp, m->mla_kpe));
    MOE_TRY(dense->rope_backward(s, m->mla_kpe, P->num_seqs, S, 1, D.dr, &m->rope));
    /* kv_b (its input gradient whole over the group's rows, in mla_lat2), then on the slice's rows the latent's norm
     * and kv_a: ckv's gradient [dc | dk_pe] in mla_lat2, ln1's into dln (overwritten) */
    const moe_real *x; /* a column-parallel product's input: the slice's kept rows gathered again (Megatron's way) */
    MOE_TRY(moe_tp_group_rows(&m->seq, a->mla_cn, T, D.KL, m->mla_lat, &x));
    MOE_TRY(moe_shard_grads_tp_column(tg, &m->tpl, m->mla_dkvb, x, D.KL, HNV, gw->mla.kv_b));
    MOE_TRY(moe_tp_column_backward_input(&m->tpl, m->mla_dkvb, w->mla.kv_b, T, D.KL, HNV, 0, m->mla_lat2));
    MOE_TRY(latent_norm_backward(m, T, a->mla_c, w->mla.kv_a_norm, a->mla_rstd_c, m->mla_lat2, D.KL, m->mla_lat,
                                 gw->mla.kv_a_norm));
    MOE_TRY(moe_runtime_copy_2d(m->rt, m->mla_lat2, D.KLR * r, m->mla_lat, D.KL * r, D.KL * r, (size_t)Ts));
    const moe_real *kpe_slice = m->mla_kpe + moe_tp_slice_first(&m->seq, T) * D.dr;
    MOE_TRY(moe_runtime_copy_2d(m->rt, m->mla_lat2 + D.KL, D.KLR * r, kpe_slice, D.dr * r, D.dr * r, (size_t)Ts));
    MOE_TRY(moe_shard_grads_linear(sg, m->mla_lat2, a->ln1, d, D.KLR, gw->mla.kv_a));
    MOE_TRY(dense->linear_backward_input(s, m->mla_lat2, w->mla.kv_a, Ts, d, D.KLR, 0, dln));
    /* q: RoPE's backward on the tails, then q_b, its norm and q_a (or q_proj); ln1's gradient added into dln */
    const double softmax_factor = moe_model_mla_softmax_factor(c);
    if (softmax_factor != 1) MOE_TRY(dense->scale(s, m->dq, (size_t)T * Al, softmax_factor));
    MOE_TRY(rope_tail(m, m->dq, P->num_seqs, &D, 1, m->dattn));
    if (D.QL) {
        MOE_TRY(moe_tp_group_rows(&m->seq, a->mla_qan, T, D.QL, m->mla_lat, &x));
        MOE_TRY(moe_shard_grads_tp_column(tg, &m->tpl, m->dq, x, D.QL, A, gw->mla.q_b));
        MOE_TRY(moe_tp_column_backward_input(&m->tpl, m->dq, w->mla.q_b, T, D.QL, A, 0, m->mla_lat2));
        MOE_TRY(latent_norm_backward(m, T, a->mla_qa, w->mla.q_a_norm, a->mla_rstd_qa, m->mla_lat2, D.QL, m->mla_lat,
                                     gw->mla.q_a_norm));
        MOE_TRY(moe_shard_grads_linear(sg, m->mla_lat, a->ln1, d, D.QL, gw->mla.q_a));
        return dense->linear_backward_input(s, m->mla_lat, w->mla.q_a, Ts, d, D.QL, 1, dln);
    }
    MOE_TRY(moe_tp_group_rows(&m->seq, a->ln1, T, d, m->tmp, &x)); /* q_proj's input (m->tmp is free here) */
    MOE_TRY(moe_shard_grads_tp_column(tg, &m->tpl, m->dq, x, d, A, gw->wq));
    return moe_tp_column_backward_input(&m->tpl, m->dq, w->wq, T, d, A, 1, m->dln); /* the slice's rows matter */
}
