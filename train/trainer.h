/* trainer.h — the training loop's pieces on one rank: data, model, optimizer state, one step,
 * evaluation and sampling. moe-train (train/train.c) drives it; tests drive it directly. */
#ifndef MOE_TRAIN_TRAINER_H
#define MOE_TRAIN_TRAINER_H

#include "checkpoint/checkpoint.h" /* MOE_RUN_ID_NBYTES: a run id as manifests hold it */
#include "models/optimizer.h"
#include "models/stage_runner.h"
#include "train/batch_reader.h"
#include "train/dataloader.h"
#include "train/options.h"
#include "train/routing_trace.h"

typedef struct {
    double loss;          /* mean cross-entropy over the step's global tokens                        */
    double aux, z;        /* unweighted router losses, averaged over MoE layers and micro-batches     */
    double drop_fraction; /* dropped / all assignments, over the world                               */
    double grad_norm;     /* before clipping                                                        */
    int skipped;          /* 1: the loss or gradient was not finite and --skip-nonfinite dropped the step */
    float lr;
    double
        *expert_tokens; /* [L * E] global top-k assignments per (layer, expert) before capacity, summed over the step */
} moe_step_result;

typedef struct {
    moe_train_options opt;
    const moe_parallel *par;
    moe_ranks ranks;
    /* the run's identity in checkpoint manifests: made fresh by moe_trainer_create (the same on every rank),
     * taken over by moe_checkpoint_resume when it continues a run; parent: "" for a fresh run */
    char run_id[MOE_RUN_ID_NBYTES], parent_run_id[MOE_RUN_ID_NBYTES];
    /* the checkpoint the run started from (--resume's, --init-from's; "" for a fresh run): its saves carry its
     * tokenizer and generation files along (checkpoint/companions.h) */
    char source_dir[4096];
    /* where warnings that stop nothing go (an unreadable old checkpoint passed over); NULL (the default): nowhere.
     * moe-train: world rank 0's stderr */
    FILE *notes;
    moe_model *model;
    moe_token_data *train, *val; /* the data sets (train/dataloader.h) */
    double data_open_s;          /* this rank's seconds to open both (headers checked, shards mapped)        */
    moe_data_order order;        /* the training sequences' order: --shuffle, keyed by --seed */
    /* the data position: the first micro-batch of step data_step + 1 begins at global sequence data_windows_done
     * (0 and 0 for a fresh run; a resume takes them from the checkpoint) */
    int64_t data_windows_done;
    int data_step;
    /* AdamW updates applied so far: a step dropped by --skip-nonfinite applies none, so the next update's bias
     * correction counts t = optimizer_updates + 1 (it counted the dropped steps too until 2026-12-07: a probe). A
     * resume takes it from the training state ("optimizer_updates"; absent in an older one: its step) */
    int64_t optimizer_updates;
    char *data_meta_text; /* the strings of a checkpoint's data metadata (train/checkpoint_run.c) */
    char data_note[1024]; /* a resume that continued on changed data says how here ("" : none); moe-train prints it */
    /* AdamW state: the moments of what this rank updates (models/optimizer.h): without ZeRO its whole dense and
     * expert regions; with it, its ranges of them (models/zero.h: about 1/W of the dense region, 1/dp of its expert
     * region), and the updated parameters are all-gathered over each group after the step. */
    moe_real *moment1, *moment2; /* the model runtime's memory */
    moe_real *grad_accum;        /* with shards and micro-batches: the step's gradient sum so far (model runtime) */
    int *inputs, *targets;       /* [local_seqs * S] */
    int *step_tokens;            /* [2][micro_batches][local_seqs * S]: a step's inputs, then its targets */
    int step_loaded;             /* the step whose tokens step_tokens holds; 0: none */
    /* the next step's tokens, read on a thread while this step computes (train/batch_reader.h), into next_tokens
     * (as step_tokens); next_step: the step they are read for, 0: none */
    int *next_tokens;
    int next_step;
    moe_batch_prefetch prefetch;
    int local_seqs;              /* batch / the ranks of a pipeline stage */
    moe_stage_runner runner;     /* this stage's schedule over the model (models/stage_runner.h) */
    double *mb_loss;             /* [micro_batches]: this rank's loss sum of each micro-batch of the step */
    double *layer_terms;         /* [micro_batches][L][2]: the aux and z losses of this stage's MoE layers */
    moe_lr_schedule schedule;
    /* routing traces (train/routing_trace.h): world rank 0 writes, every rank replays */
    moe_routing_trace trace_out, trace_in;
    /* world rank 0's first failed write of the routing trace (a full disk): the step goes on without the trace, and
     * the caller stops the run at the step's end (moe-train: after a checkpoint); "" while none */
    char output_error[512];
    int num_moe_layers;
    int *trace_ids;              /* [num_moe_layers][global tokens * k] */
    /* in-memory routing (train/verify.h), [micro_batches][num_moe_layers][global tokens * k], NULL: off:
     * every micro-batch's global choices gathered into routing_record, or forced from routing_replay */
    int *routing_record;
    const int *routing_replay;
} moe_trainer;

/* Loads and checks both token files (a bad file is the failure message of every rank that sees it, and
 * every rank returns the same failure), creates the model on rt (NULL: the CPU) and par, and initialises it
 * from opt->seed. */
moe_status moe_trainer_create(moe_trainer *t, const moe_train_options *opt, moe_runtime *rt, const moe_parallel *par);
void moe_trainer_destroy(moe_trainer *t);

/* What code that drives a trainer needs of its options, and no more (train/verify.h): the architecture, the
 * step's batch and the pipeline's cut. Points into t. */
typedef struct {
    const moe_model_config *config;
    int batch, micro_batches; /* global sequences per micro-batch; micro-batches per step */
    int pp, virtual_stages;   /* pipeline stages, model chunks per stage */
} moe_trainer_shape;
moe_trainer_shape moe_trainer_shape_of(const moe_trainer *t);

/* A twin of run for checking it (--verify-steps): run's options in fp32, on the CPU runtime and layout par,
 * writing no routing trace (it replays whatever run replays), created and initialised as moe_trainer_create does. */
moe_status moe_trainer_create_reference(moe_trainer *ref, const moe_trainer *run, const moe_parallel *par);

/* One optimizer step (1-based): moe_trainer_compute then moe_trainer_apply. r->expert_tokens must hold L * E
 * doubles. Collective. */
moe_status moe_trainer_step(moe_trainer *t, int step, moe_step_result *r);
/* The step's micro-batches (forward, backward), the gradient reduction and the step's statistics in r. A
 * forward ended by a non-finite router logit (on every rank alike) goes to the non-finite guard below: the
 * run stops with where it began, or with --skip-nonfinite the step is dropped (r->skipped = 1). */
moe_status moe_trainer_compute(moe_trainer *t, int step, moe_step_result *r);
/* The gradient norm, then the non-finite guard: a NaN or Inf in the loss or the norm on any rank stops the run
 * with MOE_ERR_NONFINITE and one message on every rank naming where it first appeared (the weights, the layer,
 * op and expert of a checked re-run of the step, the router, or the gradients) — or, with --skip-nonfinite,
 * drops the step's gradients (r->skipped = 1, the message recorded) — before anything is applied. Then
 * clipping, AdamW, the ZeRO gather, the bias update, and a check that the updated weights are finite.
 * Collective. */
moe_status moe_trainer_apply(moe_trainer *t, int step, moe_step_result *r);

/* The global sequence number of the first sequence of micro-batch mb (0-based) of step (1-based). */
int64_t moe_trainer_first_sequence(const moe_trainer *t, int step, int mb);

/* Mean validation loss over the first moe_trainer_eval_sequences sequences of the validation file. */
moe_status moe_trainer_evaluate(moe_trainer *t, double *val_loss);
/* The validation sequences an evaluation asks for: eval_batches global batches (batch x micro_batches sequences each),
 * so that a step's split into micro-batches does not change the validation loss (a probe: --batch 16 and --batch 8
 * --micro-batches 2 trained alike and validated on 64 and 32 sequences). */
long moe_trainer_eval_wanted(const moe_trainer *t);
/* The validation sequences an evaluation reads: distinct windows only (never the file wrapped around), so
 * min(moe_trainer_eval_wanted, windows in the file), cut to whole micro-batches plus a last one whose size is a
 * multiple of the world size (every rank reads as many). moe_trainer_create refuses a file with fewer windows than
 * ranks. */
long moe_trainer_eval_sequences(const moe_trainer *t);

/* The moments in the unsharded layout [dense | experts], on the host (collective under ZeRO). */
moe_status moe_trainer_moments_gather(moe_trainer *t, int which, moe_real *full);
/* One range [offset, offset + count) of the `which` moment (0: first, 1: second) in the unsharded layout, into the
 * host dst: what a checkpoint writer takes one tensor at a time. The range must lie in the dense part or in the
 * experts' (a tensor does). Under ZeRO a range is spread over the ranks' slices: every rank of the region's group
 * calls with the same range (collective over it; each gets the whole range); else nothing is exchanged. */
moe_status moe_trainer_moment_range(moe_trainer *t, int which, size_t offset, size_t count, moe_real *dst);
/* The reverse, what a checkpoint loader does one tensor at a time: the range's values from the host src into this
 * rank's moments (under ZeRO, only the part in this rank's range is kept). Local. */
moe_status moe_trainer_moment_range_set(moe_trainer *t, int which, size_t offset, size_t count, const moe_real *src);
moe_status moe_trainer_moments_set(moe_trainer *t, int which, const moe_real *full);

/* logits [S, V] of validation sequence 0 (the file's first S tokens); every rank computes them. Routed without a
 * capacity limit, as the samples below (inference: a sequence's logits depend on its own tokens only, on any layout,
 * as transformers computes them). */
moe_status moe_trainer_validation_logits(moe_trainer *t, moe_real *logits);

/* Continues `text` (*n tokens, capacity max_n) to max_n tokens, *n counting them; every rank gets the same tokens.
 * temperature 0: greedy. stop (may be NULL), asked after each token, ends it early where nonzero: collective, it must
 * answer alike on every rank (moe-train's: a stop signal, agreed). Collective. */
moe_status moe_trainer_sample(moe_trainer *t, int *text, int *n, int max_n, float temperature, unsigned long long seed,
                              int (*stop)(void *arg), void *arg);

#endif
