/* tied_grads.c — a tied embedding's gradient, summed apart from the embedding's (tied_grads.h). */
#include "models/tied_grads.h"

#include <string.h>

#include "core/fail.h"

/* the pipeline communicator's tags (models/stage_runner.c uses 1 and 2) */
enum { TAG_GRADIENT = 3, TAG_WEIGHTS = 4 };

moe_status moe_tied_grads_init(moe_tied_grads *t, moe_tied_end end, moe_runtime *rt, const moe_dense_ops *dense,
                               moe_dense_state *state, moe_comm *pipeline, size_t count) {
    *t = (moe_tied_grads){.end = end, .rt = rt, .dense = dense, .state = state, .pipeline = pipeline, .count = count,
                          .fresh = 1};
    if (end != MOE_TIED_BOTH_ENDS) {
        t->peer = end == MOE_TIED_FIRST ? moe_comm_size(pipeline) - 1 : 0;
        if (t->peer == moe_comm_rank(pipeline))
            return moe_fail(MOE_ERR_INVALID_CONFIG, "tied embeddings: a stage holds one end of the model, and the "
                            "pipeline has no other stage to hold the other");
    }
    const size_t nbytes = count * sizeof(moe_real);
    MOE_TRY(moe_runtime_alloc(rt, nbytes, (void **)&t->grad));
    return end == MOE_TIED_FIRST ? MOE_OK : moe_runtime_alloc(rt, nbytes, (void **)&t->sum);
}

void moe_tied_grads_free(moe_tied_grads *t) {
    if (t->rt) moe_runtime_free(t->rt, t->grad), moe_runtime_free(t->rt, t->sum);
    memset(t, 0, sizeof *t);
}

void moe_tied_grads_start_step(moe_tied_grads *t) { t->fresh = 1; }

moe_status moe_tied_grads_begin_head(moe_tied_grads *t) {
    return moe_runtime_zero(t->rt, t->grad, t->count * sizeof(moe_real));
}

moe_status moe_tied_grads_accumulate(moe_tied_grads *t, moe_comm *group, int invariant) {
    if (invariant) MOE_TRY(moe_comm_allreduce_tree_real(group, t->grad, t->count));
    const int fresh = t->fresh;
    t->fresh = 0;
    if (fresh) return moe_runtime_copy(t->rt, t->sum, t->grad, t->count * sizeof(moe_real));
    return t->dense->add(t->state, t->sum, t->grad, t->count, t->sum);
}

moe_status moe_tied_grads_finish_step(moe_tied_grads *t, moe_real *embedding_grad, size_t lo, size_t hi) {
    const size_t nbytes = t->count * sizeof(moe_real);
    moe_comm_request *req;
    if (t->end == MOE_TIED_LAST) {
        MOE_TRY(moe_comm_isend_bytes(t->pipeline, t->sum, nbytes, t->peer, TAG_GRADIENT, &req));
        return moe_comm_wait(t->pipeline, req);
    }
    const moe_real *sum = t->sum;
    if (t->end == MOE_TIED_FIRST) {
        MOE_TRY(moe_comm_irecv_bytes(t->pipeline, t->grad, nbytes, t->peer, TAG_GRADIENT, &req));
        MOE_TRY(moe_comm_wait(t->pipeline, req));
        sum = t->grad;
    }
    return hi > lo ? t->dense->add(t->state, embedding_grad, sum + lo, hi - lo, embedding_grad) : MOE_OK;
}

moe_status moe_tied_grads_sync_weights(moe_tied_grads *t, moe_real *weights) {
    if (t->end == MOE_TIED_BOTH_ENDS) return MOE_OK;
    const size_t nbytes = t->count * sizeof(moe_real);
    moe_comm_request *req;
    if (t->end == MOE_TIED_FIRST) MOE_TRY(moe_comm_isend_bytes(t->pipeline, weights, nbytes, t->peer, TAG_WEIGHTS, &req));
    else MOE_TRY(moe_comm_irecv_bytes(t->pipeline, weights, nbytes, t->peer, TAG_WEIGHTS, &req));
    return moe_comm_wait(t->pipeline, req);
}
