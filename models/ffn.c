/* ffn.c — a decoder layer's FFN on one rank: the MoE layer (moe/moe.h) on MoE layers, with a shared expert beside it
 * where the model has one; a dense SwiGLU (of width moe_model_dense_d_ff) elsewhere, in tensor-parallel pieces under
 * tp_shards > 1 (models/model.h); forward, backward and the recompute. */
#include <stddef.h>

#include "core/fail.h"
#include "models/model_internal.h"

/* A dense FFN in tensor-parallel pieces (tp_shards > 1): h1, h3 of this rank's F / tp columns from ln2 (the group's
 * T rows), act, then down_proj's sum over the group; y (optional: a recompute needs only h1, h3, act) gets this rank's
 * slice of its rows. */
static moe_status tp_dense_ffn_forward(moe_model *m, int l, int T, moe_real *y) {
    const moe_model_config *c = &m->cfg;
    const moe_layer_weights *w = &m->c.layers[l].ffn;
    layer_acts *a = &m->P->acts[l];
    const int d = c->d_model, F = moe_model_dense_d_ff(c);
    MOE_TRY(moe_tp_column_forward(&m->tpl, a->ln2, w->w1, T, d, F, a->h1));
    MOE_TRY(moe_tp_column_forward(&m->tpl, a->ln2, w->w3, T, d, F, a->h3));
    MOE_TRY(m->dense->swiglu_act_forward(m->ops_state, a->h1, a->h3, (size_t)T * (F / m->seq.tp), a->act));
    if (!y) return MOE_OK;
    moe_real *whole = m->seq.tp > 1 ? m->dln : y; /* backward's scratch, free in forward */
    MOE_TRY(moe_tp_row_forward(&m->tpl, a->act, w->w2, T, F, d, whole));
    if (m->seq.tp == 1) return MOE_OK;
    return moe_tp_take_slice(&m->seq, whole, T, d, y);
}

/* Its backward from dL/dy of the slice (m->dresid) to dL/dln2 of the slice at m->dln's start; the weight gradients
 * over the group's rows (m->tp_grads). */
static moe_status tp_dense_ffn_backward(moe_model *m, int l, int T) {
    const moe_model_config *c = &m->cfg;
    const moe_layer_weights *w = &m->c.layers[l].ffn;
    moe_layer_weights *gw = &m->g.layers[l].ffn;
    layer_acts *a = &m->P->acts[l];
    const int d = c->d_model, F = moe_model_dense_d_ff(c);
    const moe_real *dy = m->dresid;
    if (m->seq.tp > 1) { /* the group's rows of dL/dy (m->tmp: forward's, spent once the layer is recomputed) */
        MOE_TRY(moe_tp_gather_slices(&m->seq, m->dresid, T, d, m->tmp));
        dy = m->tmp;
    }
    MOE_TRY(moe_shard_grads_tp_row(&m->tp_grads, &m->tpl, dy, a->act, F, d, gw->w2));
    MOE_TRY(moe_tp_row_backward_input(&m->tpl, dy, w->w2, T, F, d, 0, m->tp_dh1));
    MOE_TRY(m->dense->swiglu_act_backward(m->ops_state, a->h1, a->h3, (size_t)T * (F / m->seq.tp), m->tp_dh1,
                                          m->tp_dh3));
    MOE_TRY(moe_shard_grads_tp_column(&m->tp_grads, &m->tpl, m->tp_dh1, a->ln2, d, F, gw->w1));
    MOE_TRY(moe_shard_grads_tp_column(&m->tp_grads, &m->tpl, m->tp_dh3, a->ln2, d, F, gw->w3));
    MOE_TRY(moe_tp_column_backward_input(&m->tpl, m->tp_dh1, w->w1, T, d, F, 0, m->dln));
    MOE_TRY(moe_tp_column_backward_input(&m->tpl, m->tp_dh3, w->w3, T, d, F, 1, m->dln));
    return moe_tp_take_slice(&m->seq, m->dln, T, d, m->dln); /* the slice to dln's start */
}

/* An MoE layer's shared expert (models/model.h: shared_d_ff) on the slice's Ts rows of ln2: its output, gated by a
 * sigmoid in Qwen2-MoE, added into out (the routed experts'). */
static moe_status shared_forward(moe_model *m, int l, int Ts, moe_real *out) {
    const moe_model_layer_params *w = &m->c.layers[l];
    layer_acts *a = &m->P->acts[l];
    const int d = m->cfg.d_model;
    if (!w->shared.w1) return MOE_OK;
    MOE_TRY(m->dense->swiglu_forward(m->ops_state, &w->shared, Ts, d, m->cfg.shared_d_ff, a->ln2, a->sh1, a->sh3,
                                     a->sact, a->sout));
    MOE_TRY(moe__model_watch(m, a->sout, (size_t)Ts * d, "layer %d: the shared expert's output", l));
    if (!w->shared_gate) return m->dense->add(m->ops_state, out, a->sout, (size_t)Ts * d, out);
    MOE_TRY(m->dense->linear_forward(m->ops_state, a->ln2, w->shared_gate, Ts, d, 1, a->sgate));
    return m->dense->gate_rows_forward(m->ops_state, a->sgate, a->sout, Ts, d, out);
}

/* Its backward from dL/dout (m->dresid): the gate's and the expert's weight gradients per shard, their input
 * gradients added into m->dln (the routed experts' dL/dln2). */
static moe_status shared_backward(moe_model *m, int l, int Ts) {
    const moe_model_layer_params *w = &m->c.layers[l];
    moe_model_layer_params *gw = &m->g.layers[l];
    const layer_acts *a = &m->P->acts[l];
    const int d = m->cfg.d_model;
    if (!w->shared.w1) return MOE_OK;
    const moe_real *dout = m->dresid;
    if (w->shared_gate) { /* out += sigmoid(ln2 . g) sout */
        MOE_TRY(m->dense->gate_rows_backward(m->ops_state, a->sgate, a->sout, m->dresid, Ts, d, m->dshared, m->dgate));
        MOE_TRY(moe_shard_grads_linear(&m->shard_grads, m->dgate, a->ln2, d, 1, gw->shared_gate));
        MOE_TRY(m->dense->linear_backward_input(m->ops_state, m->dgate, w->shared_gate, Ts, d, 1, 1, m->dln));
        dout = m->dshared;
    }
    MOE_TRY(moe_shard_grads_swiglu(&m->shard_grads, &w->shared, &gw->shared, d, m->cfg.shared_d_ff, a->ln2, a->sh1,
                                   a->sh3, a->sact, dout, m->dshared_x));
    return m->dense->add(m->ops_state, m->dln, m->dshared_x, (size_t)Ts * d, m->dln);
}

/* The FFN of layer l on this rank's slice of the group's T rows, its output into m->tmp. */
moe_status moe__model_ffn_forward(moe_model *m, int l, int T) {
    const moe_model_config *c = &m->cfg;
    layer_acts *a = &m->P->acts[l];
    const moe_layer_weights *w = &m->c.layers[l].ffn;
    if (m->P->moe[l]) {
        MOE_TRY(moe_layer_forward(m->P->moe[l], w, a->ln2, T / m->seq.tp, m->tmp, &m->P->stats[l]));
        return shared_forward(m, l, T / m->seq.tp, m->tmp);
    }
    if (m->pieces) return tp_dense_ffn_forward(m, l, T, m->tmp);
    return m->dense->swiglu_forward(m->ops_state, w, T, c->d_model, moe_model_dense_d_ff(c), a->ln2, a->h1, a->h3,
                                    a->act, m->tmp);
}

/* From dL/dffn_out (m->dresid) to dL/dln2 (m->dln, overwritten), on this rank's slice of the group's T rows. */
moe_status moe__model_ffn_backward(moe_model *m, int l, int T) {
    const moe_model_config *c = &m->cfg;
    layer_acts *a = &m->P->acts[l];
    const moe_layer_weights *w = &m->c.layers[l].ffn;
    moe_layer_weights *gw = &m->g.layers[l].ffn;
    if (m->P->moe[l]) {
        MOE_TRY(moe_layer_backward(m->P->moe[l], w, m->dresid, m->dln, gw));
        return shared_backward(m, l, T / m->seq.tp);
    }
    if (m->pieces) return tp_dense_ffn_backward(m, l, T);
    return moe_shard_grads_swiglu(&m->shard_grads, w, gw, c->d_model, moe_model_dense_d_ff(c), a->ln2, a->h1, a->h3,
                                  a->act, m->dresid, m->dln);
}

/* Its intermediates that cfg.moe.recompute did not keep, before its backward, by the forward's own ops on the same
 * input ln2 (bitwise the same): an MoE layer's from its routing (moe_layer_recompute, under full recompute), a dense
 * FFN's h1, h3 and act (from the MoE level on; its output lands in m->tmp, unused). */
moe_status moe__model_ffn_recompute(moe_model *m, int l, int T) {
    const moe_model_config *c = &m->cfg;
    const moe_recompute r = c->moe.recompute;
    layer_acts *a = &m->P->acts[l];
    const moe_layer_weights *w = &m->c.layers[l].ffn;
    if (m->P->moe[l]) { /* the shared expert's intermediates by its forward again (its output in m->tmp, unused) */
        if (r == MOE_RECOMPUTE_FULL) MOE_TRY(moe_layer_recompute(m->P->moe[l], w, a->ln2));
        return r >= MOE_RECOMPUTE_MOE ? shared_forward(m, l, T / m->seq.tp, m->tmp) : MOE_OK;
    }
    if (r < MOE_RECOMPUTE_MOE) return MOE_OK;
    if (m->pieces) return tp_dense_ffn_forward(m, l, T, NULL);
    return m->dense->swiglu_forward(m->ops_state, w, T, c->d_model, moe_model_dense_d_ff(c), a->ln2, a->h1, a->h3,
                                    a->act, m->tmp);
}
