/* head.c — the model's two ends (model_internal.h): the embedding of the tokens, and the head (the final norm,
 * lm_head, the loss) with its backward: the slice's own, or with pieces (tp_shards > 1) vocabulary-parallel
 * (Megatron's) over the tensor group. */
#include <string.h>

#include "core/fail.h"
#include "models/model_internal.h"

/* tokens[n] of the caller's host memory to dst (device) without a wait: copied into m->staged_tokens' slot (0 the
 * inputs, 1 the targets), from where the upload is queued; the forward ends drained, so the slot is free for the
 * next one (model.c). */
static moe_status upload_tokens(moe_model *m, int slot, int *dst, const int *tokens, size_t n) {
    int *staged = m->staged_tokens + (size_t)slot * m->max_seqs * m->cfg.seq_len;
    memcpy(staged, tokens, n * sizeof(int));
    return moe_runtime_upload_async(m->rt, dst, staged, n * sizeof(int));
}

/* The first stage's input: the embedding of this rank's slice of the group's T tokens (host) into resid[0]. At tp > 1
 * the vocabulary is split: each rank looks up the group's tokens in its block (-0.0 for the others' ids), the group
 * adds them (one value and -0.0s: exact) and each keeps its slice. */
moe_status moe__model_embed(moe_model *m, const int *tokens, int T) {
    const int d = m->cfg.d_model, V = m->cfg.vocab_size;
    model_pass *P = m->P;
    MOE_TRY(upload_tokens(m, 0, P->inputs, tokens, (size_t)T));
    if (m->seq.tp == 1)
        return m->dense->embedding_forward(m->ops_state, m->p.embedding, P->inputs, T, d, 0, V, P->resid[0]);
    MOE_TRY(m->dense->embedding_forward(m->ops_state, m->p.embedding, P->inputs, T, d, m->seq.tp_rank * (V / m->seq.tp),
                                        V / m->seq.tp, m->tmp));
    MOE_TRY(moe_comm_allreduce_tree_real(moe_parallel_tensor(m->par), m->tmp, (size_t)T * d));
    return moe_tp_take_slice(&m->seq, m->tmp, T, d, P->resid[0]);
}

/* Its backward, from dL/dresid[0] of the slice (m->dresid): the embedding's gradient, at tp > 1 the vocabulary
 * block's rows from the group's tokens. */
moe_status moe__model_embed_backward(moe_model *m, int T) {
    const int d = m->cfg.d_model, V = m->cfg.vocab_size;
    if (m->seq.tp == 1)
        return moe_shard_grads_embedding(&m->shard_grads, m->dresid, m->P->inputs, d, 0, V, m->g.embedding);
    MOE_TRY(moe_tp_gather_slices(&m->seq, m->dresid, T, d, m->dln));
    return moe_shard_grads_embedding(&m->tp_grads, m->dln, m->P->inputs, d, m->seq.tp_rank * (V / m->seq.tp),
                                     V / m->seq.tp, m->g.embedding);
}

/* The loss sum of rows [from, from + count) of the group's, from the head's last loss forward. */
static moe_status vocab_loss_of_rows(void *ctx, int from, int count, double *s) {
    *s = moe_tp_cross_entropy_range_sum(&((moe_model *)ctx)->vocab_ce, from, count);
    return MOE_OK;
}

/* With pieces (tp_shards > 1) the head is vocabulary-parallel (Megatron's): the final norm of the slice gathered over
 * the group into lnf [T, d]; this rank's logits [T, V / tp] (its rows of lm_head, tp/linear.h's column-parallel
 * product); the loss over the vocabulary's pieces (tp/vocab_cross_entropy.h), of every row of the group, of which this
 * rank sums its slice's: per shard (the group's T rows hold tp x local_shards of them) in the tree, or at once. */
static moe_status vocab_head_forward(moe_model *m, const int *targets, int T, double *loss_sum, moe_real *logits_out) {
    const moe_model_config *c = &m->cfg;
    model_pass *P = m->P;
    const int d = c->d_model, V = c->vocab_size, Ts = T / m->seq.tp, last = m->last[P->chunk];
    moe_real *lnf_slice = m->seq.tp > 1 ? m->tmp : P->lnf;
    MOE_TRY(m->dense->rmsnorm_forward(m->ops_state, P->resid[last], m->p.final_norm, Ts, d, c->norm_eps, lnf_slice,
                                      P->rstdf));
    MOE_TRY(moe__model_watch(m, lnf_slice, (size_t)Ts * d, "the final norm's output"));
    if (m->seq.tp > 1) MOE_TRY(moe_tp_gather_slices(&m->seq, lnf_slice, T, d, P->lnf));
    MOE_TRY(moe_tp_column_forward(&m->tpl, P->lnf, m->c.lm_head, T, d, V, P->logits));
    MOE_TRY(moe__model_watch(m, P->logits, (size_t)T * (V / m->seq.tp), "the logits (lm_head)"));
    if (logits_out) /* [T, V / tp]: this rank's columns of every row of the group */
        MOE_TRY(moe_runtime_download(m->rt, logits_out, P->logits, (size_t)T * (V / m->seq.tp) * sizeof(moe_real)));
    if (!targets) return MOE_OK;
    MOE_TRY(upload_tokens(m, 1, P->targets, targets, (size_t)T));
    double total;
    MOE_TRY(moe_tp_cross_entropy_forward(&m->vocab_ce, P->logits, P->targets, T, V, &total));
    return moe_shard_grads_sum(&m->shard_grads, (int)moe_tp_slice_first(&m->seq, T), Ts, vocab_loss_of_rows, m,
                               loss_sum);
}

/* Its backward from dL/dloss_t = loss_scale: the logits' gradient (the loss's forward run again on the kept logits
 * first: the loss keeps the statistics of its last forward only, and a schedule may run other forwards between),
 * lm_head's rows' gradient over the group's rows, the final norm's input gradient of the slice into m->dresid. */
static moe_status vocab_head_backward(moe_model *m, int T, moe_real loss_scale) {
    const moe_model_config *c = &m->cfg;
    model_pass *P = m->P;
    const int d = c->d_model, V = c->vocab_size, Ts = T / m->seq.tp, last = m->last[P->chunk];
    double total;
    MOE_TRY(moe_tp_cross_entropy_forward(&m->vocab_ce, P->logits, P->targets, T, V, &total));
    MOE_TRY(moe_tp_cross_entropy_backward(&m->vocab_ce, P->logits, P->targets, T, V, loss_scale));
    MOE_TRY(moe__model_watch(m, P->logits, (size_t)T * (V / m->seq.tp), "the gradient of the logits"));
    MOE_TRY(moe_shard_grads_tp_column(&m->tp_grads, &m->tpl, P->logits, P->lnf, d, V, m->g.lm_head));
    MOE_TRY(moe_tp_column_backward_input(&m->tpl, P->logits, m->c.lm_head, T, d, V, 0, m->dln));
    MOE_TRY(moe_runtime_zero(m->rt, m->dresid, (size_t)Ts * d * sizeof(moe_real)));
    return moe_shard_grads_rmsnorm(&m->shard_grads, P->resid[last], m->p.final_norm, P->rstdf,
                                   m->dln + moe_tp_slice_first(&m->seq, T) * d, d, m->dresid, m->g.final_norm);
}

/* Without pieces the head is the slice's: the final norm, the logits [Ts, V] and the loss of the slice's rows. */
static moe_status plain_head_forward(moe_model *m, const int *targets, int T, double *loss_sum, moe_real *logits_out) {
    const moe_model_config *c = &m->cfg;
    model_pass *P = m->P;
    const int d = c->d_model, V = c->vocab_size, Ts = T / m->seq.tp, last = m->last[P->chunk];
    const moe_dense_ops *dense = m->dense;
    moe_dense_state *s = m->ops_state;
    MOE_TRY(dense->rmsnorm_forward(s, P->resid[last], m->p.final_norm, Ts, d, c->norm_eps, P->lnf, P->rstdf));
    MOE_TRY(moe__model_watch(m, P->lnf, (size_t)Ts * d, "the final norm's output"));
    MOE_TRY(dense->linear_forward(s, P->lnf, m->c.lm_head, Ts, d, V, P->logits));
    MOE_TRY(moe__model_watch(m, P->logits, (size_t)Ts * V, "the logits (lm_head)"));
    if (logits_out) MOE_TRY(moe_runtime_download(m->rt, logits_out, P->logits, (size_t)Ts * V * sizeof(moe_real)));
    if (!targets) return MOE_OK;
    const size_t first_row = moe_tp_slice_first(&m->seq, T);
    MOE_TRY(upload_tokens(m, 1, P->targets, targets + first_row, (size_t)Ts));
    return moe_shard_grads_loss(&m->shard_grads, P->logits, P->targets, Ts, V, loss_sum);
}

/* Its backward: dlogits (in place), then lm_head and the final norm. */
static moe_status plain_head_backward(moe_model *m, int T, moe_real loss_scale) {
    const moe_model_config *c = &m->cfg;
    model_pass *P = m->P;
    const int d = c->d_model, V = c->vocab_size, Ts = T / m->seq.tp, last = m->last[P->chunk];
    const moe_dense_ops *dense = m->dense;
    moe_dense_state *s = m->ops_state;
    moe_shard_grads *sg = &m->shard_grads;
    MOE_TRY(dense->cross_entropy_backward(s, P->logits, P->targets, Ts, V, loss_scale));
    MOE_TRY(moe__model_watch(m, P->logits, (size_t)Ts * V, "the gradient of the logits"));
    MOE_TRY(moe_shard_grads_linear(sg, P->logits, P->lnf, d, V, m->g.lm_head));
    MOE_TRY(dense->linear_backward_input(s, P->logits, m->c.lm_head, Ts, d, V, 0, m->dln));
    MOE_TRY(moe_runtime_zero(m->rt, m->dresid, (size_t)Ts * d * sizeof(moe_real)));
    return moe_shard_grads_rmsnorm(sg, P->resid[last], m->p.final_norm, P->rstdf, m->dln, d, m->dresid,
                                   m->g.final_norm);
}

moe_status moe__model_head_forward(moe_model *m, const int *targets, int T, double *loss_sum, moe_real *logits_out) {
    return m->pieces ? vocab_head_forward(m, targets, T, loss_sum, logits_out)
                     : plain_head_forward(m, targets, T, loss_sum, logits_out);
}

moe_status moe__model_head_backward(moe_model *m, int T, moe_real loss_scale) {
    if (m->tied.grad) MOE_TRY(moe_tied_grads_begin_head(&m->tied)); /* lm_head's gradient apart from the embedding's */
    return m->pieces ? vocab_head_backward(m, T, loss_scale) : plain_head_backward(m, T, loss_scale);
}
