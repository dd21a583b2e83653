/* stage_runner.h — one training step of a pipeline stage: its schedule (pipeline/schedule.h) walked over its model
 * (models/model.h's stage), the activations sent forward and the gradients back over the pipeline communicator with
 * asynchronous point-to-point exchanges (alltoall/comm.h), each forward kept in a pass of the model (the stash) until
 * its backward. With one stage the schedule is F0 B0 F1 B1 ... and nothing is exchanged: the step it always was.
 *
 * Micro-batch mb's forward of chunk c keeps its activations in pass mb % passes of chunk c: a schedule's forwards in
 * flight of one chunk are consecutive micro-batches, at most `passes` of them (the most of any chunk: the model's
 * passes per chunk). An activation is sent from the pass's output (waited for before the pass's next forward
 * overwrites it); a gradient from a copy per pass (the model's input gradient is scratch that the next backward
 * overwrites). The exchanges between two compute steps are posted as one batch and its receives complete there
 * (schedule.h "Posting in order": what keeps NCCL, which runs posts in order, from deadlocking). */
#ifndef MOE_MODELS_STAGE_RUNNER_H
#define MOE_MODELS_STAGE_RUNNER_H

#include "models/model.h"
#include "pipeline/schedule.h"

/* What the caller does around each micro-batch's forward and backward of a chunk on this stage (the pass selected). */
typedef struct {
    void *ctx;
    /* before mb's forward: its host tokens (read by the embedding's chunk) and targets (the head's) — valid until the
     * forward returns — and whatever goes before a forward (forced routing) */
    moe_status (*before_forward)(void *ctx, int mb, int chunk, const int **inputs, const int **targets);
    /* after mb's forward: this rank's loss sum of it (0 except on the head's chunk) */
    moe_status (*after_forward)(void *ctx, int mb, int chunk, double loss_sum);
    /* before mb's backward (the gradient buffer's turn: a world-invariant step sums each micro-batch on its own) */
    moe_status (*before_backward)(void *ctx, int mb, int chunk);
    /* after mb's backward (its routing statistics readable) */
    moe_status (*after_backward)(void *ctx, int mb, int chunk);
} moe_stage_hooks;

typedef struct {
    moe_model *model;
    moe_comm *pipeline;
    moe_pp_shape shape;
    int stage;                      /* this rank's pipeline stage                                         */
    moe_pp_step *steps;             /* this stage's schedule                                               */
    int num_steps, chunks, passes;  /* passes per chunk                                                        */
    size_t nbytes;                  /* one micro-batch's activation (or its gradient): [T, d] reals           */
    moe_real *recv[2];              /* runtime memory: where an activation [0] or a gradient [1] arrives      */
    /* per (chunk, pass), at chunk * passes + pass: */
    moe_real **grad_out;            /* the input gradients sent back                                          */
    moe_comm_request **act_sent, **grad_sent; /* sends not yet waited for                                     */
    int *pass_mb;                   /* the micro-batch whose forward a pass holds, -1: none                   */
    /* since init, over moe_stage_runner_step: wall seconds of the steps, and of them the seconds blocked in the
     * pipeline's waits (a receive not yet arrived, a send not yet taken): the bubble and the imbalance as this
     * stage sees them (the host's clock: on a GPU the waits also hold the queued compute) */
    double step_s, wait_s;
} moe_stage_runner;

/* The passes per chunk a stage of `shape` needs (the most forwards of one chunk its schedule keeps in flight),
 * before the model exists. */
moe_status moe_stage_runner_passes(const moe_pp_shape *shape, int stage, int *passes);

/* A runner of model's stage (shape->virtual_stages chunks, its passes at least moe_stage_runner_passes's) over pipeline
 * (size shape->stages, this rank's stage its rank in it), for micro-batches of up to max_tokens tokens. */
moe_status moe_stage_runner_init(moe_stage_runner *r, moe_model *model, moe_comm *pipeline, const moe_pp_shape *shape,
                                 int max_tokens);
void moe_stage_runner_free(moe_stage_runner *r);

/* The step's micro-batches of num_seqs sequences each: the schedule's forwards, backwards (dL/dloss_t = loss_scale)
 * and exchanges in order, the hooks around them. Collective over the pipeline and the stage. Every send is complete
 * on return. */
moe_status moe_stage_runner_step(moe_stage_runner *r, const moe_stage_hooks *hooks, int num_seqs,
                                 moe_real loss_scale);

/* A forward of the whole pipeline without backward (evaluation), every virtual stage in order: the first embeds
 * inputs, the last computes the loss of targets into *loss_sum (0 elsewhere); with logits (host, [num_seqs*S, V]) the
 * last stage writes them there. Collective over the pipeline and the stage. */
moe_status moe_stage_runner_forward(moe_stage_runner *r, const int *inputs, const int *targets, int num_seqs,
                                    double *loss_sum, moe_real *logits);

#endif
