/* zero_grads.h — ZeRO-2's gradients: no buffer holds a rank's whole gradient. Backward writes one decoder layer's
 * weight gradients at a time into a window (the layer's dense tensors, then its local experts'), and the ends (the
 * embedding, the final norm and the lm_head: the tied embedding's gradient comes from both ends of backward) into a
 * buffer kept through backward. As a layer's backward ends, its window is reduce-scattered in the fixed tree (the
 * dense part over the stage — under tensor parallelism a replicated tensor's over the tensor group, then the region
 * over the data-parallel group — the experts' over the expert-data-parallel group; alltoall/comm.h), and this rank's
 * share — its ZeRO range of the region (models/zero.h) — goes into the shard: copied by the step's first backward,
 * added by the next ones (a micro-batch's sum, then the step's in micro-batch order: the additions of --zero 0's
 * world-invariant sums, so the bits are the same).
 *
 * Memory: the shard (the dense range + the expert range, as the AdamW moments), the largest layer's window and the
 * ends, instead of the whole [dense | experts] gradient. */
#ifndef MOE_MODELS_ZERO_GRADS_H
#define MOE_MODELS_ZERO_GRADS_H

#include "models/zero.h"

typedef struct {
    size_t from, count; /* values of the region: [from, from + count) */
} moe_zero_slice;

typedef struct {
    const moe_zero_layout *zero;
    moe_runtime *rt;
    const moe_dense_ops *dense;
    moe_dense_state *state;
    int num_layers;
    /* tensor parallelism (tp > 1; else NULL): the dense region is the data-parallel group's, and a replicated
     * tensor's gradient is first summed over the tensor group (the stage's tree: the data group's of the tensor
     * groups' subtrees); the table says which tensors */
    moe_comm *tensor;
    const moe_model_tensor *tensors;
    int num_tensors;
    moe_zero_slice *layer_dense, *layer_expert; /* [L]: each layer's part of each region                       */
    moe_zero_slice head, tail;                  /* the dense region's ends: the embedding; final norm and lm_head */
    size_t window_count, ends_count;
    moe_real *window, *ends, *shard;            /* the runtime's memory; shard: [dense range | expert range]    */
    /* per slice (layer l's at l, the head's at L, the tail's at L + 1): its next sum starts the step's (copies, not
     * adds) — per slice, since an interleaved schedule runs a micro-batch's chunks at different times */
    unsigned char *fresh;
} moe_zero_grads;

/* Sizes and allocates from the tensor table (layers -1 and num_layers are the ends; the table is kept). tensor: the
 * tensor-parallel group at tp > 1, else NULL. */
moe_status moe_zero_grads_init(moe_zero_grads *g, const moe_zero_layout *zero, moe_runtime *rt,
                               const moe_dense_ops *dense, moe_dense_state *state, const moe_model_tensor *tensors,
                               int num_tensors, int num_layers, moe_comm *tensor);
void moe_zero_grads_free(moe_zero_grads *g);
/* Where tensor t's gradient is written while its layer's backward runs. */
moe_real *moe_zero_grads_at(const moe_zero_grads *g, const moe_model_tensor *t);
/* This rank's range of a region's gradient (expert 0: dense, 1: experts), in the shard. */
moe_real *moe_zero_grads_range(const moe_zero_grads *g, int expert);
/* The next backward of every slice starts the step's sum. */
void moe_zero_grads_start_step(moe_zero_grads *g);

/* Backward's steps: the ends zeroed before the head, layer l's window before its backward; then each summed into
 * the shard as its backward ends (collective over the region's group); end_backward the ends a backward ran (the head:
 * the embedding's chunk; the tail: the head's). */
moe_status moe_zero_grads_begin_backward(moe_zero_grads *g);
moe_status moe_zero_grads_begin_layer(moe_zero_grads *g, int layer);
moe_status moe_zero_grads_end_layer(moe_zero_grads *g, int layer);
moe_status moe_zero_grads_end_backward(moe_zero_grads *g, int head, int tail);

#endif
