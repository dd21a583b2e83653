/* tied_grads.h — the gradient of a tied embedding (tie_word_embeddings: the lm_head is the embedding matrix), kept
 * apart from the embedding's until each is summed over the ranks, so that its sum is the same bits on any layout:
 *   G = tree(E) + tree(H)
 * with E the embedding's gradient (the lookup's backward) and H the lm_head's (the logits' backward), each summed in
 * the fixed tree over the batch's shards (docs/DETERMINISM.md). (Adding them per rank first, E_r + H_r, and then
 * summing over the ranks, groups the shards' terms by rank: other bits on another world size.) With the
 * world-invariant sums off there is no tree to keep: H is added to E at once.
 *
 * On a pipeline the two ends are on two stages (models/model.h): the last stage computes H and sends it, unsummed, to
 * the first stage's rank at its place (each backward's own, before the activation gradient leaves that stage: the
 * first stage takes it at the end of the same micro-batch's backward, so no schedule waits on it), and the first stage
 * sums it over its own ranks, which are in the same positions: tree(H) is the same tree. After the optimizer step the
 * first stage sends the updated embedding back to the last stage's replica.
 *
 * Memory: one V x d gradient on each end (the pipeline adds nothing else). */
#ifndef MOE_MODELS_TIED_GRADS_H
#define MOE_MODELS_TIED_GRADS_H

#include "alltoall/comm.h"
#include "moe/dense_ops.h"
#include "moe/runtime.h"

typedef enum {
    MOE_TIED_BOTH_ENDS, /* one stage holds the embedding and the lm_head: H computed and combined here */
    MOE_TIED_FIRST,     /* the first stage of a pipeline: H arrives from the last one, combined here */
    MOE_TIED_LAST,      /* the last stage: H computed here and sent to the first */
} moe_tied_end;

typedef struct {
    moe_tied_end end;
    moe_runtime *rt;
    const moe_dense_ops *dense;
    moe_dense_state *state;
    moe_comm *pipeline; /* and the other end's rank in it (pipeline ends only) */
    int peer;
    size_t count;       /* V x d */
    moe_real *grad;     /* H of the current backward (runtime memory): where the lm_head's gradient is written */
    moe_comm_request *sent; /* MOE_TIED_LAST: the last backward's H, still on its way */
} moe_tied_grads;

moe_status moe_tied_grads_init(moe_tied_grads *t, moe_tied_end end, moe_runtime *rt, const moe_dense_ops *dense,
                               moe_dense_state *state, moe_comm *pipeline, size_t count);
void moe_tied_grads_free(moe_tied_grads *t);

/* Before the lm_head's backward (both ends, last): H zeroed (the last backward's send completed first). */
moe_status moe_tied_grads_begin_head(moe_tied_grads *t);
/* After it (last): H sent to the first stage. */
moe_status moe_tied_grads_end_head(moe_tied_grads *t);
/* After the embedding's backward (both ends, first): H received (first); without the world-invariant sums
 * (invariant 0) added into embedding_grad at once. */
moe_status moe_tied_grads_end_backward(moe_tied_grads *t, moe_real *embedding_grad, int invariant);
/* With the world-invariant sums, once embedding_grad has been summed over `group` in the fixed tree (both ends,
 * first): H summed there too and added: G = tree(E) + tree(H). Collective over group. */
moe_status moe_tied_grads_add_summed(moe_tied_grads *t, moe_comm *group, moe_real *embedding_grad);
/* After an optimizer step (first, last): the first stage's embedding into the last stage's replica; the last
 * backward's send completed. Collective over the two. */
moe_status moe_tied_grads_sync_weights(moe_tied_grads *t, moe_real *weights);

#endif
