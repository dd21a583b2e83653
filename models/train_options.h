/* train_options.h — moe-train's flags: one table gives parsing, validation, --help and the printed
 * configuration, so a new flag is one line. */
#ifndef MOE_MODELS_TRAIN_OPTIONS_H
#define MOE_MODELS_TRAIN_OPTIONS_H

#include <stdio.h>

#include "models/model.h"

enum { MOE_TRAIN_DEVICE_CPU = 0, MOE_TRAIN_DEVICE_CUDA = 1 };

typedef struct {
    moe_model_config model;
    /* training */
    int batch;          /* global sequences per micro-batch; divisible by the world size */
    int micro_batches;  /* gradient accumulation steps per optimizer step                */
    int steps;
    float lr, min_lr, weight_decay, clip, beta1, beta2;
    int warmup;
    int seed;
    int zero;           /* 1: ZeRO-1, the dense optimizer state sharded over the ranks */
    int skip_nonfinite; /* 1: drop a step whose loss or gradient is not finite, instead of stopping */
    int threads;        /* CPU threads per rank (core/threads.h); 0: moe_threads_default()          */
    int device;         /* MOE_TRAIN_DEVICE_*: where the model runs                                 */
    int gpu_transport;  /* with --device cuda: moe_gpu_transport (0 NCCL, 1 MPI-staged); -1: NCCL unless
                           ranks share a GPU                                                         */
    int verify_steps;   /* the first N steps also computed by the CPU fp32 reference (models/verify.h) */
    /* data, evaluation, output */
    const char *train_data, *val_data, *log_file;
    int eval_interval, eval_batches;
    int sample_tokens;
    const char *sample_prompt;
    float sample_temperature;
    float exchange_timeout_s;
    /* checkpoints */
    const char *checkpoint_dir; /* '' : no saves                                        */
    int checkpoint_interval;    /* save every N steps (and at the end); 0: at the end   */
    int keep_last;              /* step directories kept (0: all)                        */
    float checkpoint_timeout_s; /* how long the other ranks wait for rank 0's save      */
    const char *resume;         /* '' : fresh start; 'latest' (in checkpoint_dir) or a directory */
    const char *init_from;      /* weights only, from a checkpoint directory              */
    int eval_only;              /* 1: print the validation loss of the weights and stop   */
    const char *dump_logits;    /* with eval_only: float32 logits of validation sequence 0 */
    const char *routing_trace_out; /* write every training step's routing here ('' : no)   */
    const char *routing_trace_in;  /* take the routing from this trace instead of the routers */
} moe_train_options;

/* Parses argv into o (defaults first). Returns 0 on success, 1 when --help was printed, -1 on an error
 * (message already written to err, naming the flag, the value and what is allowed; err NULL: quiet,
 * for ranks other than 0). world_size checks the combinations that depend on it (ep, batch). */
int moe_train_options_parse(int argc, char **argv, int world_size, moe_train_options *o, FILE *err);

void moe_train_options_print(const moe_train_options *o, FILE *f);

/* The memory one rank needs for a parsed configuration on world_size ranks, in bytes: parameters and their
 * gradients, the AdamW moments (the dense ones 1/W of it under ZeRO-1), the activations the model keeps.
 * A lower bound: the MoE layers' routing and expert buffers and the libraries' own come on top. */
typedef struct {
    double params, moments, activations, total;
} moe_train_memory;
moe_train_memory moe_train_options_memory(const moe_train_options *o, int world_size);
void moe_train_options_usage(FILE *f);

#endif
