/* tied_grads.h — the gradient of a tied embedding (tie_word_embeddings: the lm_head is the embedding matrix), kept
 * apart from the embedding's over the step, so that its sum is the same bits on any layout and pipeline:
 *   G = sum_mb tree(E_mb)  +  sum_mb tree(H_mb)
 * with E the embedding's gradient (the lookup's backward) and H the lm_head's (the logits' backward), each summed in
 * the fixed tree over the batch's shards (docs/DETERMINISM.md) per micro-batch and over the micro-batches in order,
 * and added once at the end of the step. (Adding E_r + H_r per rank first groups the shards' terms by rank: other
 * bits on another world size.) Without the world-invariant sums H is summed per rank over the micro-batches and added
 * to E before the gradients' all-reduce.
 *
 * On a pipeline the two ends are on different stages (models/model.h): the last stage sums H over its own ranks
 * (their positions, and so the tree, are the first stage's) and, at the end of the step, sends the sum to the first
 * stage's rank at its place: one message per step, outside the schedule (an interleaved schedule runs several head
 * backwards before the first stage's), and after the optimizer step the first stage sends the updated embedding back
 * to the last stage's replica.
 *
 * Memory: on the stage computing H, H and its step's sum (V x d each); on the first stage of a pipeline, one V x d
 * buffer for the sum arriving. */
#ifndef MOE_MODELS_TIED_GRADS_H
#define MOE_MODELS_TIED_GRADS_H

#include "alltoall/comm.h"
#include "moe/dense_ops.h"
#include "moe/runtime.h"

typedef enum {
    MOE_TIED_BOTH_ENDS, /* one stage holds the embedding and the lm_head */
    MOE_TIED_FIRST,     /* the first stage of a pipeline: the sum of H arrives from the last one */
    MOE_TIED_LAST,      /* the last stage: H computed and summed here, sent to the first */
} moe_tied_end;

typedef struct {
    moe_tied_end end;
    moe_runtime *rt;
    const moe_dense_ops *dense;
    moe_dense_state *state;
    moe_comm *pipeline; /* and the other end's rank in it (pipeline ends only) */
    int peer;
    size_t count;       /* V x d */
    moe_real *grad;     /* runtime memory: H of the current backward (where the lm_head's gradient is written), or
                           on the first stage the sum arriving */
    moe_real *sum;      /* the step's sum of H so far (not on the first stage) */
    int fresh;          /* the next head backward starts the step's sum */
} moe_tied_grads;

moe_status moe_tied_grads_init(moe_tied_grads *t, moe_tied_end end, moe_runtime *rt, const moe_dense_ops *dense,
                               moe_dense_state *state, moe_comm *pipeline, size_t count);
void moe_tied_grads_free(moe_tied_grads *t);

/* A new step: its first head backward starts the sum. */
void moe_tied_grads_start_step(moe_tied_grads *t);
/* Before the lm_head's backward: H zeroed. */
moe_status moe_tied_grads_begin_head(moe_tied_grads *t);
/* A micro-batch's H (its backward done) summed over `group` in the fixed tree (invariant 1: collective over it; where
 * the micro-batch's other gradients are summed) and added into the step's sum (copied by the step's first); without
 * the world-invariant sums (invariant 0) added as it is. */
moe_status moe_tied_grads_accumulate(moe_tied_grads *t, moe_comm *group, int invariant);
/* At the end of the step's backwards: the sum of H added into the embedding's gradient values [lo, hi) held at
 * embedding_grad (the whole tensor, or a ZeRO-2 shard's range of it), on the stage holding the embedding; the last
 * stage sends it there. Collective over the pipeline's two ends. */
moe_status moe_tied_grads_finish_step(moe_tied_grads *t, moe_real *embedding_grad, size_t lo, size_t hi);
/* After an optimizer step (pipeline ends): the first stage's embedding into the last stage's replica. Collective over
 * the two. */
moe_status moe_tied_grads_sync_weights(moe_tied_grads *t, moe_real *weights);

#endif
