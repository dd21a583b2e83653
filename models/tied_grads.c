/* tied_grads.c — a tied embedding's gradient, summed apart from the embedding's (tied_grads.h). */
#include "models/tied_grads.h"

#include <string.h>

#include "core/fail.h"

/* the pipeline communicator's tags (models/stage_runner.c uses 1 and 2) */
enum { TAG_GRADIENT = 3, TAG_WEIGHTS = 4 };

moe_status moe_tied_grads_init(moe_tied_grads *t, moe_tied_end end, moe_runtime *rt, const moe_dense_ops *dense,
                               moe_dense_state *state, moe_comm *pipeline, size_t count) {
    *t = (moe_tied_grads){.end = end, .rt = rt, .dense = dense, .state = state, .pipeline = pipeline, .count = count};
    if (end != MOE_TIED_BOTH_ENDS) {
        t->peer = end == MOE_TIED_FIRST ? moe_comm_size(pipeline) - 1 : 0;
        if (t->peer == moe_comm_rank(pipeline))
            return moe_fail(MOE_ERR_INVALID_CONFIG, "tied embeddings: a stage holds one end of the model, and the "
                            "pipeline has no other stage to hold the other");
    }
    return moe_runtime_alloc(rt, count * sizeof(moe_real), (void **)&t->grad);
}

void moe_tied_grads_free(moe_tied_grads *t) {
    if (t->sent) moe_comm_wait(t->pipeline, t->sent); /* only a failed job leaves one: nothing left to report */
    if (t->rt) moe_runtime_free(t->rt, t->grad);
    memset(t, 0, sizeof *t);
}

/* The last backward's H on its way completes: the first stage takes it by the end of that micro-batch's backward. */
static moe_status finish_send(moe_tied_grads *t) {
    if (!t->sent) return MOE_OK;
    moe_comm_request *sent = t->sent;
    t->sent = NULL;
    return moe_comm_wait(t->pipeline, sent);
}

moe_status moe_tied_grads_begin_head(moe_tied_grads *t) {
    MOE_TRY(finish_send(t));
    return moe_runtime_zero(t->rt, t->grad, t->count * sizeof(moe_real));
}

moe_status moe_tied_grads_end_head(moe_tied_grads *t) {
    if (t->end != MOE_TIED_LAST) return MOE_OK;
    return moe_comm_isend_bytes(t->pipeline, t->grad, t->count * sizeof(moe_real), t->peer, TAG_GRADIENT, &t->sent);
}

moe_status moe_tied_grads_end_backward(moe_tied_grads *t, moe_real *embedding_grad, int invariant) {
    if (t->end == MOE_TIED_LAST) return MOE_OK;
    if (t->end == MOE_TIED_FIRST) {
        moe_comm_request *req;
        MOE_TRY(moe_comm_irecv_bytes(t->pipeline, t->grad, t->count * sizeof(moe_real), t->peer, TAG_GRADIENT, &req));
        MOE_TRY(moe_comm_wait(t->pipeline, req));
    }
    return invariant ? MOE_OK : t->dense->add(t->state, embedding_grad, t->grad, t->count, embedding_grad);
}

moe_status moe_tied_grads_add_summed(moe_tied_grads *t, moe_comm *group, moe_real *embedding_grad) {
    if (t->end == MOE_TIED_LAST) return MOE_OK;
    MOE_TRY(moe_comm_allreduce_tree_real(group, t->grad, t->count));
    return t->dense->add(t->state, embedding_grad, t->grad, t->count, embedding_grad);
}

moe_status moe_tied_grads_sync_weights(moe_tied_grads *t, moe_real *weights) {
    if (t->end == MOE_TIED_BOTH_ENDS) return MOE_OK;
    MOE_TRY(finish_send(t));
    const size_t nbytes = t->count * sizeof(moe_real);
    moe_comm_request *req;
    if (t->end == MOE_TIED_FIRST) MOE_TRY(moe_comm_isend_bytes(t->pipeline, weights, nbytes, t->peer, TAG_WEIGHTS, &req));
    else MOE_TRY(moe_comm_irecv_bytes(t->pipeline, weights, nbytes, t->peer, TAG_WEIGHTS, &req));
    return moe_comm_wait(t->pipeline, req);
}
