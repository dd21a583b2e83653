/* flag_aliases.c — other trainers' flag names and moe-train's (flag_aliases.h). */
#include "train/flag_aliases.h"

#include <string.h>

static const struct {
    const char *theirs, *ours;
} kAliases[] = {
    /* the batch: moe-train's --batch is the global sequences of one micro-batch, --micro-batches their count */
    {"--global-batch-size", "--batch x --micro-batches (--batch: the global sequences of one micro-batch)"},
    {"--micro-batch-size", "--batch, the global sequences of one micro-batch (per rank: --batch / the data ranks)"},
    {"--train-iters", "--steps"},
    {"--lr-warmup-iters", "--warmup"},
    {"--lr-decay-iters", "--steps (the cosine decays over the whole run, to --min-lr)"},
    {"--lr-decay-style", "none: the schedule is linear warm-up then cosine to --min-lr"},
    {"--clip-grad", "--clip"},
    {"--adam-beta1", "--beta1"},
    {"--adam-beta2", "--beta2"},
    {"--save", "--checkpoint-dir"},
    {"--load", "--resume DIR (the same run: optimizer state and data position) or --init-from DIR (weights only)"},
    {"--save-interval", "--checkpoint-interval"},
    {"--log-interval", "none: every step is logged (--log-file for a JSON-lines file)"},
    {"--eval-iters", "--eval-batches"},
    {"--data-path", "--train-data and --val-data (llm.c token files: docs/DATA.md)"},
    {"--num-layers", "--layers"},
    {"--hidden-size", "--d-model"},
    {"--ffn-hidden-size", "--d-ff"},
    {"--moe-ffn-hidden-size", "--d-ff"},
    {"--num-attention-heads", "--heads"},
    {"--num-query-groups", "--kv-heads"},
    {"--kv-channels", "--head-dim"},
    {"--seq-length", "--seq-len"},
    {"--max-position-embeddings", "--seq-len"},
    {"--vocab-size", "--vocab"},
    {"--num-experts", "--experts"},
    {"--moe-router-topk", "--top-k"},
    {"--moe-aux-loss-coeff", "--aux-loss-coef"},
    {"--moe-z-loss-coeff", "--z-loss-coef"},
    {"--moe-expert-capacity-factor", "--capacity-factor"},
    {"--moe-router-score-function", "--score"},
    {"--expert-model-parallel-size", "--ep"},
    {"--tensor-model-parallel-size", "--tp"},
    {"--pipeline-model-parallel-size", "--pp"},
    {"--num-layers-per-virtual-pipeline-stage", "--virtual-stages (chunks per stage)"},
    {"--use-distributed-optimizer", "--zero 1 (or 2: gradients sharded too)"},
    {"--recompute-granularity", "--recompute"},
    {"--bf16", "--precision bf16"},
    {"--fp16", "none: --precision bf16 or fp32"},
    {"--untie-embeddings-and-output-weights", "--tie-embeddings 0"},
    {"--rotary-base", "--rope-theta"},
    {"--norm-epsilon", "--norm-eps"},
    {"--init-method-std", "none: the initialisation is fixed (uniform of std 0.02; residual projections / sqrt(2 L))"},
};

const char *moe_train_flag_alias(const char *name) {
    for (size_t i = 0; i < sizeof kAliases / sizeof kAliases[0]; i++)
        if (!strcmp(name, kAliases[i].theirs)) return kAliases[i].ours;
    return NULL;
}
