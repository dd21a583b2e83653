/* train_options.c — the flag table of moe-train, its parser and printer. */
#include "models/train_options.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

typedef enum { OPT_INT, OPT_FLOAT, OPT_STRING, OPT_CHOICE } opt_kind;

typedef struct {
    const char *name, *help;
    opt_kind kind;
    size_t offset;           /* into moe_train_options */
    double lo, hi;           /* numeric range */
    const char *choices[3];  /* OPT_CHOICE: the words; the value stored is the index */
    const char *implicit;    /* OPT_STRING: the value when the flag is given without one */
} opt_spec;

#define OFF(field) offsetof(moe_train_options, field)
static const opt_spec kOptions[] = {
    /* model */
    {"--layers", "decoder layers", OPT_INT, OFF(model.num_layers), 1, 256, {0}, NULL},
    {"--d-model", "model width", OPT_INT, OFF(model.d_model), 2, 65536, {0}, NULL},
    {"--heads", "attention heads (head_dim = d_model / heads, even)", OPT_INT, OFF(model.num_heads), 1, 1024, {0}, NULL},
    {"--kv-heads", "key/value heads (< heads: grouped-query attention; auto: --heads)", OPT_INT, OFF(model.num_kv_heads), 1, 1024, {0}, NULL},
    {"--d-ff", "hidden width of each expert and of dense FFNs", OPT_INT, OFF(model.d_ff), 1, 1 << 20, {0}, NULL},
    {"--vocab", "vocabulary size (256: bytes)", OPT_INT, OFF(model.vocab_size), 2, 65536, {0}, NULL},
    {"--seq-len", "tokens per sequence", OPT_INT, OFF(model.seq_len), 1, 1 << 16, {0}, NULL},
    {"--tie-embeddings", "1: lm_head shares the embedding matrix", OPT_INT, OFF(model.tie_embeddings), 0, 1, {0}, NULL},
    {"--rope-theta", "RoPE base", OPT_FLOAT, OFF(model.rope_theta), 1, 1e9, {0}, NULL},
    /* experts */
    {"--experts", "experts per MoE layer (1: a dense model)", OPT_INT, OFF(model.moe.num_experts), 1, 4096, {0}, NULL},
    {"--top-k", "experts per token", OPT_INT, OFF(model.moe.top_k), 1, 4096, {0}, NULL},
    {"--ep", "expert-parallel size (divides the world size and --experts)", OPT_INT, OFF(model.moe.ep_size), 1, 4096, {0}, NULL},
    {"--score", "router score function", OPT_CHOICE, OFF(model.moe.score_func), 0, 0, {"softmax", "sigmoid"}, NULL},
    {"--capacity-factor", "slots per expert = ceil(cf * tokens * k / E); <= 0: dropless", OPT_FLOAT,
     OFF(model.moe.capacity_factor), -1, 1e6, {0}, NULL},
    {"--renormalize", "1: gates divided by their sum over the k chosen (Mixtral); -1: 1 when k > 1, else 0", OPT_INT,
     OFF(model.moe.renormalize), -1, 1, {0}, NULL},
    {"--drop-priority", "which assignments an overflowing expert keeps", OPT_CHOICE, OFF(model.moe.drop_priority), 0, 0,
     {"token", "score"}, NULL},
    {"--aux-loss-coef", "load-balancing loss coefficient", OPT_FLOAT, OFF(model.moe.aux_loss_coef), 0, 1e3, {0}, NULL},
    {"--z-loss-coef", "router z-loss coefficient", OPT_FLOAT, OFF(model.moe.z_loss_coef), 0, 1e3, {0}, NULL},
    {"--bias-update-rate", "sigmoid routing: aux-loss-free bias step", OPT_FLOAT, OFF(model.moe.bias_update_rate), 0, 1e3,
     {0}, NULL},
    {"--moe-every", "every n-th FFN is an MoE layer, the others dense", OPT_INT, OFF(model.moe_every), 1, 256, {0}, NULL},
    {"--layout-invariant", "1: results bitwise independent of ep/world size (slower)", OPT_INT,
     OFF(model.moe.layout_invariant), 0, 1, {0}, NULL},
    {"--precision", "GEMM inputs of the experts and dense layers (fp32 masters, accumulation and router either way; "
     "auto: bf16 on cuda, fp32 on cpu)", OPT_CHOICE, OFF(model.moe.precision), 0, 0, {"fp32", "bf16"}, NULL},
    /* training */
    {"--batch", "global sequences per micro-batch (divisible by the world size)", OPT_INT, OFF(batch), 1, 1 << 20, {0}, NULL},
    {"--micro-batches", "micro-batches accumulated per step", OPT_INT, OFF(micro_batches), 1, 1 << 16, {0}, NULL},
    {"--steps", "optimizer steps", OPT_INT, OFF(steps), 1, 1 << 30, {0}, NULL},
    {"--lr", "peak learning rate", OPT_FLOAT, OFF(lr), 0, 10, {0}, NULL},
    {"--min-lr", "learning rate at the last step (cosine decay)", OPT_FLOAT, OFF(min_lr), 0, 10, {0}, NULL},
    {"--warmup", "linear warm-up steps (auto: min(100, --steps / 10))", OPT_INT, OFF(warmup), 0, 1 << 30, {0}, NULL},
    {"--weight-decay", "AdamW weight decay (not on norms)", OPT_FLOAT, OFF(weight_decay), 0, 10, {0}, NULL},
    {"--clip", "clip the global gradient norm to this (0: off)", OPT_FLOAT, OFF(clip), 0, 1e6, {0}, NULL},
    {"--beta1", "AdamW beta1", OPT_FLOAT, OFF(beta1), 0, 0.999999, {0}, NULL},
    {"--beta2", "AdamW beta2", OPT_FLOAT, OFF(beta2), 0, 0.999999, {0}, NULL},
    {"--seed", "seed of the weights and of sampling", OPT_INT, OFF(seed), 0, 2147483647, {0}, NULL},
    {"--zero", "1: ZeRO-1, shard the dense parameters' AdamW state over the ranks (same results)", OPT_INT, OFF(zero), 0,
     1, {0}, NULL},
    {"--skip-nonfinite", "1: drop a step whose loss or gradient is NaN or Inf (and say where it appeared) instead of "
     "stopping the run", OPT_INT, OFF(skip_nonfinite), 0, 1, {0}, NULL},
    {"--threads", "CPU threads per rank, shared by the loops and the GEMMs; never changes results (0: the CPUs this "
     "rank may use / ranks on this node)", OPT_INT, OFF(threads), 0, 4096, {0}, NULL},
    {"--device", "where the model runs: cpu, or cuda (one GPU per rank on its node; needs a CUDA build)", OPT_CHOICE,
     OFF(device), 0, 0, {"cpu", "cuda"}, NULL},
    {"--gpu-transport", "with --device cuda: how tokens and gradients travel (auto: nccl, or mpi when ranks share a "
     "GPU)", OPT_CHOICE, OFF(gpu_transport), 0, 0, {"nccl", "mpi"}, NULL},
    {"--verify-steps", "the first N steps are also computed by the CPU fp32 reference from the same weights and "
     "batch, compared (loss, grad norm, routing, every gradient) and the run stopped outside the tolerances "
     "(docs/GPU.md)", OPT_INT, OFF(verify_steps), 0, 1 << 20, {0}, NULL},
    /* data and output */
    {"--train-data", "training token file (llm.c .bin)", OPT_STRING, OFF(train_data), 0, 0, {0}, NULL},
    {"--val-data", "validation token file (llm.c .bin)", OPT_STRING, OFF(val_data), 0, 0, {0}, NULL},
    {"--eval-interval", "validation every N steps (0: only at the end)", OPT_INT, OFF(eval_interval), 0, 1 << 30, {0}, NULL},
    {"--eval-batches", "micro-batches of validation data per evaluation (each a forward pass of --batch sequences)",
     OPT_INT, OFF(eval_batches), 1, 1 << 16, {0}, NULL},
    {"--log-file", "JSON-lines metrics file ('' : none)", OPT_STRING, OFF(log_file), 0, 0, {0}, NULL},
    {"--sample-tokens", "tokens sampled at the end (0: none; each a forward pass of up to --seq-len tokens)", OPT_INT,
     OFF(sample_tokens), 0, 1 << 16, {0}, NULL},
    {"--sample-prompt", "text the samples start from", OPT_STRING, OFF(sample_prompt), 0, 0, {0}, NULL},
    {"--sample-temperature", "sampling temperature (0: greedy)", OPT_FLOAT, OFF(sample_temperature), 0, 100, {0}, NULL},
    {"--exchange-timeout", "seconds before a stuck exchange aborts the job", OPT_FLOAT, OFF(exchange_timeout_s), 1, 1e6,
     {0}, NULL},
    /* checkpoints */
    {"--checkpoint-dir", "save checkpoints (step-NNNNNNNN directories) here ('': never)", OPT_STRING, OFF(checkpoint_dir),
     0, 0, {0}, NULL},
    {"--checkpoint-interval", "save every N steps and at the end (0: at the end only)", OPT_INT, OFF(checkpoint_interval),
     0, 1 << 30, {0}, NULL},
    {"--keep-last", "checkpoints of this run kept, newest first (0: all)", OPT_INT, OFF(keep_last), 0, 1 << 20, {0},
     NULL},
    {"--checkpoint-timeout", "seconds the other ranks wait for rank 0 to write a checkpoint", OPT_FLOAT,
     OFF(checkpoint_timeout_s), 1, 1e7, {0}, NULL},
    {"--resume", "continue a run from a checkpoint directory, or (no value) the latest in --checkpoint-dir", OPT_STRING,
     OFF(resume), 0, 0, {0}, "latest"},
    {"--init-from", "start from the weights of a checkpoint directory (fresh optimizer)", OPT_STRING, OFF(init_from), 0,
     0, {0}, NULL},
    {"--eval-only", "1: print the validation loss of the (loaded) weights and stop", OPT_INT, OFF(eval_only), 0, 1, {0}, NULL},
    {"--routing-trace-out", "write each training step's routing (every token's experts) to this file", OPT_STRING,
     OFF(routing_trace_out), 0, 0, {0}, NULL},
    {"--routing-trace-in", "replay: take the routing from this trace instead of the routers", OPT_STRING,
     OFF(routing_trace_in), 0, 0, {0}, NULL},
    {"--dump-logits", "with --eval-only: write validation sequence 0's logits (float32 [S, V]) here", OPT_STRING,
     OFF(dump_logits), 0, 0, {0}, NULL},
};
#define NUM_OPTIONS (sizeof kOptions / sizeof kOptions[0])

/* Messages go to err; ranks other than 0 pass NULL and stay quiet. */
static void complain(FILE *err, const char *fmt, ...) {
    if (!err) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(err, fmt, ap);
    va_end(ap);
}

static void set_defaults(moe_train_options *o) {
    memset(o, 0, sizeof *o);
    o->model = moe_model_config_default();
    o->model.moe.renormalize = -1; /* decided once --top-k is known */
    o->model.moe.precision = -1;   /* decided once --device is known */
    o->model.num_kv_heads = -1;    /* --heads unless given */
    o->batch = 16, o->micro_batches = 1, o->steps = 400;
    o->lr = 3e-3f, o->min_lr = 3e-4f, o->warmup = -1, o->weight_decay = 0.1f, o->clip = 1.0f;
    o->device = MOE_TRAIN_DEVICE_CPU, o->gpu_transport = -1, o->verify_steps = 0;
    o->beta1 = 0.9f, o->beta2 = 0.95f, o->seed = 1337;
    o->train_data = "data/kjv_train.bin", o->val_data = "data/kjv_val.bin", o->log_file = "";
    o->eval_interval = 50, o->eval_batches = 4;
    o->sample_tokens = 200, o->sample_prompt = "And God said", o->sample_temperature = 0.8f;
    o->exchange_timeout_s = 300;
    o->checkpoint_dir = "", o->checkpoint_interval = 0, o->keep_last = 3, o->checkpoint_timeout_s = 3600;
    o->resume = "", o->init_from = "", o->eval_only = 0, o->dump_logits = "";
    o->routing_trace_out = "", o->routing_trace_in = "";
}

static const opt_spec *find(const char *name) {
    for (size_t i = 0; i < NUM_OPTIONS; i++)
        if (!strcmp(kOptions[i].name, name)) return &kOptions[i];
    return NULL;
}

static int set_value(const opt_spec *s, const char *v, moe_train_options *o, FILE *err) {
    void *field = (char *)o + s->offset;
    char *end;
    errno = 0;
    if (s->kind == OPT_STRING) {
        *(const char **)field = v;
        return 0;
    }
    if (s->kind == OPT_CHOICE) {
        for (int c = 0; c < 3 && s->choices[c]; c++)
            if (!strcmp(v, s->choices[c])) return *(int *)field = c, 0;
        complain(err, "moe-train: %s must be %s or %s, got '%s'\n", s->name, s->choices[0], s->choices[1], v);
        return -1;
    }
    double x = s->kind == OPT_INT ? (double)strtol(v, &end, 10) : strtod(v, &end);
    if (errno || end == v || *end || !isfinite(x) || x < s->lo || x > s->hi) {
        complain(err, "moe-train: %s expects %s in [%g, %g], got '%s'\n", s->name,
                s->kind == OPT_INT ? "an integer" : "a number", s->lo, s->hi, v);
        return -1;
    }
    if (s->kind == OPT_INT) *(int *)field = (int)x;
    else *(float *)field = (float)x;
    return 0;
}

/* Combinations no single flag can check. */
static int check_combinations(moe_train_options *o, int world_size, FILE *err) {
    moe_model_config *m = &o->model;
    m->moe.d_model = m->d_model, m->moe.d_ff = m->d_ff;
    if (m->moe.renormalize < 0) m->moe.renormalize = m->moe.top_k > 1; /* k = 1: the gate must stay the probability */
    if ((int)m->moe.precision < 0) m->moe.precision = o->device == MOE_TRAIN_DEVICE_CUDA ? MOE_PRECISION_BF16 : MOE_PRECISION_FP32;
    if (m->num_kv_heads < 0) m->num_kv_heads = m->num_heads; /* plain multi-head attention unless asked */
    if (o->warmup < 0) o->warmup = o->steps / 10 < 100 ? o->steps / 10 : 100; /* min(100, steps / 10) */
    if (o->gpu_transport >= 0 && o->device != MOE_TRAIN_DEVICE_CUDA)
        return complain(err, "moe-train: --gpu-transport needs --device cuda\n"), -1;
    if (o->device == MOE_TRAIN_DEVICE_CUDA && m->moe.precision == MOE_PRECISION_FP32)
        return complain(err, "moe-train: --device cuda runs the experts in bf16 only (fp32 CUDA experts are not "
                             "written yet): drop --precision fp32 (bf16 is the default on cuda)\n"), -1;
    const char *problem = moe_model_config_problem(m);
    if (problem) return complain(err, "moe-train: invalid model: %s\n", problem), -1;
    if (world_size % m->moe.ep_size)
        return complain(err, "moe-train: --ep %d must divide the number of ranks (%d)\n", m->moe.ep_size, world_size), -1;
    if (o->batch % world_size)
        return complain(err, "moe-train: --batch %d must be divisible by the number of ranks (%d)\n", o->batch,
                       world_size), -1;
    /* the trainer, the layer and the routing trace count a micro-batch's tokens and routing choices in an int */
    const long long choices = (long long)o->batch * m->seq_len * m->moe.top_k;
    if (choices > INT_MAX)
        return complain(err, "moe-train: --batch %d * --seq-len %d * --top-k %d = %lld routing choices per micro-batch, "
                        "more than %d\n", o->batch, m->seq_len, m->moe.top_k, choices, INT_MAX), -1;
    if (o->min_lr > o->lr) return complain(err, "moe-train: --min-lr %g exceeds --lr %g\n", o->min_lr, o->lr), -1;
    if (o->warmup > o->steps) return complain(err, "moe-train: --warmup %d exceeds --steps %d\n", o->warmup, o->steps), -1;
    if (!*o->train_data || !*o->val_data) return complain(err, "moe-train: --train-data and --val-data are required\n"), -1;
    if (*o->resume && *o->init_from)
        return complain(err, "moe-train: --resume and --init-from exclude each other (resume restores the weights too)\n"), -1;
    if (!strcmp(o->resume, "latest") && !*o->checkpoint_dir)
        return complain(err, "moe-train: --resume latest needs --checkpoint-dir\n"), -1;
    if (*o->dump_logits && !o->eval_only) return complain(err, "moe-train: --dump-logits needs --eval-only 1\n"), -1;
    if (*o->routing_trace_out && *o->resume)
        return complain(err, "moe-train: --routing-trace-out records a run from step 1; it cannot be combined with --resume\n"), -1;
    return 0;
}

int moe_train_options_parse(int argc, char **argv, int world_size, moe_train_options *o, FILE *err) {
    set_defaults(o);
    const char *given[NUM_OPTIONS] = {0}; /* the value of each flag seen: a second one is an error, not a winner */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            if (err) moe_train_options_usage(stdout);
            return 1;
        }
        const opt_spec *s = find(argv[i]);
        if (!s) return complain(err, "moe-train: unknown flag '%s' (see --help)\n", argv[i]), -1;
        int has_value = i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0;
        if (!has_value && !s->implicit) return complain(err, "moe-train: %s needs a value\n", argv[i]), -1;
        const char *value = has_value ? argv[++i] : s->implicit;
        const char **seen = &given[s - kOptions];
        if (*seen)
            return complain(err, "moe-train: %s given twice ('%s', then '%s'): give it once\n", s->name, *seen, value),
                   -1;
        *seen = value;
        if (set_value(s, value, o, err)) return -1;
    }
    return check_combinations(o, world_size, err);
}

static void print_value(const opt_spec *s, const moe_train_options *o, FILE *f) {
    const void *field = (const char *)o + s->offset;
    switch (s->kind) {
    case OPT_INT: /* a negative default is decided from other flags (see check_combinations) */
        if (*(const int *)field < 0) fprintf(f, "auto");
        else fprintf(f, "%d", *(const int *)field);
        break;
    case OPT_FLOAT: fprintf(f, "%g", *(const float *)field); break;
    case OPT_STRING: fprintf(f, "'%s'", *(const char *const *)field); break;
    case OPT_CHOICE: fprintf(f, "%s", *(const int *)field < 0 ? "auto" : s->choices[*(const int *)field]); break;
    }
}

void moe_train_options_usage(FILE *f) {
    moe_train_options d;
    set_defaults(&d);
    fprintf(f, "usage: mpirun -np N moe-train [flags]\n"
               "Trains a Mixtral-architecture MoE language model on llm.c token files.\n\n");
    for (size_t i = 0; i < NUM_OPTIONS; i++) {
        fprintf(f, "  %-22s %s (default ", kOptions[i].name, kOptions[i].help);
        print_value(&kOptions[i], &d, f);
        fprintf(f, ")\n");
    }
}

void moe_train_options_print(const moe_train_options *o, FILE *f) {
    fprintf(f, "configuration:\n");
    for (size_t i = 0; i < NUM_OPTIONS; i++) {
        fprintf(f, "  %-22s ", kOptions[i].name);
        print_value(&kOptions[i], o, f);
        fprintf(f, "\n");
    }
}

moe_train_memory moe_train_options_memory(const moe_train_options *o, int world_size) {
    const moe_model_footprint f = moe_model_config_footprint(&o->model, o->batch / world_size);
    const double r = sizeof(moe_real), dense_moments = o->zero ? (double)f.dense_params / world_size : f.dense_params;
    moe_train_memory m = {.params = 2 * r * (double)(f.dense_params + f.expert_params),
                          .moments = 2 * r * (dense_moments + (double)f.expert_params),
                          .activations = (double)f.activation_bytes};
    m.total = m.params + m.moments + m.activations;
    return m;
}
