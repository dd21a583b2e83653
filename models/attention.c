/* attention.c — a decoder layer's attention block on one rank, forward and backward: the attention norm, q/k/v
 * (column-parallel under tp, models/model.h) with the families' biases and q/k norms, RoPE, attention (kernels/attention.h through the dense ops), o_proj
 * (row-parallel) and the residual; and grouped-query attention's kv heads in pieces (their copies, and their
 * gradients added in the fixed tree). */
#include <stddef.h>

#include "core/fail.h"
#include "models/model_internal.h"

static moe_status model_add(void *ctx, const moe_real *a, const moe_real *b, size_t n, moe_real *y) {
    moe_model *m = ctx;
    return m->dense->add(m->ops_state, a, b, n, y);
}

/* Grouped-query attention in pieces (model.h): the rank's kv heads, their copies, the products of k_proj and v_proj. */
moe_status moe__model_init_kv_heads(moe_model *m) {
    const int S = moe_model_tp_pieces(&m->cfg, m->seq.tp);
    m->kv_blocks = moe_model_kv_blocks(&m->cfg, m->seq.tp);
    m->kv_heads = m->cfg.num_kv_heads / m->kv_blocks;
    m->kv_copies = moe_model_kv_chunks(&m->cfg, m->seq.tp) * m->kv_blocks / m->seq.tp;
    m->kv_linear = &m->tpl;
    if (m->kv_blocks < m->seq.tp) {
        MOE_TRY(moe_tp_linear_init_block(&m->kv_block_linear, m->rt, m->ops_state, S, m->kv_blocks,
                                         m->seq.tp_rank / (m->seq.tp / m->kv_blocks)));
        m->kv_linear = &m->kv_block_linear;
    }
    const size_t heads = (size_t)m->max_seqs * m->cfg.seq_len * m->kv_heads * m->head_dim; /* [TG, kv_heads hd] */
    return moe_shard_tree_init(&m->kv_tree, m->rt, model_add, m, m->kv_copies, m->kv_copies > 1 ? heads : 0);
}

/* Grouped-query attention in pieces (model.h): attention's k or v, each of the rank's kv heads kv_copies times in a
 * row ([T, kv_heads x kv_copies heads]), from the heads' [T, kv_heads heads]. */
static moe_status copy_kv_heads(moe_model *m, const moe_real *heads, int T, moe_real *copies) {
    const int n = m->kv_heads, c = m->kv_copies;
    const size_t hd = (size_t)m->head_dim, row = hd * sizeof(moe_real);
    for (int h = 0; h < n; h++)
        for (int j = 0; j < c; j++)
            MOE_TRY(moe_runtime_copy_2d(m->rt, copies + (size_t)(h * c + j) * hd, n * c * row, heads + h * hd, n * row,
                                        row, (size_t)T));
    return MOE_OK;
}

/* Its backward's first part: the gradient of the rank's kv heads from attention's gradient of their copies (dkv),
 * each head's copies added in the fixed tree (leaf j holds copy j of every head), overwriting dkv's start
 * ([T, kv_heads heads]). */
static moe_status sum_kv_copies(moe_model *m, int T, moe_real *dkv) {
    const int n = m->kv_heads, c = m->kv_copies;
    if (c == 1) return MOE_OK;
    const size_t hd = (size_t)m->head_dim, row = hd * sizeof(moe_real);
    MOE_TRY(moe_shard_tree_begin(&m->kv_tree, (size_t)T * n * hd));
    for (int j = 0; j < c; j++) {
        moe_real *leaf;
        MOE_TRY(moe_shard_tree_leaf_raw(&m->kv_tree, &leaf));
        for (int h = 0; h < n; h++)
            MOE_TRY(moe_runtime_copy_2d(m->rt, leaf + h * hd, n * row, dkv + (size_t)(h * c + j) * hd, n * c * row,
                                        row, (size_t)T));
        MOE_TRY(moe_shard_tree_push(&m->kv_tree));
    }
    return moe_shard_tree_copy_to(&m->kv_tree, dkv);
}

/* With fewer kv heads than tp the tree goes on over the ranks that share the head: into m->kv_group [T, B], whole on
 * every rank, each rank's head at its columns and -0.0 elsewhere (x + -0.0 = x for every x: each column is its
 * sharers' sum, exactly), added over the group in its fixed tree. */
static moe_status sum_kv_over_group(moe_model *m, int T, const moe_real *head) {
    const size_t hd = (size_t)m->head_dim, B = (size_t)m->cfg.num_kv_heads * hd, n = (size_t)T * B;
    const size_t h = (size_t)(m->seq.tp_rank / (m->seq.tp / m->kv_blocks));
    MOE_TRY(moe_runtime_zero(m->rt, m->kv_group, n * sizeof(moe_real)));
    MOE_TRY(m->dense->scale(m->ops_state, m->kv_group, n, -1.0)); /* -0.0 */
    MOE_TRY(moe_runtime_copy_2d(m->rt, m->kv_group + h * hd, B * sizeof(moe_real), head, hd * sizeof(moe_real),
                                hd * sizeof(moe_real), (size_t)T));
    return moe_comm_allreduce_tree_real(moe_parallel_tensor(m->par), m->kv_group, n);
}

moe_status moe__model_attention_kernel_forward(moe_model *m, int l, int num_seqs, int H, int KV, int hd) {
    layer_acts *a = &m->P->acts[l];
    const int S = m->cfg.seq_len;
    if (m->cfg.attention == MOE_ATTENTION_FUSED)
        return m->dense->attention_fused_forward(m->ops_state, a->q, a->k, a->v, num_seqs, S, H, KV, hd, a->att,
                                                 a->attn_y);
    return m->dense->attention_forward(m->ops_state, a->q, a->k, a->v, num_seqs, S, H, KV, hd, a->att, a->attn_y);
}

moe_status moe__model_attention_kernel_backward(moe_model *m, int l, int H, int KV, int hd) {
    const model_pass *P = m->P;
    const layer_acts *a = &P->acts[l];
    const int S = m->cfg.seq_len;
    if (m->cfg.attention == MOE_ATTENTION_FUSED)
        return m->dense->attention_fused_backward(m->ops_state, a->q, a->k, a->v, a->attn_y, a->att, m->dattn,
                                                  P->num_seqs, S, H, KV, hd, m->dq, m->dk, m->dv);
    return m->dense->attention_backward(m->ops_state, a->q, a->k, a->v, a->att, m->dattn, P->num_seqs, S, H, KV, hd,
                                        m->dq, m->dk, m->dv);
}

moe_status moe__model_o_proj_backward(moe_model *m, int l, int T, const moe_real *x_local, int K, moe_real *dx_local) {
    const int d = m->cfg.d_model;
    const moe_real *dout = m->dresid;
    if (m->seq.tp > 1) {
        MOE_TRY(moe_tp_gather_slices(&m->seq, m->dresid, T, d, m->dln));
        dout = m->dln;
    }
    MOE_TRY(moe_shard_grads_tp_row(&m->tp_grads, &m->tpl, dout, x_local, K, d, m->g.layers[l].wo));
    return moe_tp_row_backward_input(&m->tpl, dout, m->c.layers[l].wo, T, K, d, 0, dx_local);
}

/* The rows per token of the norms of q and k, of `heads` of the rank's heads: each head's, or 1 (a projection's). */
static int qk_rows(const moe_model *m, int heads) {
    return moe_model_qk_norm(&m->cfg) == MOE_QK_NORM_HEAD ? heads : 1;
}

/* Whether the q/k norms move rows (the whole projection's at tp > 1, OLMoE's): a token's norm reads every head, which
 * the group holds spread over its ranks, so each rank norms its slice's rows of every column instead (the same rows
 * as at tp 1, the same bits), moved by all-to-alls over the tensor group (tp/sequence.h); the norms' inputs are kept
 * in that layout (q_raw [T / tp, A], k_raw [T / tp, B]; 1 / rms per slice row). */
static int qk_norm_moves_rows(const moe_model *m) {
    return moe_model_qk_norm(&m->cfg) == MOE_QK_NORM_PROJECTION && m->seq.tp > 1;
}

/* How many consecutive ranks hold each of the rank's kv heads (tp / KV with fewer kv heads than tp, else 1). */
static int kv_sharing(const moe_model *m) { return m->seq.tp / m->kv_blocks; }

/* A q/k norm (model.h's families) of x [T, heads hd] (the projection's output: the group's T rows of the rank's
 * `heads` heads, each held by `sharing` ranks) into y, the same layout, with 1 / rms per normed row in rstd. Each
 * head's, or any at tp 1: x itself is kept for backward (kept is x). Moving rows (qk_norm_moves_rows): the slice's
 * rows of every column into kept [T / tp, tp / sharing x heads hd], normed there into x (spent), moved back into y. */
static moe_status qk_norm_forward(moe_model *m, moe_real *x, const moe_real *w, int T, int heads, int sharing,
                                  moe_real *kept, moe_real *y, moe_real *rstd) {
    const int width = heads * m->head_dim, rows = qk_rows(m, heads);
    const moe_real eps = m->cfg.norm_eps;
    if (!qk_norm_moves_rows(m))
        return m->dense->rmsnorm_forward(m->ops_state, x, w, T * rows, width / rows, eps, y, rstd);
    MOE_TRY(moe_tp_slice_all_columns(&m->seq, x, T, width, sharing, m->qk_recv, kept));
    MOE_TRY(m->dense->rmsnorm_forward(m->ops_state, kept, w, T / m->seq.tp, m->seq.tp / sharing * width, eps, x, rstd));
    return moe_tp_own_columns(&m->seq, x, T, width, sharing, m->qk_recv, y);
}

moe_status moe__model_norm_backward(moe_model *m, const moe_real *x, const moe_real *w, const moe_real *rstd,
                                   const moe_real *dy, int T, int width, int rows_per_token, moe_real *dx,
                                   moe_real *dw) {
    MOE_TRY(moe_runtime_zero(m->rt, dx, (size_t)T * width * sizeof(moe_real))); /* the op adds into dx */
    return moe_shard_grads_rmsnorm_rows(&m->shard_grads, x, w, rstd, dy, rows_per_token, width / rows_per_token, dx,
                                        dw);
}

/* A q/k norm's backward over the group's T rows of the rank's `heads` heads (x and rstd as forward kept them, dy its
 * output's gradient in the rank's columns): the input gradient into dx (the rank's columns), the weight's gradient
 * added into dw. At tp 1 in the shard tree's shards (moe__model_norm_backward). At tp > 1 the weight gradient must be
 * the sum tp 1 forms, per shard of tokens over every head: on the slice's rows of every column, in the slice's shards
 * as any replicated tensor's (models/shard_grads.h). Moving rows, dy goes there too (an all-to-all over the group,
 * tp/sequence.h), and dx comes back. Each head's norm (Qwen3) computes dx from one call over the rank's rows (row by
 * row, the same bits; its weight gradient discarded), and moves x, dy and rstd for the weight gradient: with fewer kv
 * heads than tp, k's from each kv head's first holder (`sharing` ranks hold it, with the same x and, summed over them
 * before (kv_backward), the same dy), so that the slice holds each kv head's rows once, as tp 1 sums them. */
static moe_status qk_norm_backward(moe_model *m, const moe_real *x, const moe_real *w, const moe_real *rstd,
                                   const moe_real *dy, int T, int heads, int sharing, moe_real *dx, moe_real *dw) {
    const int hd = m->head_dim, tp = m->seq.tp;
    if (tp == 1) return moe__model_norm_backward(m, x, w, rstd, dy, T, heads * hd, qk_rows(m, heads), dx, dw);
    const size_t all = (size_t)T * heads * hd; /* [T / tp, tp / sharing heads hd]: the slice's rows of every head */
    if (qk_norm_moves_rows(m)) {
        moe_real *dys = m->qk_slice, *dxs = dys + all;
        MOE_TRY(moe_tp_slice_all_columns(&m->seq, dy, T, heads * hd, sharing, m->qk_recv, dys));
        MOE_TRY(moe__model_norm_backward(m, x, w, rstd, dys, T / tp, tp / sharing * heads * hd, 1, dxs, dw));
        return moe_tp_own_columns(&m->seq, dxs, T, heads * hd, sharing, m->qk_recv, dx);
    }
    moe_real *xs = m->qk_slice, *dys = xs + all, *dxs = dys + all;
    MOE_TRY(moe_runtime_zero(m->rt, dx, all * sizeof(moe_real))); /* the op adds into dx (and dw) */
    MOE_TRY(m->dense->rmsnorm_backward(m->ops_state, x, w, rstd, dy, T * heads, hd, dx, m->qk_dw));
    MOE_TRY(moe_tp_slice_all_columns(&m->seq, x, T, heads * hd, sharing, m->qk_recv, xs));
    MOE_TRY(moe_tp_slice_all_columns(&m->seq, dy, T, heads * hd, sharing, m->qk_recv, dys));
    MOE_TRY(moe_tp_slice_all_columns(&m->seq, rstd, T, heads, sharing, m->qk_recv, m->qk_rstd));
    MOE_TRY(moe_runtime_zero(m->rt, dxs, all * sizeof(moe_real)));
    return moe_shard_grads_rmsnorm_rows(&m->shard_grads, xs, w, m->qk_rstd, dys, heads * (tp / sharing), hd, dxs,
                                        dw);
}

/* k's norm's backward in kv_backward (layer l), where the layer has one: from the gradient of the rank's kv heads
 * (*dk, [T, heads hd]) into m->dattn, which *dk then names. */
static moe_status k_norm_backward(moe_model *m, int l, int T, int heads, const moe_real **dk) {
    if (!m->c.layers[l].k_norm) return MOE_OK;
    const layer_acts *a = &m->P->acts[l];
    MOE_TRY(qk_norm_backward(m, a->k_raw, m->c.layers[l].k_norm, a->rstd_k, *dk, T, heads, kv_sharing(m), m->dattn,
                             m->g.layers[l].k_norm));
    *dk = m->dattn;
    return MOE_OK;
}

/* k's or v's part of a layer's attention backward (ln1: its input, the group's rows), from attention's gradient of
 * the copies (dkv: m->dk or m->dv): the rank's kv heads' gradient, RoPE's backward (k), the gradient of the rank's
 * block of W (k_proj or v_proj), and the input gradient added into m->dln. */
static moe_status kv_backward(moe_model *m, int l, const moe_real *ln1, moe_real *dkv, int rope) {
    const moe_model_config *c = &m->cfg;
    const int S = c->seq_len, seqs = m->P->num_seqs, T = seqs * S, d = c->d_model, hd = m->head_dim,
              B = c->num_kv_heads * hd;
    const moe_real *W = rope ? m->c.layers[l].wk : m->c.layers[l].wv;
    moe_real *dW = rope ? m->g.layers[l].wk : m->g.layers[l].wv, *db = rope ? m->g.layers[l].bk : m->g.layers[l].bv;
    const moe_real *dout = dkv; /* k_proj's or v_proj's output gradient (after k's norm, where there is one) */
    MOE_TRY(sum_kv_copies(m, T, dkv));
    if (m->kv_blocks == m->seq.tp) {
        if (rope) MOE_TRY(m->dense->rope_backward(m->ops_state, dkv, seqs, S, m->kv_heads, hd, &m->rope));
        if (rope) MOE_TRY(k_norm_backward(m, l, T, m->kv_heads, &dout));
        MOE_TRY(moe_shard_grads_tp_column(&m->tp_grads, &m->tpl, dout, ln1, d, B, dW));
        if (db) MOE_TRY(moe_shard_grads_tp_column(&m->tp_grads, &m->tpl, dout, m->ones, 1, B, db));
        return moe_tp_column_backward_input(&m->tpl, dout, W, T, d, B, 1, m->dln);
    }
    /* from the group's whole gradient (the sharers' sum, before RoPE's and k's norm's backward, so that they run on
     * what tp 1 has): the rank's head for its block's weight gradient (through k's norm, where there is one), then
     * columns [tp_rank w, +w) (w = B / tp) of the whole for its part of the plain split's input gradient, with the
     * block's matching rows: those of kv_group, or (after k's norm) of the block's [T, hd] */
    MOE_TRY(sum_kv_over_group(m, T, dkv));
    if (rope) MOE_TRY(m->dense->rope_backward(m->ops_state, m->kv_group, seqs, S, c->num_kv_heads, hd, &m->rope));
    const int sharing = kv_sharing(m), w = B / m->seq.tp;
    const size_t hb = (size_t)hd * sizeof(moe_real), wb = w * sizeof(moe_real);
    MOE_TRY(moe_runtime_copy_2d(m->rt, dkv, hb, m->kv_group + (size_t)(m->seq.tp_rank / sharing) * hd,
                                B * sizeof(moe_real), hb, (size_t)T));
    const moe_real *part = m->kv_group + (size_t)m->seq.tp_rank * w;
    size_t pitch = (size_t)B * sizeof(moe_real);
    if (rope) MOE_TRY(k_norm_backward(m, l, T, 1, &dout));
    if (dout != dkv) part = dout + (size_t)(m->seq.tp_rank % sharing) * w, pitch = hb;
    MOE_TRY(moe_shard_grads_tp_column(&m->tp_grads, m->kv_linear, dout, ln1, d, B, dW));
    if (db) MOE_TRY(moe_shard_grads_tp_column(&m->tp_grads, m->kv_linear, dout, m->ones, 1, B, db));
    MOE_TRY(moe_runtime_copy_2d(m->rt, dkv, wb, part, pitch, wb, (size_t)T));
    return moe_tp_column_backward_input(&m->tpl, dkv, W + (size_t)(m->seq.tp_rank % sharing) * w * d, T, d, B, 1,
                                        m->dln);
}

/* Layer l's attention block up to its output, for num_seqs sequences (the tensor group's: T rows): ln1 =
 * rmsnorm(resid[l]) on this rank's slice (kept), gathered over the group into m->tmp at tp > 1 (backward gathers it
 * again: Megatron's sequence parallelism keeps the slice); q, k, v of this rank's heads (all of them at tp 1) with
 * RoPE; attention into attn_y (its statistics or probabilities in att). */
moe_status moe__model_attention_forward(moe_model *m, int l, int num_seqs) {
    const moe_model_config *c = &m->cfg;
    const int S = c->seq_len, T = num_seqs * S, Ts = T / m->seq.tp, d = c->d_model, H = c->num_heads / m->seq.tp,
              KV = m->kv_heads, hd = m->head_dim, A = c->num_heads * hd, B = c->num_kv_heads * hd;
    const moe_dense_ops *dense = m->dense;
    moe_dense_state *s = m->ops_state;
    const moe_model_layer_params *w = &m->c.layers[l];
    layer_acts *a = &m->P->acts[l];
    MOE_TRY(dense->rmsnorm_forward(s, m->P->resid[l], w->attn_norm, Ts, d, c->norm_eps, a->ln1, a->rstd1));
    MOE_TRY(moe__model_watch(m, a->ln1, (size_t)Ts * d, "layer %d: the attention norm's output", l));
    if (moe_model_mla(c)) return moe__model_mla_forward(m, l, num_seqs); /* it gathers what it reads */
    const moe_real *x; /* q/k/v read the group's rows */
    MOE_TRY(moe_tp_group_rows(&m->seq, a->ln1, T, d, m->tmp, &x));
    /* k and v of the rank's kv heads: in place, or before their copies (in backward's scratch) */
    moe_real *k = m->kv_copies > 1 ? m->dk : a->k, *v = m->kv_copies > 1 ? m->dv : a->v;
    /* the projections' outputs: q and k themselves, or the family's q/k norms' inputs (kept; in scratch where the
     * norms move rows, qk_norm_forward) */
    const int moved = qk_norm_moves_rows(m);
    moe_real *q_proj = !w->q_norm ? a->q : moved ? m->qk_slice : a->q_raw,
             *k_proj = !w->k_norm ? k : moved ? m->qk_slice + (size_t)T * H * hd : a->k_raw;
    MOE_TRY(moe_tp_column_forward(&m->tpl, x, w->wq, T, d, A, q_proj));
    MOE_TRY(moe_tp_column_forward(m->kv_linear, x, w->wk, T, d, B, k_proj));
    MOE_TRY(moe_tp_column_forward(m->kv_linear, x, w->wv, T, d, B, v));
    if (w->bq) { /* Qwen2-MoE's biases: the rank's blocks of them, as of its projections' columns */
        MOE_TRY(dense->bias_add(s, q_proj, w->bq, T, H * hd));
        MOE_TRY(dense->bias_add(s, k_proj, w->bk, T, KV * hd));
        MOE_TRY(dense->bias_add(s, v, w->bv, T, KV * hd));
    }
    if (w->q_norm) { /* the family's q/k norms, before RoPE, of the rank's heads (every head's at tp 1) */
        MOE_TRY(qk_norm_forward(m, q_proj, w->q_norm, T, H, 1, a->q_raw, a->q, a->rstd_q));
        MOE_TRY(qk_norm_forward(m, k_proj, w->k_norm, T, KV, kv_sharing(m), a->k_raw, k, a->rstd_k));
    }
    MOE_TRY(moe__model_watch(m, a->q, (size_t)T * H * hd, "layer %d: q", l));
    MOE_TRY(moe__model_watch(m, k, (size_t)T * KV * hd, "layer %d: k", l));
    MOE_TRY(moe__model_watch(m, v, (size_t)T * KV * hd, "layer %d: v", l));
    MOE_TRY(dense->rope_forward(s, a->q, num_seqs, S, H, hd, &m->rope));
    MOE_TRY(dense->rope_forward(s, k, num_seqs, S, KV, hd, &m->rope));
    if (m->kv_copies > 1) {
        MOE_TRY(copy_kv_heads(m, k, T, a->k));
        MOE_TRY(copy_kv_heads(m, v, T, a->v));
    }
    MOE_TRY(moe__model_attention_kernel_forward(m, l, num_seqs, H, KV * m->kv_copies, hd)); /* the kv heads it reads */
    return moe__model_watch(m, a->attn_y, (size_t)T * H * hd, "layer %d: the attention output", l);
}

/* From attn_y (T rows) to the FFN's input on this rank's slice: resid_mid = resid[l] + o_proj(attn_y) (o_proj's whole
 * output in m->tmp: at tp > 1 the group's sum, of which the slice is taken), ln2. */
moe_status moe__model_attention_residual_forward(moe_model *m, int l, int T) {
    const moe_model_config *c = &m->cfg;
    const size_t Tsd = (size_t)(T / m->seq.tp) * c->d_model;
    const moe_model_layer_params *w = &m->c.layers[l];
    layer_acts *a = &m->P->acts[l];
    const int mla = moe_model_mla(c); /* o_proj reads MLA's v heads, or attention's output */
    MOE_TRY(moe_tp_row_forward(&m->tpl, mla ? a->mla_y : a->attn_y, w->wo, T,
                               c->num_heads * (mla ? c->v_head_dim : m->head_dim), c->d_model, m->tmp));
    MOE_TRY(m->dense->add(m->ops_state, m->P->resid[l], m->tmp + moe_tp_slice_first(&m->seq, T) * c->d_model, Tsd,
                          a->resid_mid));
    MOE_TRY(moe__model_watch(m, a->resid_mid, Tsd, "layer %d: the residual after attention (o_proj)", l));
    /* a tensor-parallel dense FFN reads the group's rows: the slice's norm gathered (o_proj's output is spent) */
    const int gather = m->seq.tp > 1 && m->pieces && !moe_model_layer_is_moe(c, l);
    moe_real *ln2 = gather ? m->tmp : a->ln2;
    MOE_TRY(m->dense->rmsnorm_forward(m->ops_state, a->resid_mid, w->ffn_norm, T / m->seq.tp, c->d_model, c->norm_eps,
                                      ln2, a->rstd2));
    MOE_TRY(moe__model_watch(m, ln2, Tsd, "layer %d: the FFN norm's output", l));
    return gather ? moe_tp_gather_slices(&m->seq, ln2, T, c->d_model, a->ln2) : MOE_OK;
}

/* The block's backward up to the attention norm, from dL/dresid_mid (m->dresid, this rank's slice): o_proj's (its
 * output gradient over the group's rows), attention's, RoPE's, q/k/v's (their input gradients into m->dln, whole over
 * the group's rows). The attention norm's backward on the slice follows (moe__model_attention_backward). */
static moe_status projections_backward(moe_model *m, int l, int T) {
    const moe_model_config *c = &m->cfg;
    const model_pass *P = m->P;
    const int S = c->seq_len, d = c->d_model, H = c->num_heads / m->seq.tp, KVC = m->kv_heads * m->kv_copies,
              hd = m->head_dim, A = c->num_heads * hd;
    const moe_dense_ops *dense = m->dense;
    moe_dense_state *s = m->ops_state;
    const moe_model_layer_params *w = &m->c.layers[l];
    moe_model_layer_params *gw = &m->g.layers[l];
    const layer_acts *a = &P->acts[l];
    moe_shard_grads *tg = &m->tp_grads; /* the tensor-parallel pieces', over the tensor group's rows */
    MOE_TRY(moe__model_o_proj_backward(m, l, T, a->attn_y, A, m->dattn));
    MOE_TRY(moe__model_attention_kernel_backward(m, l, H, KVC, hd));
    MOE_TRY(dense->rope_backward(s, m->dq, P->num_seqs, S, H, hd, &m->rope));
    moe_real *dq = m->dq; /* q_proj's output gradient: through q's norm first, when there is one */
    if (w->q_norm) { /* into m->dattn, free once attention's backward has read it */
        MOE_TRY(qk_norm_backward(m, a->q_raw, w->q_norm, a->rstd_q, m->dq, T, H, 1, m->dattn, gw->q_norm));
        dq = m->dattn;
    }
    const moe_real *ln1; /* the group's rows, gathered again (m->tmp is free from here on) */
    MOE_TRY(moe_tp_group_rows(&m->seq, a->ln1, T, d, m->tmp, &ln1));
    MOE_TRY(moe_shard_grads_tp_column(tg, &m->tpl, dq, ln1, d, A, gw->wq));
    if (gw->bq) MOE_TRY(moe_shard_grads_tp_column(tg, &m->tpl, dq, m->ones, 1, A, gw->bq)); /* column sums of dq */
    MOE_TRY(moe_tp_column_backward_input(&m->tpl, dq, w->wq, T, d, A, 0, m->dln));
    MOE_TRY(kv_backward(m, l, ln1, m->dk, 1)); /* dln += k's and v's input gradients */
    return kv_backward(m, l, ln1, m->dv, 0);
}

moe_status moe__model_attention_backward(moe_model *m, int l, int T) {
    const int d = m->cfg.d_model;
    const size_t Td = (size_t)(T / m->seq.tp) * d;
    const layer_acts *a = &m->P->acts[l];
    if (moe_model_mla(&m->cfg)) MOE_TRY(moe__model_mla_backward(m, l, T));
    else MOE_TRY(projections_backward(m, l, T));
    moe_real *dln_slice = m->dln + moe_tp_slice_first(&m->seq, T) * d; /* dln holds the group's rows */
    MOE_TRY(moe__model_watch(m, dln_slice, Td, "layer %d: the gradient of the attention norm's output", l));
    MOE_TRY(moe_shard_grads_rmsnorm(&m->shard_grads, m->P->resid[l], m->c.layers[l].attn_norm, a->rstd1, dln_slice, d,
                                    m->dresid, m->g.layers[l].attn_norm));
    return moe__model_watch(m, m->dresid, Td, "layer %d: the gradient of the layer's input", l);
}
