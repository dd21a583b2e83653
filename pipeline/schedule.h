/* schedule.h — what one pipeline rank does in a training step, as data: a list of forward, backward, send and
 * receive steps (DESIGN.md "Stages"). The runtime walks the list; the planner and tests read it. Pure host
 * computation: no communication, no device, no host sync.
 *
 * Shape: p pipeline stages (ranks), V model chunks per rank, m micro-batches. Chunk c on rank s is virtual stage
 * v = c·p + s of the p·V virtual stages the model's layers are cut into (Megatron-LM's layout: rank 0 holds
 * virtual stages 0, p, 2p, ...), so a micro-batch's activation goes from rank p - 1's chunk c to rank 0's chunk c + 1.
 *
 * V = 1, 1F1B (PipeDream-Flush, Megatron's non-interleaved schedule): w = min(p - s - 1, m) warm-up forwards, then
 *   alternately one forward and one backward, then the remaining backwards. p = 1 gives F0 B0 F1 B1 ...
 * V >= 2, interleaved 1F1B (Narayanan et al. 2021, Megatron-Core's forward_backward_pipelining_with_interleaving
 *   with micro-batch groups of p): needs m a multiple of p. The rank runs m·V forward micro-steps; the k-th runs
 *   chunk (k / p) % V of micro-batch (k / (p·V))·p + k % p; the k-th backward runs chunk V - 1 - (k / p) % V of the
 *   same micro-batch. w = min(2·(p - s - 1) + (V - 1)·p, m·V) warm-up forwards, then forward k + w and backward k
 *   alternately, then the remaining backwards. A steady (forward, backward) pair runs as both receives, both
 *   computes, both sends (Megatron's send_forward_backward_recv_forward_backward: see "Posting in order").
 *
 * Exchanges: a forward of virtual stage v > 0 is preceded by its RECV_ACTIVATION, and one of v < p·V - 1 followed
 * by its SEND_ACTIVATION; a backward of v < p·V - 1 is preceded by its RECV_GRADIENT, and one of v > 0 followed by
 * its SEND_GRADIENT. The peer is the rank of the adjacent virtual stage: s - 1 (mod p) for what comes from or goes
 * back to v - 1, s + 1 (mod p) for v + 1 (with p = 1 and V > 1 the rank itself). The steps assume non-blocking
 * sends and a receive that the runtime may post early but waits on where its step stands; under that rule the
 * ranks' schedules together are deadlock-free (tests/test_pp_schedule.c simulates all ranks for p <= 8, V <= 4,
 * m <= 16). The interleaved warm-up has 2·(p - s - 1) where 1F1B has p - s - 1; simulated that way, these steps
 * are deadlock-free with p - s - 1 too (that many fewer stash entries), but the schedule is kept Megatron's, so that
 * its measured overlap and memory carry over.
 *
 * Posting in order (NCCL): a transport that runs a communicator's operations one after another in posting order (the
 * next starts when the last is matched and done) deadlocks 1F1B if each exchange is posted alone: in the steady
 * state rank s posts "send act (k)" and then "recv grad (j)", rank s + 1 "send grad (j)" and then "recv act (k)",
 * and each send waits for a receive queued behind the other's send. So the runtime posts each run of consecutive
 * exchange steps (between two compute steps: the sends of what was computed and the receives of what comes next) as
 * one batch, which progresses as a whole (Megatron's send_forward_recv_backward), and waits for its receives before
 * the compute. 1F1B needs no more; the interleaved schedule needs its steady pairs' exchanges gathered too (above:
 * one pair's sends and the next pair's receives make one batch). Such a transport also carries no tags: each
 * directed pair's receives must be posted in the order of its sends, which these schedules do.
 * tests/test_pp_schedule.c simulates all ranks that way for every shape above but p = 1 with V >= 2 (a rank sending
 * to itself, which moe-train refuses): no deadlock, every message delivered where it belongs; posted one by one,
 * p 2 m 2 deadlocks.
 *
 * Stash: each forward keeps its (micro-batch, chunk) activations until its backward; the most kept at once is
 * min(w + 1, m·V) for the unclamped warm-up w above: 1F1B min(p - s, m), interleaved
 * min(2·(p - s - 1) + (V - 1)·p + 1, m·V) chunk stashes (of 1/V of a stage's layers each), largest on rank 0:
 * (p·V + p - 1) / V stages' worth = p·(1 + (p - 1)/(p·V)), the 1F1B peak of p times interleaving's factor. */
#ifndef MOE_PIPELINE_SCHEDULE_H
#define MOE_PIPELINE_SCHEDULE_H

#include <stdio.h>

#include "core/types.h"

/* the step kinds, with how moe_pp_schedule_print names them and the arrow to the peer ("" for compute) */
#define MOE_PP_OP_LIST(X)                                  \
    X(MOE_PP_FORWARD, "F", "")                             \
    X(MOE_PP_BACKWARD, "B", "")                            \
    X(MOE_PP_RECV_ACTIVATION, "recv act", "<-")            \
    X(MOE_PP_SEND_ACTIVATION, "send act", "->")            \
    X(MOE_PP_RECV_GRADIENT, "recv grad", "<-")             \
    X(MOE_PP_SEND_GRADIENT, "send grad", "->")

typedef enum {
#define MOE__PP_OP_ENUM(name, text, arrow) name,
    MOE_PP_OP_LIST(MOE__PP_OP_ENUM)
#undef MOE__PP_OP_ENUM
    MOE_PP_OP_COUNT
} moe_pp_op;

typedef struct {
    moe_pp_op op;
    int micro_batch; /* 0 .. m - 1 */
    int chunk;       /* the model chunk on this rank, 0 .. V - 1 (virtual stage chunk·p + stage) */
    int peer;        /* exchanges: the pipeline rank sent to or received from; -1 for compute steps */
} moe_pp_step;

typedef struct {
    int stages;         /* p: pipeline ranks */
    int virtual_stages; /* V: model chunks per rank; 1 is 1F1B, >= 2 interleaved 1F1B */
    int micro_batches;  /* m: per training step, the same on every rank */
} moe_pp_shape;

/* MOE_OK, or MOE_ERR_INVALID_CONFIG with a message: p, V or m below 1, interleaved (V >= 2) with m not a multiple
 * of p, or a shape whose step count does not fit an int. */
moe_status moe_pp_shape_check(const moe_pp_shape *shape);

/* The virtual stage of chunk `chunk` on rank `stage`: chunk·p + stage. */
int moe_pp_virtual_stage(const moe_pp_shape *shape, int stage, int chunk);

/* Rank `stage`'s steps, in the order it runs them: *steps malloc'd (the caller frees it), *count of them. Fails
 * as moe_pp_shape_check does, with MOE_ERR_INVALID_CONFIG for a stage outside 0 .. p - 1, MOE_ERR_INVALID_ARG for
 * NULL pointers, MOE_ERR_OUT_OF_MEMORY; *steps is NULL and *count 0 on failure. */
moe_status moe_pp_schedule(const moe_pp_shape *shape, int stage, moe_pp_step **steps, int *count);

/* The most (micro-batch, chunk) activations the steps hold at once: forwards run minus backwards run, at its
 * highest (the stash size; its formula above). */
int moe_pp_schedule_max_in_flight(const moe_pp_step *steps, int count);

/* The forwards of one chunk the steps hold at once, at the most over the chunks 0 .. chunks - 1: the stash slots a
 * runtime keeps per chunk (micro-batch mb's forward of chunk c in slot mb % passes: its forwards in flight are
 * consecutive micro-batches). */
int moe_pp_schedule_passes(const moe_pp_step *steps, int count, int chunks);

/* Whether a step is an exchange (a send or a receive), and the end of the run of consecutive exchanges that starts
 * at step i (i itself when step i computes): the steps a runtime posts as one batch (above; a run holds up to two
 * sends and two receives, one of each kind). */
int moe_pp_step_exchanges(const moe_pp_step *step);
int moe_pp_exchange_run_end(const moe_pp_step *steps, int count, int i);

/* One line per step: "F mb 3 chunk 1", "send act mb 3 chunk 1 -> 2", "recv grad mb 0 chunk 0 <- 1". */
void moe_pp_schedule_print(FILE *f, const moe_pp_step *steps, int count);

#endif
