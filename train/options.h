/* train/options.h — moe-train's flags: one table gives parsing, validation, --help, the printed configuration
 * and the keys of a --config file (train/config.h), so a new flag is one line. */
#ifndef MOE_TRAIN_OPTIONS_H
#define MOE_TRAIN_OPTIONS_H

#include <stdio.h>

#include "models/model.h"

enum { MOE_TRAIN_DEVICE_CPU = 0, MOE_TRAIN_DEVICE_CUDA = 1 };
enum { MOE_TRAIN_MAX_OPTIONS = 128 };

/* Where an option's value came from, weakest first. A stronger source overrides a weaker one, except that a
 * checkpoint's architecture (config.json) never gives way: a config file or flag that disagrees is an error. */
typedef enum {
    MOE_OPTION_DEFAULT = 0,
    MOE_OPTION_SAVED_RUN,   /* --resume: the configuration the checkpoint's run trained with */
    MOE_OPTION_CHECKPOINT,  /* --init-from / --resume / --eval-only: the checkpoint's config.json */
    MOE_OPTION_CONFIG_FILE, /* --config FILE */
    MOE_OPTION_FLAG,        /* the command line */
} moe_option_source;

typedef struct {
    moe_model_config model;
    /* training */
    int batch;          /* global sequences per micro-batch; divisible by the world size */
    int micro_batches;  /* gradient accumulation steps per optimizer step                */
    int steps;
    float lr, min_lr, weight_decay, clip, beta1, beta2, adam_eps;
    int warmup;
    int seed;
    int zero;           /* 0-2: ZeRO-1 shards the AdamW state, ZeRO-2 the gradients too (models/zero.h) */
    /* the layout (pipeline/grid.h's rank grid; the model config holds none of it, models/model.h) */
    int pp;             /* pipeline stages: each of world / pp ranks holds layers / pp layers (or the ends theirs) */
    int tp;             /* tensor-parallel ranks: groups of tp consecutive ranks of a stage split the dense layers */
    int ep;             /* expert-parallel ranks: each holds experts / ep experts of every MoE layer           */
    int virtual_stages; /* model chunks per pipeline rank (interleaved 1F1B); 1: 1F1B                          */
    int first_stage_layers, last_stage_layers; /* the first and last pipeline stages' layers (0: an equal share;
                                                  models/model.h's moe_pipeline_split) */
    int world_invariant; /* 1: every sum over the batch per virtual shard, in one fixed tree (model.moe.num_shards =
                            shards, the default); 0: per rank, then the transport's all-reduce */
    int shards;         /* the batch's virtual shards with world_invariant; -1 (auto): the largest power of two that
                           divides --batch, at most 64 (and at least the world size)                         */
    int skip_nonfinite; /* 1: drop a step whose loss or gradient is not finite, instead of stopping */
    int max_skipped_steps; /* with skip_nonfinite: the run stops after this many consecutive dropped steps */
    int threads;        /* CPU threads per rank (core/threads.h); 0: moe_threads_default()          */
    int device;         /* MOE_TRAIN_DEVICE_*: where the model runs                                 */
    int gpu_transport;  /* with --device cuda: moe_gpu_transport (0 NCCL, 1 MPI-staged); -1: NCCL unless
                           ranks share a GPU                                                         */
    int verify_steps;   /* the first N steps also computed by the CPU fp32 reference (train/verify.h) */
    /* data, evaluation, output */
    const char *train_data, *val_data, *log_file; /* data sets: files, globs, comma-separated (train/dataloader.h) */
    int shuffle;           /* 1: the training windows in a seeded permutation per epoch (train/data_order.h) */
    int allow_data_change; /* 1: --resume continues on a changed data set (the window counter kept) */
    int eval_interval, eval_batches;
    int sample_tokens;
    const char *sample_prompt;
    float sample_temperature;
    float exchange_timeout_s;
    float startup_timeout_s; /* MPI_Init to the placement's end (0: --exchange-timeout's, at least 60 s) */
    const char *stop_signals; /* train/signals.h: "TERM,INT,USR1", or "none" */
    /* checkpoints */
    const char *checkpoint_dir; /* '' : no saves                                        */
    int checkpoint_interval;    /* save every N steps (and at the end); 0: at the end   */
    int keep_last;              /* step directories kept (0: all)                        */
    float checkpoint_timeout_s; /* how long a rank waits for the others' part of a save */
    const char *resume;         /* '' : fresh start; 'latest' (in checkpoint_dir) or a directory */
    int resume_auto;            /* 1: --resume auto, resolved to 'latest' or '' (--print-config writes auto back) */
    const char *init_from;      /* weights only, from a checkpoint directory              */
    int save_dtype;             /* 0: F32 (the masters), 1: BF16 (an export: not resumable) */
    const char *save_shard_size; /* '' : one model.safetensors; else a byte count (moe_parse_nbytes) */
    long long save_shard_nbytes; /* save_shard_size parsed; 0: one file                   */
    int eval_only;              /* 1: print the validation loss of the weights and stop   */
    const char *dump_logits;    /* with eval_only: float32 logits of validation sequence 0 */
    const char *routing_trace_out; /* write every training step's routing here ('' : no)   */
    const char *routing_trace_in;  /* take the routing from this trace instead of the routers */
    const char *config_file;    /* --config: options from this JSON file ('' : none)      */
    int print_config;           /* 1: write the resolved configuration as JSON and stop    */
    int print_schedule;         /* 1: write every pipeline stage's schedule and stop       */
    unsigned char source[MOE_TRAIN_MAX_OPTIONS]; /* moe_option_source of each option, in table order */
    unsigned char derived[MOE_TRAIN_MAX_OPTIONS]; /* 1: left "auto" and decided by moe_train_options_finish */
} moe_train_options;

typedef enum { MOE_OPT_INT, MOE_OPT_FLOAT, MOE_OPT_STRING, MOE_OPT_CHOICE } moe_train_option_kind;
/* What an option is part of: the run (inherited by --resume, written by --print-config), the layout of its ranks
 * (--ep, --pp, --virtual-stages, --tp, --zero, --threads: written by --print-config and recorded with the run, never
 * inherited: a checkpoint resumes at any layout, and a layout is what the resuming job was given), the command
 * (written by --print-config, never inherited: --resume, --eval-only, ...), or the command line only (--config,
 * --print-config). */
typedef enum {
    MOE_OPT_SCOPE_RUN,
    MOE_OPT_SCOPE_LAYOUT,
    MOE_OPT_SCOPE_COMMAND,
    MOE_OPT_SCOPE_FLAG_ONLY
} moe_train_option_scope;

/* One row of the flag table. A config file's key is the flag without its dashes, '-' as '_' (--d-model: d_model). */
enum { MOE_OPT_MAX_CHOICES = 8 };

typedef struct {
    const char *name, *help;
    moe_train_option_kind kind;
    size_t offset;           /* into moe_train_options */
    double lo, hi;           /* numeric range */
    const char *choices[MOE_OPT_MAX_CHOICES]; /* MOE_OPT_CHOICE: the words; the value stored is the index */
    const char *implicit;    /* the value when the flag is given without one (NULL: a value is required) */
    moe_train_option_scope scope;
} moe_train_option;

/* The table, in --help order; *count gets its length. */
const moe_train_option *moe_train_option_table(int *count);
/* The row whose stored value lives at offsetof(moe_train_options, ...) == offset, or NULL. */
const moe_train_option *moe_train_option_at(size_t offset);
/* The config-file key of an option ("d_model"), in a static buffer per row. */
const char *moe_train_option_key(const moe_train_option *s);

/* A message about the options, to err; ranks other than 0 pass NULL and stay quiet. */
void moe_train_complain(FILE *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Sets option s from text (range- and choice-checked) and records source. label names the value in a message
 * ("--lr", "run.json: lr"). Returns 0, or -1 with the message written to err (NULL: quiet). */
int moe_train_option_set(moe_train_options *o, const moe_train_option *s, const char *text, moe_option_source source,
                         const char *label, FILE *err);
/* 1 when the option's default is decided from others (negative: "auto", which moe_train_option_set takes). */
int moe_train_option_has_auto(const moe_train_option *s);
/* 1 when the option's value in o is "auto", not decided yet (a negative int, choice or float: --min-lr's). */
int moe_train_option_undecided(const moe_train_options *o, const moe_train_option *s);
/* 1 when the option's current value is its default (an undecided "auto" included). */
int moe_train_option_is_default(const moe_train_options *o, const moe_train_option *s);
/* 1 when the option's current value came from source or a stronger one. */
int moe_train_option_from(const moe_train_options *o, const moe_train_option *s, moe_option_source source);

/* Defaults, then argv's flags (each recorded as MOE_OPTION_FLAG). Returns 0, 1 when --help was printed, -1 on an
 * error (message written to err naming the flag, the value and what is allowed; err NULL: quiet). */
int moe_train_options_parse_flags(int argc, char **argv, moe_train_options *o, FILE *err);
/* Decides the automatic values (renormalize, precision, kv heads, warmup, shards, world-invariant; each marked in
 * o->derived) and checks the combinations no single option can check, some of which depend on world_size (ep,
 * batch). Returns 0 or -1 (message to err). */
int moe_train_options_finish(moe_train_options *o, int world_size, FILE *err);
/* The options' pipeline cut: --pp, --virtual-stages, --first-stage-layers, --last-stage-layers. */
moe_pipeline_split moe_train_pipeline_split(const moe_train_options *o);

/* moe_train_options_parse_flags, then moe_train_options_finish: flags alone, no --config file and no checkpoint
 * (moe-train itself uses moe_train_options_load, train/config.h). */
int moe_train_options_parse(int argc, char **argv, int world_size, moe_train_options *o, FILE *err);

void moe_train_options_print(const moe_train_options *o, FILE *f);
/* Option s's value as text: 12, 0.003, cpu, 'path' (quoted: quote_strings), auto for an undecided negative. */
void moe_train_option_format(const moe_train_options *o, const moe_train_option *s, int quote_strings, char *out,
                             size_t nbytes);

/* The memory one rank needs for a parsed configuration on world_size ranks, in bytes, by moe-plan's memory model
 * (models/plan_model.h, which follows what models/model.c and moe/layer.c allocate): parameters, their gradients and
 * bf16 copies; the AdamW moments (under ZeRO-1 the dense ones / W, the experts' / dp); the activations the model
 * keeps with each MoE layer's routing, expert and exchange buffers (--recompute: what is rebuilt, once); the process
 * and the gradient sum's scratch (the tree's half of the larger region, or without --world-invariant the
 * transport's whole region) and the CPU GEMMs' scratch. An estimate, within 8% of the measured peak RSS on the CPU
 * runs of docs/BENCHMARKS.md except under bf16 (14-22% below); it assumes balanced routing (the busiest rank's experts
 * get more rows). */
typedef struct {
    double params, moments, activations;
    double process; /* the process itself (MOE_TRAIN_PROCESS_BYTES) and the gradient sum's scratch on the CPU */
    double total;
} moe_train_memory;
/* An empty model's peak RSS per rank (moe-train --layers 1 --d-model 8, 2 ranks, 2026-11-26: 227-233 MiB): the
 * libraries, the BLAS and MPI buffers, the token files of data/. */
#define MOE_TRAIN_PROCESS_BYTES (230.0 * 1024 * 1024)
/* --sample-prompt's default; past a small --vocab it is replaced by a newline (train.c), not refused as others are */
#define MOE_TRAIN_DEFAULT_PROMPT "And God said"
moe_train_memory moe_train_options_memory(const moe_train_options *o, int world_size);
void moe_train_options_usage(FILE *f);

#endif
