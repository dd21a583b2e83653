/* train/options.c — the flag table of moe-train, its parser and printer. */
#include "train/options.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint/json_float.h"
#include "core/flag_arg.h"
#include "models/fileio.h"
#include "plan/model.h"
#include "train/flag_aliases.h"
#include "train/signals.h"

#define OPT_INT MOE_OPT_INT
#define OPT_FLOAT MOE_OPT_FLOAT
#define OPT_STRING MOE_OPT_STRING
#define OPT_CHOICE MOE_OPT_CHOICE
#define RUN MOE_OPT_SCOPE_RUN
#define LAYOUT MOE_OPT_SCOPE_LAYOUT
#define COMMAND MOE_OPT_SCOPE_COMMAND
#define FLAG_ONLY MOE_OPT_SCOPE_FLAG_ONLY
typedef moe_train_option opt_spec;

#define OFF(field) offsetof(moe_train_options, field)
static const opt_spec kOptions[] = {
    /* model */
    {"--layers", "decoder layers", OPT_INT, OFF(model.num_layers), 1, MOE_MODEL_MAX_LAYERS, {0}, NULL, RUN},
    {"--d-model", "model width", OPT_INT, OFF(model.d_model), 2, 65536, {0}, NULL, RUN},
    {"--family", "model family (models/model.h): mixtral; qwen3_moe (q/k norms per head, --head-dim its own); olmoe "
     "(q/k norms over the projections); qwen2_moe (q/k/v biases, a shared expert with a sigmoid gate); deepseek_v3 "
     "(with --kv-lora-rank: DeepseekV3ForCausalLM's names and config); deepseek_v2 (DeepSeek-V2 and V2-Lite: softmax "
     "scores, no selection bias)", OPT_CHOICE, OFF(model.family), 0, 0,
     {"mixtral", "qwen3_moe", "olmoe", "qwen2_moe", "deepseek_v3", "deepseek_v2"}, NULL, RUN},
    {"--heads", "attention heads", OPT_INT, OFF(model.num_heads), 1, 1024, {0}, NULL, RUN},
    {"--head-dim", "width of each head, even (0: d_model / heads; another value with --family qwen3_moe)", OPT_INT,
     OFF(model.head_dim), 0, 4096, {0}, NULL, RUN},
    {"--kv-heads", "key/value heads (< heads: grouped-query attention; auto: --heads)", OPT_INT, OFF(model.num_kv_heads), 1, 1024, {0}, NULL, RUN},
    {"--d-ff", "hidden width of each expert and of dense FFNs", OPT_INT, OFF(model.d_ff), 1, 1 << 20, {0}, NULL, RUN},
    {"--dense-d-ff", "hidden width of the dense FFN layers (0: --d-ff; Qwen's intermediate_size beside "
     "moe_intermediate_size)", OPT_INT, OFF(model.dense_d_ff), 0, 1 << 20, {0}, NULL, RUN},
    {"--first-dense-layers", "the first this many layers are dense (DeepSeek's first_k_dense_replace)", OPT_INT,
     OFF(model.first_dense), 0, 256, {0}, NULL, RUN},
    {"--kv-lora-rank", "multi-head latent attention (DeepSeek's MLA) with a kv latent of this rank (0: none; "
     "--head-dim = the q/k heads' width, nope + rope)", OPT_INT, OFF(model.kv_lora_rank), 0, 1 << 16, {0}, NULL, RUN},
    {"--q-lora-rank", "with --kv-lora-rank: q through a bottleneck of this rank (0: q_proj)", OPT_INT,
     OFF(model.q_lora_rank), 0, 1 << 16, {0}, NULL, RUN},
    {"--qk-rope-dim", "with --kv-lora-rank: each q/k head's RoPE columns (qk_rope_head_dim)", OPT_INT,
     OFF(model.qk_rope_dim), 0, 4096, {0}, NULL, RUN},
    {"--v-head-dim", "with --kv-lora-rank: each v head's width (<= --head-dim)", OPT_INT, OFF(model.v_head_dim), 0,
     4096, {0}, NULL, RUN},
    {"--shared-d-ff", "hidden width of a shared expert beside the routed ones in every MoE layer (0: none; gated by a "
     "sigmoid with --family qwen2_moe)", OPT_INT, OFF(model.shared_d_ff), 0, 1 << 20, {0}, NULL, RUN},
    {"--vocab", "vocabulary size (256: bytes; token ids past 65535 need uint32 token files)", OPT_INT,
     OFF(model.vocab_size), 2, 2147483647, {0}, NULL, RUN},
    {"--seq-len", "tokens per sequence", OPT_INT, OFF(model.seq_len), 1, 1 << 16, {0}, NULL, RUN},
    {"--tie-embeddings", "1: lm_head shares the embedding matrix", OPT_INT, OFF(model.tie_embeddings), 0, 1, {0}, NULL, RUN},
    {"--rope-theta", "RoPE base", OPT_FLOAT, OFF(model.rope_theta), 1, 1e9, {0}, NULL, RUN},
    /* YaRN (models/model.h; a Hugging Face config's rope_scaling of type yarn; Megatron's --rotary-scaling-factor,
     * --original-max-position-embeddings, --beta-fast/slow, --mscale, --mscale-all-dim) */
    {"--yarn-factor", "YaRN's RoPE context extension factor (0: plain RoPE; rope_scaling.factor)", OPT_FLOAT,
     OFF(model.yarn.factor), 0, 1e6, {0}, NULL, RUN},
    {"--yarn-original-positions", "with --yarn-factor: the context the model was pretrained on "
     "(original_max_position_embeddings)", OPT_INT, OFF(model.yarn.original_positions), 0, 1 << 30, {0}, NULL, RUN},
    {"--yarn-beta-fast", "with --yarn-factor: frequencies turning more often than this over the original context are "
     "kept", OPT_FLOAT, OFF(model.yarn.beta_fast), 1e-6, 1e6, {0}, NULL, RUN},
    {"--yarn-beta-slow", "with --yarn-factor: frequencies turning less often than this are interpolated", OPT_FLOAT,
     OFF(model.yarn.beta_slow), 1e-6, 1e6, {0}, NULL, RUN},
    {"--yarn-mscale", "with --yarn-factor: cos/sin scale m(factor, this) / m(factor, --yarn-mscale-all-dim) (0: not "
     "given)", OPT_FLOAT, OFF(model.yarn.mscale), 0, 1e3, {0}, NULL, RUN},
    {"--yarn-mscale-all-dim", "with --yarn-factor: see --yarn-mscale; multi-head latent attention's softmax scale "
     "also times m(factor, this)^2 (0: not given)", OPT_FLOAT, OFF(model.yarn.mscale_all_dim), 0, 1e3, {0}, NULL, RUN},
    {"--yarn-attention-factor", "with --yarn-factor: the cos/sin scale itself (0: derived from the mscales)",
     OPT_FLOAT, OFF(model.yarn.attention_factor), 0, 1e3, {0}, NULL, RUN},
    {"--norm-eps", "RMSNorm epsilon (rms_norm_eps; 1e-6 by default with --family deepseek_v3 or deepseek_v2)",
     OPT_FLOAT, OFF(model.norm_eps), 1e-12, 1, {0}, NULL, RUN},
    /* experts */
    {"--experts", "experts per MoE layer (1: a dense model)", OPT_INT, OFF(model.moe.num_experts), 1, 4096, {0}, NULL, RUN},
    {"--top-k", "experts per token", OPT_INT, OFF(model.moe.top_k), 1, 4096, {0}, NULL, RUN},
    {"--ep", "expert-parallel size (divides the world size and --experts)", OPT_INT, OFF(ep), 1, 4096, {0}, NULL, LAYOUT},
    {"--score", "router score function (sigmoid by default with --family deepseek_v3)", OPT_CHOICE,
     OFF(model.moe.score_func), 0, 0, {"softmax", "sigmoid"}, NULL, RUN},
    {"--capacity-factor", "slots per expert = ceil(cf * tokens * k / E); <= 0: dropless", OPT_FLOAT,
     OFF(model.moe.capacity_factor), -1, 1e6, {0}, NULL, RUN},
    {"--renormalize", "1: gates divided by their sum over the k chosen (Mixtral; with k = 1 the gate is 1); 0: the "
     "gate is the router's score; auto: 1 when k > 1, else 0, and 0 with --family deepseek_v2 (see "
     "docs/CHECKPOINTS.md)", OPT_INT,
     OFF(model.moe.renormalize), -1, 1, {0}, NULL, RUN},
    {"--drop-priority", "which assignments an overflowing expert keeps", OPT_CHOICE, OFF(model.moe.drop_priority), 0, 0,
     {"token", "score"}, NULL, RUN},
    {"--aux-loss-coef", "load-balancing loss coefficient", OPT_FLOAT, OFF(model.moe.aux_loss_coef), 0, 1e3, {0}, NULL, RUN},
    {"--z-loss-coef", "router z-loss coefficient", OPT_FLOAT, OFF(model.moe.z_loss_coef), 0, 1e3, {0}, NULL, RUN},
    {"--bias-update-rate", "sigmoid routing: aux-loss-free bias step", OPT_FLOAT, OFF(model.moe.bias_update_rate), 0, 1e3,
     {0}, NULL, RUN},
    {"--expert-groups", "group-limited routing (DeepSeek-V3's n_group): the experts in this many equal groups (0: "
     "none)", OPT_INT, OFF(model.moe.num_groups), 0, 64, {0}, NULL, RUN},
    {"--topk-groups", "with --expert-groups: the groups a token picks its experts from (topk_group), the best by "
     "--group-score", OPT_INT, OFF(model.moe.topk_groups), 0, 64, {0}, NULL, RUN},
    {"--group-score", "with --expert-groups: a group's score, the sum of its two best scores (top2: DeepSeek-V3's) or "
     "its best (max: DeepSeek-V2's group_limited_greedy; the default with --family deepseek_v2)", OPT_CHOICE,
     OFF(model.moe.group_score), 0, 0, {"top2", "max"}, NULL, RUN},
    {"--routed-scaling", "the gates times this after renormalisation (DeepSeek's routed_scaling_factor; 0: 1)",
     OPT_FLOAT, OFF(model.moe.routed_scaling), 0, 1e3, {0}, NULL, RUN},
    {"--moe-every", "every n-th FFN is an MoE layer, the others dense", OPT_INT, OFF(model.moe_every), 1, 256, {0}, NULL, RUN},
    {"--layout-invariant", "1: row-wise GEMMs in fixed 64-row calls, so a token's activations are bitwise independent "
     "of ep and world size (with --world-invariant 1 the whole run is)", OPT_INT, OFF(model.moe.layout_invariant), 0,
     1, {0}, NULL, RUN},
    {"--attention", "how attention runs: fused (the default: tiles with an online softmax, per head S statistics kept "
     "instead of the S x S probabilities, future tiles skipped) or materialized; the same function, rounded otherwise",
     OPT_CHOICE, OFF(model.attention), 0, 0, {"materialized", "fused"}, NULL, RUN},
    {"--recompute", "what backward recomputes instead of keeping from forward, each level including the ones before: "
     "none, attention (the attention block), moe (also the experts' and dense FFNs' SwiGLU intermediates), full (only "
     "each layer's input is kept; the layer runs again, routing reused); bitwise the same results",
     OPT_CHOICE, OFF(model.moe.recompute), 0, 0, {"none", "attention", "moe", "full"}, NULL, RUN},
    {"--precision", "GEMM inputs of the experts and dense layers (fp32 masters, accumulation and router either way; "
     "auto: bf16 on cuda, fp32 on cpu)", OPT_CHOICE, OFF(model.moe.precision), 0, 0, {"fp32", "bf16"}, NULL, RUN},
    /* training */
    {"--batch", "global sequences per micro-batch (divisible by the world size)", OPT_INT, OFF(batch), 1, 1 << 20, {0}, NULL, RUN},
    {"--micro-batches", "micro-batches accumulated per step", OPT_INT, OFF(micro_batches), 1, 1 << 16, {0}, NULL, RUN},
    {"--steps", "optimizer steps", OPT_INT, OFF(steps), 1, 1 << 30, {0}, NULL, RUN},
    {"--lr", "peak learning rate", OPT_FLOAT, OFF(lr), 0, 10, {0}, NULL, RUN},
    {"--min-lr", "learning rate at the last step (auto: --lr / 10; cosine decay after the warm-up; with --warmup = "
     "--steps never reached)", OPT_FLOAT, OFF(min_lr), 0, 10, {0}, NULL, RUN},
    {"--warmup", "linear warm-up steps (auto: min(100, --steps / 10))", OPT_INT, OFF(warmup), 0, 1 << 30, {0}, NULL, RUN},
    {"--weight-decay", "AdamW weight decay (not on norms and biases)", OPT_FLOAT, OFF(weight_decay), 0, 10, {0}, NULL,
     RUN},
    {"--clip", "clip the global gradient norm to this (0: off)", OPT_FLOAT, OFF(clip), 0, 1e6, {0}, NULL, RUN},
    {"--beta1", "AdamW beta1", OPT_FLOAT, OFF(beta1), 0, 0.999999, {0}, NULL, RUN},
    {"--beta2", "AdamW beta2", OPT_FLOAT, OFF(beta2), 0, 0.999999, {0}, NULL, RUN},
    {"--adam-eps", "AdamW epsilon (added to sqrt(v); above 0)", OPT_FLOAT, OFF(adam_eps), 0, 1e6, {0}, NULL, RUN},
    {"--seed", "seed of the weights and of sampling", OPT_INT, OFF(seed), 0, 2147483647, {0}, NULL, RUN},
    {"--zero", "1: ZeRO-1, shard the AdamW state of the dense parameters over the ranks and of the experts over the "
     "ranks holding the same experts; 2: ZeRO-2, also the gradients: each layer's are reduce-scattered as its backward "
     "ends and no rank holds them whole (needs --world-invariant 1). Over the fixed tree's halves: a power-of-two "
     "number of ranks, and of ranks holding the same experts. Same results at every level", OPT_INT, OFF(zero),
     0, 2, {0}, NULL, LAYOUT},
    {"--pp", "pipeline stages: the ranks form this many stages of consecutive ranks, each holding --layers / --pp "
     "consecutive layers (the first the embedding, the last the head; the ends' own counts: --first-stage-layers), "
     "run in a 1F1B schedule over the micro-batches; the batch is split over the ranks of a stage. Bitwise the same "
     "results as --pp 1", OPT_INT, OFF(pp), 1, 4096, {0}, NULL, LAYOUT},
    {"--virtual-stages", "model chunks per pipeline rank: rank s holds chunks s, s + pp, s + 2 pp, ... of --layers / (pp "
     "x V) layers each, run in Megatron's interleaved 1F1B schedule (micro-batches in groups of --pp), which shrinks "
     "the bubble by V; bitwise the same results",
     OPT_INT, OFF(virtual_stages), 1, 64, {0}, NULL, LAYOUT},
    {"--first-stage-layers", "with --pp: the first stage's layers (it also holds the embedding); the stages between "
     "the first and the last hold an equal share of the rest (0: an equal share: --layers / --pp). For a model whose "
     "layers --pp does not divide (DeepSeek-V3's 61), as Megatron's --decoder-first-pipeline-num-layers; one chunk a "
     "stage (no --virtual-stages)", OPT_INT, OFF(first_stage_layers), 0, 1 << 20, {0}, NULL, LAYOUT},
    {"--last-stage-layers", "with --pp: the last stage's layers (it also holds the head and the loss), as "
     "--first-stage-layers", OPT_INT, OFF(last_stage_layers), 0, 1 << 20, {0}, NULL, LAYOUT},
    {"--tp", "tensor-parallel ranks (Megatron's, with sequence parallelism): groups of --tp consecutive ranks read the "
     "same sequences; q/k/v and a dense FFN's gate/up are column-, o_proj and down row-parallel (a rank holds "
     "--heads / --tp heads), the norms, MoE layers and head run on each rank's slice of the group's tokens. A power "
     "of two "
     "dividing the ranks of a stage, --heads and --seq-len, and dividing --kv-heads or a multiple of it (a rank then "
     "keeps its query heads' kv head). Bitwise the same as --tp 1 with the same --tp-shards where the run is "
     "world-invariant (--shards, a divisor of --batch, a multiple of the stage's ranks, tp included: --batch 1 at --tp "
     "2 is not); checkpoints hold whole tensors (any --tp resumes them)",
     OPT_INT, OFF(tp), 1, 4096, {0}, NULL, LAYOUT},
    {"--tp-shards", "the fixed pieces of the tensor-parallel sums (tp/linear.h): a power of two that --tp divides and "
     "that divides --heads x head_dim, --kv-heads x head_dim and --vocab (the head is vocabulary-parallel); one value "
     "gives the same bits at every --tp dividing it, so compare runs at the largest --tp (auto, or 0: --tp)",
     OPT_INT, OFF(model.tp_shards), -1, 1 << 16, {0}, NULL, RUN},
    {"--world-invariant", "1: every sum over the batch formed per virtual shard and added in one fixed tree, so "
     "training is bitwise the same on any power-of-two number of ranks and any --ep; 0: per rank, then MPI's or "
     "NCCL's all-reduce (bitwise on one layout only); auto: 1 where the ranks are a power of two dividing --shards "
     "(docs/DETERMINISM.md)",
     OPT_INT, OFF(world_invariant), 0, 1, {0}, NULL, RUN},
    {"--shards", "with --world-invariant 1: the global batch's virtual shards, a power of two dividing --batch that "
     "the number of ranks divides (auto: the largest power of two dividing --batch, at most 64)", OPT_INT,
     OFF(shards), -1, 1 << 20, {0}, NULL, RUN},
    {"--skip-nonfinite", "1: drop a step whose loss or gradient is NaN or Inf (and say where it appeared) instead of "
     "stopping the run", OPT_INT, OFF(skip_nonfinite), 0, 1, {0}, NULL, RUN},
    {"--max-skipped-steps", "with --skip-nonfinite 1: stop the run after this many consecutive dropped steps (a run "
     "that no longer learns)", OPT_INT, OFF(max_skipped_steps), 1, 1 << 30, {0}, NULL, RUN},
    {"--threads", "CPU threads per rank, shared by the loops and the GEMMs; never changes results (0: the CPUs this "
     "rank may use / ranks on this node)", OPT_INT, OFF(threads), 0, 4096, {0}, NULL, LAYOUT},
    {"--device", "where the model runs: cpu, or cuda (one GPU per rank on its node; needs a CUDA build)", OPT_CHOICE,
     OFF(device), 0, 0, {"cpu", "cuda"}, NULL, RUN},
    {"--gpu-transport", "with --device cuda: how tokens and gradients travel (auto: nccl, or mpi when ranks share a "
     "GPU)", OPT_CHOICE, OFF(gpu_transport), 0, 0, {"nccl", "mpi"}, NULL, RUN},
    {"--verify-steps", "the first N steps are also computed by the CPU fp32 reference from the same weights and "
     "batch, compared (loss, grad norm, routing, every gradient) and the run stopped outside the tolerances "
     "(docs/GPU.md)", OPT_INT, OFF(verify_steps), 0, 1 << 20, {0}, NULL, RUN},
    /* data and output */
    {"--train-data", "training data: llm.c token files (.bin, uint16 or uint32), a file, a quoted glob or a "
     "comma-separated list of them (shards, in list order; docs/DATA.md)", OPT_STRING, OFF(train_data), 0, 0, {0}, NULL,
     RUN},
    {"--val-data", "validation data, as --train-data (read in order)", OPT_STRING, OFF(val_data), 0, 0, {0}, NULL, RUN},
    {"--shuffle", "1: the training windows of all shards in a permutation seeded by --seed, a new one each epoch; 0: "
     "in list order, wrapping", OPT_INT, OFF(shuffle), 0, 1, {0}, NULL, RUN},
    {"--allow-data-change", "1: --resume continues although the data set (its shards, --shuffle) differs from the "
     "checkpoint's: the window counter is kept, the new set's order applies", OPT_INT, OFF(allow_data_change), 0, 1,
     {0}, NULL, COMMAND},
    {"--eval-interval", "validation every N steps (0: only at the end)", OPT_INT, OFF(eval_interval), 0, 1 << 30, {0}, NULL, RUN},
    {"--eval-batches", "batches of validation data per evaluation, each of --batch x --micro-batches sequences as a "
     "training step's (read in forward passes of --batch sequences)",
     OPT_INT, OFF(eval_batches), 1, 1 << 16, {0}, NULL, RUN},
    {"--log-file", "JSON-lines metrics file ('' : none); it opens with a record of the whole run (an earlier log "
     "there is kept as FILE.1, FILE.2, ...)", OPT_STRING,
     OFF(log_file), 0, 0, {0}, NULL, COMMAND},
    {"--sample-tokens", "tokens sampled at the end (0: none; each a forward pass of up to --seq-len tokens, routed "
     "without a capacity limit)", OPT_INT,
     OFF(sample_tokens), 0, 1 << 16, {0}, NULL, RUN},
    {"--sample-prompt", "text the samples start from", OPT_STRING, OFF(sample_prompt), 0, 0, {0}, NULL, RUN},
    {"--sample-temperature", "sampling temperature (0: greedy)", OPT_FLOAT, OFF(sample_temperature), 0, 100, {0}, NULL, RUN},
    {"--exchange-timeout", "seconds before a stuck exchange aborts the job", OPT_FLOAT, OFF(exchange_timeout_s), 1, 1e6,
     {0}, NULL, RUN},
    {"--startup-timeout", "seconds the start-up (MPI_Init, the options' agreement, the parallel layout) may take before "
     "the job aborts (0: --exchange-timeout's, at least 60: a job's MPI_Init on busy or many nodes outlasts a tight "
     "exchange limit)", OPT_FLOAT, OFF(startup_timeout_s), 0, 1e6, {0}, NULL, RUN},
    {"--stop-signals", "signals that stop the run at the next step boundary after a checkpoint (with --checkpoint-dir), "
     "exit status 128 + the signal; a second one ends it at once (names without SIG, comma-separated, of TERM INT "
     "USR1 USR2 HUP; none)", OPT_STRING, OFF(stop_signals), 0, 0, {0}, NULL, COMMAND},
    /* checkpoints */
    {"--checkpoint-dir", "save checkpoints (step-NNNNNNNN directories) here ('': never)", OPT_STRING, OFF(checkpoint_dir),
     0, 0, {0}, NULL, RUN},
    {"--checkpoint-interval", "save every N steps and at the end (0: at the end only)", OPT_INT, OFF(checkpoint_interval),
     0, 1 << 30, {0}, NULL, RUN},
    {"--keep-last", "checkpoints of this run kept, newest first (0: all)", OPT_INT, OFF(keep_last), 0, 1 << 20, {0},
     NULL, RUN},
    {"--checkpoint-timeout", "seconds a rank waits for the others to write or read their part of a checkpoint",
     OPT_FLOAT, OFF(checkpoint_timeout_s), 1, 1e7, {0}, NULL, RUN},
    {"--save-dtype", "dtype of the saved weights: f32 (the masters), or bf16 (an export, half the size: cannot be "
     "resumed; --init-from takes it)", OPT_CHOICE, OFF(save_dtype), 0, 0, {"f32", "bf16"}, NULL, RUN},
    {"--save-shard-size", "split the saved model into shards of at most this many bytes with an index, as transformers "
     "does (e.g. 5GB, 500MiB; '' : one file)", OPT_STRING, OFF(save_shard_size), 0, 0, {0}, NULL, RUN},
    {"--resume", "continue a run from a checkpoint directory, or (no value, or latest) the newest in --checkpoint-dir, "
     "or (auto) that where there is one and else a fresh run (a requeued job); the architecture comes from its "
     "config.json and every option not given from the run it saved", OPT_STRING,
     OFF(resume), 0, 0, {0}, "latest", COMMAND},
    {"--init-from", "start from the weights of a checkpoint directory (fresh optimizer); the architecture comes from "
     "its config.json", OPT_STRING, OFF(init_from), 0, 0, {0}, NULL, COMMAND},
    {"--eval-only", "1: print the validation loss of the (loaded) weights and stop", OPT_INT, OFF(eval_only), 0, 1, {0},
     NULL, COMMAND},
    {"--routing-trace-out", "write each training step's routing (every token's experts) to this file", OPT_STRING,
     OFF(routing_trace_out), 0, 0, {0}, NULL, COMMAND},
    {"--routing-trace-in", "replay: take the routing from this trace instead of the routers", OPT_STRING,
     OFF(routing_trace_in), 0, 0, {0}, NULL, RUN},
    {"--dump-logits", "with --eval-only: write validation sequence 0's logits (float32 [S, V]) here", OPT_STRING,
     OFF(dump_logits), 0, 0, {0}, NULL, COMMAND},
    /* configuration files */
    {"--config", "read options from this JSON file (keys: the flags without dashes, '-' as '_'); flags override it",
     OPT_STRING, OFF(config_file), 0, 0, {0}, NULL, FLAG_ONLY},
    {"--print-config", "write the resolved configuration as JSON (a --config file) to stdout and stop", OPT_INT,
     OFF(print_config), 0, 1, {0}, "1", FLAG_ONLY},
    {"--print-schedule", "write each pipeline stage's schedule (its forwards, backwards, sends and receives in order, "
     "from --pp, --virtual-stages and --micro-batches) to stdout and stop", OPT_INT, OFF(print_schedule), 0, 1, {0},
     "1", FLAG_ONLY},
};
#define NUM_OPTIONS (sizeof kOptions / sizeof kOptions[0])
_Static_assert(NUM_OPTIONS <= MOE_TRAIN_MAX_OPTIONS, "raise MOE_TRAIN_MAX_OPTIONS");

const moe_train_option *moe_train_option_table(int *count) {
    *count = (int)NUM_OPTIONS;
    return kOptions;
}

const moe_train_option *moe_train_option_at(size_t offset) {
    for (size_t i = 0; i < NUM_OPTIONS; i++)
        if (kOptions[i].offset == offset) return &kOptions[i];
    return NULL;
}

const char *moe_train_option_key(const moe_train_option *s) {
    static char keys[NUM_OPTIONS][32];
    char *k = keys[s - kOptions];
    if (!*k) {
        snprintf(k, sizeof keys[0], "%s", s->name + 2);
        for (char *c = k; *c; c++)
            if (*c == '-') *c = '_';
    }
    return k;
}

void moe_train_complain(FILE *err, const char *fmt, ...) {
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
    o->lr = 3e-3f, o->min_lr = -1, o->warmup = -1, o->weight_decay = 0.1f, o->clip = 1.0f;
    o->device = MOE_TRAIN_DEVICE_CPU, o->gpu_transport = -1, o->verify_steps = 0;
    o->pp = 1, o->virtual_stages = 1, o->tp = 1, o->ep = 1, o->model.tp_shards = -1; /* tp_shards auto: --tp */
    o->world_invariant = -1, o->shards = -1; /* auto: on where the layout allows (finish_shards), on cuda too */
    o->beta1 = 0.9f, o->beta2 = 0.95f, o->adam_eps = 1e-8f, o->seed = 1337;
    o->train_data = "data/kjv_train.bin", o->val_data = "data/kjv_val.bin", o->log_file = "";
    o->eval_interval = 50, o->eval_batches = 4;
    o->sample_tokens = 200, o->sample_prompt = MOE_TRAIN_DEFAULT_PROMPT, o->sample_temperature = 0.8f;
    o->exchange_timeout_s = 300, o->stop_signals = "TERM,INT,USR1", o->max_skipped_steps = 10;
    o->checkpoint_dir = "", o->checkpoint_interval = 0, o->keep_last = 3, o->checkpoint_timeout_s = 3600;
    o->save_shard_size = "";
    o->resume = "", o->init_from = "", o->eval_only = 0, o->dump_logits = "";
    o->routing_trace_out = "", o->routing_trace_in = "";
    o->config_file = "", o->print_config = 0, o->print_schedule = 0;
}

static const opt_spec *find(const char *name) {
    for (size_t i = 0; i < NUM_OPTIONS; i++)
        if (!strcmp(kOptions[i].name, name)) return &kOptions[i];
    return NULL;
}

int moe_train_option_from(const moe_train_options *o, const moe_train_option *s, moe_option_source source) {
    return o->source[s - kOptions] >= source;
}

static const moe_train_options *defaults(void) {
    static moe_train_options d;
    static int made;
    if (!made) set_defaults(&d), made = 1;
    return &d;
}

int moe_train_option_undecided(const moe_train_options *o, const moe_train_option *s) {
    const void *field = (const char *)o + s->offset;
    return s->kind == OPT_FLOAT ? *(const float *)field < 0
           : (s->kind == OPT_INT || s->kind == OPT_CHOICE) && *(const int *)field < 0;
}

int moe_train_option_has_auto(const moe_train_option *s) { return moe_train_option_undecided(defaults(), s); }

int moe_train_option_is_default(const moe_train_options *o, const moe_train_option *s) {
    const void *is = (const char *)o + s->offset, *was = (const char *)defaults() + s->offset;
    if (s->kind == OPT_FLOAT) return *(const float *)is == *(const float *)was;
    if (s->kind == OPT_STRING) return !strcmp(*(const char *const *)is, *(const char *const *)was);
    return *(const int *)is == *(const int *)was;
}

int moe_train_option_set(moe_train_options *o, const moe_train_option *s, const char *v, moe_option_source source,
                         const char *label, FILE *err) {
    void *field = (char *)o + s->offset;
    char *end;
    errno = 0;
    if (!strcmp(v, "auto") && moe_train_option_has_auto(s)) { /* decided by moe_train_options_finish */
        if (s->kind == OPT_FLOAT) *(float *)field = -1;
        else *(int *)field = -1;
        return o->source[s - kOptions] = (unsigned char)source, 0;
    }
    if (s->kind == OPT_STRING) {
        *(const char **)field = v;
        return o->source[s - kOptions] = (unsigned char)source, 0;
    }
    if (s->kind == OPT_CHOICE) {
        char words[160] = "";
        for (int c = 0; c < MOE_OPT_MAX_CHOICES && s->choices[c]; c++) {
            if (!strcmp(v, s->choices[c])) return *(int *)field = c, o->source[s - kOptions] = (unsigned char)source, 0;
            const int last = c + 1 == MOE_OPT_MAX_CHOICES || !s->choices[c + 1];
            snprintf(words + strlen(words), sizeof words - strlen(words), "%s%s", c == 0 ? "" : last ? " or " : ", ",
                     s->choices[c]);
        }
        moe_train_complain(err, "moe-train: %s must be %s%s, got '%s'\n", label, words,
                           moe_train_option_has_auto(s) ? " (or auto, the default)" : "", v);
        return -1;
    }
    double x = s->kind == OPT_INT ? (double)strtol(v, &end, 10) : strtod(v, &end);
    if (errno || end == v || *end || !isfinite(x) || x < s->lo || x > s->hi) {
        const int digits = s->kind == OPT_INT ? 19 : 6; /* an integer's bounds whole: 1048576, not 1.04858e+06 */
        moe_train_complain(err, "moe-train: %s expects %s in [%.*g, %.*g], got '%s'\n", label,
                s->kind == OPT_INT ? "an integer" : "a number", digits, s->lo, digits, s->hi, v);
        return -1;
    }
    if (s->kind == OPT_INT) *(int *)field = (int)x;
    else *(float *)field = (float)x;
    o->source[s - kOptions] = (unsigned char)source;
    return 0;
}

/* --world-invariant and --shards into model.moe.num_shards (0: off). Auto: on wherever the layout allows it. */
static int finish_shards(moe_train_options *o, int world_size, FILE *err) {
    if (o->shards < 0) /* the largest power of two dividing the batch, at most 64 */
        for (o->shards = 1; o->shards < 64 && o->batch % (2 * o->shards) == 0;) o->shards *= 2;
    const int S = o->shards, W = world_size, layout_fits = !(W & (W - 1)) && S % W == 0;
    if (S < 1 || (S & (S - 1)) || o->batch % S)
        return moe_train_complain(err, "moe-train: --shards %d must be a power of two dividing --batch %d\n", S,
                                  o->batch), -1;
    /* the tree's sums hold a run's bits across layouts only where each row's products do too (a probe, 2026-12-07:
     * --layout-invariant 0 took --world-invariant 1, said nothing, and the runs differed from step 1) */
    const int rows_fixed = o->model.moe.layout_invariant;
    if (o->world_invariant > 0 && !rows_fixed)
        return moe_train_complain(err, "moe-train: --world-invariant 1 needs --layout-invariant 1: with the GEMMs' "
                                       "rows depending on each call's size, no fixed order of the sums makes the run "
                                       "the same on another layout\n"), -1;
    if (o->world_invariant < 0) {
        o->world_invariant = layout_fits && rows_fixed;
        if (!o->world_invariant && err) {
            char why[160];
            if (!rows_fixed) snprintf(why, sizeof why, "--layout-invariant 0");
            else snprintf(why, sizeof why, "%d ranks %s --shards %d", W, W & (W - 1) ? "are not a power of two dividing"
                                                                                 : "do not divide", S);
            fprintf(err, "moe-train: note: --world-invariant is 0 here (%s), so results are bitwise the same on this "
                         "layout only (docs/DETERMINISM.md)\n", why);
        }
    }
    o->model.moe.num_shards = o->world_invariant ? S : 0;
    if (o->world_invariant && !layout_fits) { /* the way out that this layout has (a probe: "--shards 3" for 3 ranks) */
        char fix[160];
        if (W & (W - 1)) snprintf(fix, sizeof fix, "a power-of-two number of ranks");
        else if (o->batch % W) snprintf(fix, sizeof fix, "a --batch that is a multiple of %d", W);
        else snprintf(fix, sizeof fix, "--shards %d or another multiple of %d dividing --batch %d", W, W, o->batch);
        return moe_train_complain(err, "moe-train: --world-invariant 1 needs a power-of-two number of ranks that divides "
                                       "--shards %d, not %d ranks (use %s, or --world-invariant 0)\n", S, W, fix), -1;
    }
    return 0;
}

/* --zero: its ranges are the fixed tree's (models/zero.h), over groups of a power-of-two size; ZeRO-2 sums in that
 * tree, so it needs the world-invariant sums. */
static int finish_zero(const moe_train_options *o, int world_size, FILE *err) {
    const int dp = world_size / o->ep;
    if (o->zero && ((world_size & (world_size - 1)) || (dp & (dp - 1))))
        return moe_train_complain(err, "moe-train: --zero %d shards over the ranks in the fixed tree's halves: it needs a "
                                       "power-of-two number of ranks (%d) and of ranks holding the same experts (%d / "
                                       "--ep %d = %d)\n", o->zero, world_size, world_size, o->ep, dp), -1;
    if (o->zero && world_size == 1 && err) /* kept valid: one config serves every world size (docs/DETERMINISM.md) */
        fprintf(err, "moe-train: note: --zero %d on 1 rank%s shards nothing (each range is a whole region); it divides "
                     "the optimizer state%s over the ranks from 2\n", o->zero, o->pp > 1 ? " per pipeline stage" : "",
                o->zero == 2 ? " and the gradients" : "");
    if (o->zero == 2 && !o->world_invariant)
        return moe_train_complain(err, "moe-train: --zero 2 reduce-scatters the gradients in the fixed tree of the "
                                       "world-invariant sums: it needs --world-invariant 1 (--shards a multiple of the "
                                       "%d ranks)\n", world_size), -1;
    if (o->zero == 2 && o->verify_steps)
        return moe_train_complain(err, "moe-train: --verify-steps compares whole gradients, which --zero 2 never holds: "
                                       "verify with --zero 1 (the same results)\n"), -1;
    return 0;
}

/* --pp and --virtual-stages: stages of equal layers over equal groups of ranks. */
static int finish_pipeline(const moe_train_options *o, int world_size, FILE *err) {
    const int pp = o->pp, V = o->virtual_stages, L = o->model.num_layers;
    if (world_size % pp)
        return moe_train_complain(err, "moe-train: --pp %d must divide the number of ranks (%d)\n", pp, world_size), -1;
    if (V > 1 && pp == 1)
        return moe_train_complain(err, "moe-train: --virtual-stages %d needs --pp 2 or more (chunks of a pipeline "
                                       "rank)\n", V), -1;
    const moe_pipeline_split split = moe_train_pipeline_split(o);
    const char *problem = moe_pipeline_split_problem(&split, L);
    if (problem && !o->first_stage_layers && !o->last_stage_layers) /* the uneven ends: without virtual stages */
        return moe_train_complain(err, "moe-train: --pp %d x --virtual-stages %d = %d stages must divide --layers %d "
                                       "(every stage holds as many layers)%s\n", pp, V, pp * V, L,
                                  V > 1 ? "" : ", or --first-stage-layers / --last-stage-layers give the ends theirs"),
               -1;
    if (problem)
        return moe_train_complain(err, "moe-train: --first-stage-layers %d, --last-stage-layers %d with --pp %d, "
                                       "--virtual-stages %d and --layers %d: %s\n", o->first_stage_layers,
                                  o->last_stage_layers, pp, V, L, problem), -1;
    if (V > 1 && o->micro_batches % pp)
        return moe_train_complain(err, "moe-train: the interleaved schedule runs micro-batches in groups of --pp: "
                                       "--micro-batches %d must be a multiple of --pp %d\n", o->micro_batches, pp), -1;
    return 0;
}

/* Combinations no single flag can check. */
static int finish_checks(moe_train_options *o, int world_size, FILE *err);

/* --tp: groups of consecutive ranks inside a stage (the shapes it splits: moe_model_layout_problem). */
static int finish_tensor_parallel(const moe_train_options *o, int world_size, FILE *err) {
    const int tp = o->tp, shards = o->model.tp_shards;
    if (shards % tp && o->source[find("--tp-shards") - kOptions] == MOE_OPTION_SAVED_RUN)
        return moe_train_complain(err, "moe-train: --tp %d does not divide --tp-shards %d, the fixed pieces of the "
                                       "tensor-parallel sums that the saved run trained with (--resume keeps them, so "
                                       "that the bits continue the saved run's): resume at a --tp dividing %d, or give "
                                       "--tp-shards %d (or a larger power of two) to cut them anew, the bits from "
                                       "there on differing\n", tp, shards, shards, tp), -1;
    if (tp == 1) return 0;
    if ((world_size / o->pp) % tp)
        return moe_train_complain(err, "moe-train: --tp %d must divide the ranks of a stage (%d)\n", tp,
                                  world_size / o->pp), -1;
    if (o->model.seq_len % tp)
        return moe_train_complain(err, "moe-train: --tp %d must divide --seq-len %d (every forward's tokens split into "
                                       "--tp slices)\n", tp, o->model.seq_len), -1;
    return 0;
}

static int is_auto(const moe_train_options *o, size_t i) {
    return moe_train_option_has_auto(&kOptions[i]) && moe_train_option_undecided(o, &kOptions[i]);
}

int moe_train_options_finish(moe_train_options *o, int world_size, FILE *err) {
    for (size_t i = 0; i < NUM_OPTIONS; i++) o->derived[i] = is_auto(o, i);
    const int rc = finish_checks(o, world_size, err);
    for (size_t i = 0; i < NUM_OPTIONS; i++) o->derived[i] &= !is_auto(o, i); /* decided here, not left to run time */
    return rc;
}

/* The offset of the first byte of s that does not belong to well-formed UTF-8 (RFC 3629: no overlong forms, no
 * surrogates, nothing past U+10FFFF), or -1. */
static long utf8_bad_at(const unsigned char *s) {
    for (const unsigned char *p = s; *p;) {
        const int n = *p < 0x80 ? 1 : (*p >> 5) == 6 ? 2 : (*p >> 4) == 14 ? 3 : (*p >> 3) == 30 ? 4 : 0;
        if (!n) return p - s;
        unsigned cp = n == 1 ? *p : *p & (0x7f >> n);
        for (int i = 1; i < n; i++) {
            if ((p[i] & 0xc0) != 0x80) return p - s;
            cp = cp << 6 | (p[i] & 0x3f);
        }
        static const unsigned kLeast[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < kLeast[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return p - s;
        p += n;
    }
    return -1;
}

/* The automatic values, then the combinations. */
static int finish_checks(moe_train_options *o, int world_size, FILE *err) {
    /* every string is saved as JSON (the run record, each checkpoint's configuration), which holds UTF-8 text only
     * (a probe, 2026-12-07: a Latin-1 path or prompt trained, then every save failed as "out of memory") */
    for (size_t i = 0; i < NUM_OPTIONS; i++) {
        const char *text = kOptions[i].kind == OPT_STRING ? *(const char *const *)((const char *)o + kOptions[i].offset)
                                                          : NULL;
        const long bad = text ? utf8_bad_at((const unsigned char *)text) : -1;
        if (bad >= 0)
            return moe_train_complain(err, "moe-train: %s: byte %ld (0x%02x) is not UTF-8 text, which the run's "
                                      "configuration is saved as (in the run record and every checkpoint): give a "
                                      "UTF-8 name (a link to the file, say) or text\n", kOptions[i].name, bad + 1,
                                      (unsigned char)text[bad]), -1;
    }
    moe_model_config *m = &o->model;
    m->moe.d_model = m->d_model, m->moe.d_ff = m->d_ff;
    /* k = 1: the gate stays the probability. DeepSeek-V2 never renormalises and V3 scores by sigmoid: --family says
     * the model, which its transformers class then computes (a probe, 2026-12-07: both were our variant unless
     * --renormalize 0 or --score sigmoid was given) */
    if (m->moe.renormalize < 0) m->moe.renormalize = m->family != MOE_MODEL_FAMILY_DEEPSEEK_V2 && m->moe.top_k > 1;
    if (m->family == MOE_MODEL_FAMILY_DEEPSEEK_V3 && o->source[find("--score") - kOptions] == MOE_OPTION_DEFAULT)
        m->moe.score_func = MOE_SCORE_SIGMOID;
    if ((int)m->moe.precision < 0) m->moe.precision = o->device == MOE_TRAIN_DEVICE_CUDA ? MOE_PRECISION_BF16 : MOE_PRECISION_FP32;
    if (m->num_kv_heads < 0) m->num_kv_heads = m->num_heads; /* plain multi-head attention unless asked */
    /* DeepSeek's latent norms keep transformers' 1e-6 whatever the config says: its models use it throughout */
    if (moe_model_deepseek(m) && o->source[find("--norm-eps") - kOptions] == MOE_OPTION_DEFAULT) m->norm_eps = 1e-6f;
    if (m->family == MOE_MODEL_FAMILY_DEEPSEEK_V2 && o->source[find("--group-score") - kOptions] == MOE_OPTION_DEFAULT)
        m->moe.group_score = MOE_GROUP_SCORE_MAX; /* its group_limited_greedy */
    if (o->warmup < 0) o->warmup = o->steps / 10 < 100 ? o->steps / 10 : 100; /* min(100, steps / 10) */
    /* auto: a tenth of the peak, as the default pair (3e-3, 3e-4) always was, the same float (a probe: --lr 1e-4
     * alone was refused as below a fixed 3e-4, and --lr 6e-4 decayed only to half its peak) */
    if (o->min_lr < 0) o->min_lr = (float)((double)o->lr / 10);
    if (o->gpu_transport >= 0 && o->device != MOE_TRAIN_DEVICE_CUDA)
        return moe_train_complain(err, "moe-train: --gpu-transport needs --device cuda\n"), -1;
    if (o->device == MOE_TRAIN_DEVICE_CUDA && m->moe.precision == MOE_PRECISION_FP32)
        return moe_train_complain(err, "moe-train: --device cuda runs the experts in bf16 only (fp32 CUDA experts "
                                       "are not written yet): drop --precision fp32 (bf16 is the default on cuda)\n"),
               -1;
    m->zero = o->zero;
    if (m->tp_shards < 0) m->tp_shards = o->tp;
    if (finish_tensor_parallel(o, world_size, err)) return -1;
    const char *problem = moe_model_layout_problem(m, o->tp, o->ep);
    if (problem) /* the rule's words are the layer's and the model's fields: the flags' values beside them */
        return moe_train_complain(err, "moe-train: invalid model: %s (--experts %d, --top-k %d, --ep %d, --tp %d, "
                                  "--tp-shards %d, --heads %d, --kv-heads %d, --head-dim %d, --d-model %d, --d-ff %d, "
                                  "--layers %d, --vocab %d, --expert-groups %d)\n", problem, m->moe.num_experts,
                                  m->moe.top_k, o->ep, o->tp, m->tp_shards, m->num_heads, m->num_kv_heads,
                                  m->head_dim, m->d_model, m->d_ff, m->num_layers, m->vocab_size,
                                  m->moe.num_groups), -1;
    if (finish_pipeline(o, world_size, err)) return -1;
    world_size /= o->pp; /* from here on: the ranks of a stage, which split the batch and hold its layers' experts */
    const char *of_stage = o->pp > 1 ? " of a pipeline stage" : "";
    if (world_size % o->ep)
        return moe_train_complain(err, "moe-train: --ep %d must divide the number of ranks%s (%d)\n", o->ep, of_stage,
                                  world_size), -1;
    const int data_ranks = world_size / o->tp; /* a tensor group reads one part of the batch */
    if (o->batch % data_ranks)
        return moe_train_complain(err, "moe-train: --batch %d must be divisible by the number of %s%s (%d)\n",
                                  o->batch, o->tp > 1 ? "tensor-parallel groups" : "ranks", of_stage,
                                  data_ranks), -1;
    /* the trainer, the layer and the routing trace count a micro-batch's tokens and routing choices in an int */
    const long long choices = (long long)o->batch * m->seq_len * m->moe.top_k;
    if (choices > INT_MAX)
        return moe_train_complain(err, "moe-train: --batch %d * --seq-len %d * --top-k %d = %lld routing choices per micro-batch, "
                        "more than %d\n", o->batch, m->seq_len, m->moe.top_k, choices, INT_MAX), -1;
    if (finish_shards(o, world_size, err)) return -1;
    if (finish_zero(o, world_size, err)) return -1;
    if (o->min_lr > o->lr) return moe_train_complain(err, "moe-train: --min-lr %g exceeds --lr %g\n", o->min_lr, o->lr), -1;
    if (o->warmup > o->steps) return moe_train_complain(err, "moe-train: --warmup %d exceeds --steps %d\n", o->warmup, o->steps), -1;
    if (!*o->train_data || !*o->val_data) return moe_train_complain(err, "moe-train: --train-data and --val-data are required\n"), -1;
    /* the default validation file beside other training data measured another corpus, unsaid (a probe) */
    const moe_train_option *train_spec = moe_train_option_at(offsetof(moe_train_options, train_data));
    if (!o->eval_only && moe_train_option_from(o, train_spec, MOE_OPTION_SAVED_RUN) &&
        !moe_train_option_is_default(o, train_spec) && /* the default file's own held-out part is the default */
        !moe_train_option_from(o, moe_train_option_at(offsetof(moe_train_options, val_data)), MOE_OPTION_SAVED_RUN))
        return moe_train_complain(err, "moe-train: --train-data %s is given without --val-data, which would be the "
                                       "default %s, another corpus: give a held-out part of the same data "
                                       "(scripts/prepare_data.py and moe-text-to-tokens write one)\n",
                                  o->train_data, o->val_data), -1;
    if (*o->resume && *o->init_from)
        return moe_train_complain(err, "moe-train: --resume and --init-from exclude each other (resume restores the weights too)\n"), -1;
    if (!strcmp(o->resume, "latest") && !*o->checkpoint_dir)
        return moe_train_complain(err, "moe-train: --resume latest needs --checkpoint-dir\n"), -1;
    o->save_shard_nbytes = 0;
    if (*o->save_shard_size && moe_parse_nbytes(o->save_shard_size, &o->save_shard_nbytes) != 0)
        return moe_train_complain(err, "moe-train: --save-shard-size expects a byte count such as 5GB, 500MiB or "
                                       "1048576, got '%s'\n", o->save_shard_size), -1;
    /* --checkpoint-dir loads nothing: with --eval-only alone it evaluated fresh weights as the folder's (a probe) */
    if (o->eval_only && !*o->resume && !*o->init_from && *o->checkpoint_dir)
        return moe_train_complain(err, "moe-train: --eval-only evaluates the weights --resume or --init-from loads; "
                                       "--checkpoint-dir only names where saves go, so this would evaluate freshly "
                                       "initialised weights: for the newest checkpoint in %s give --resume latest\n",
                                  o->checkpoint_dir), -1;
    if (*o->dump_logits && !o->eval_only) return moe_train_complain(err, "moe-train: --dump-logits needs --eval-only 1\n"), -1;
    if (*o->routing_trace_out && o->eval_only) /* (it wrote an empty trace: a probe) */
        return moe_train_complain(err, "moe-train: --routing-trace-out records training steps; --eval-only trains "
                                       "none\n"), -1;
    /* decoupled decay multiplies each decayed weight by 1 - lr wd every step: from lr wd = 1 on the weights are zeroed
     * or flip sign at the peak learning rate, never a useful setting */
    if ((double)o->lr * o->weight_decay >= 1)
        return moe_train_complain(err, "moe-train: --lr %g x --weight-decay %g = %g: AdamW's decoupled decay "
                                       "multiplies every decayed weight by 1 - lr x wd = %g each step at the peak (as "
                                       "torch.optim.AdamW's weight_decay; usual values are 0.01 to 0.1)\n", o->lr,
                                  o->weight_decay, (double)o->lr * o->weight_decay,
                                  fabs(1 - (double)o->lr * o->weight_decay) < 1e-6 /* float's 0.1 */
                                      ? 0
                                      : 1 - (double)o->lr * o->weight_decay),
               -1;
    if (!(o->adam_eps > 0)) /* sqrt(v) + eps: 0/0 at the first update of a weight whose gradient was exactly 0 */
        return moe_train_complain(err, "moe-train: --adam-eps must be above 0: AdamW divides by sqrt(v) + eps, and with "
                                       "0 a weight whose gradients have all been 0 (an embedding row of a token no "
                                       "batch held) becomes 0/0 = NaN at its first update\n"), -1;
    /* the prompt's bytes are its tokens: one past the vocabulary was taken modulo it, another prompt (a probe); the
     * default's, also as a saved run or a --config file gives it back (a probe: their resume was refused), is replaced */
    for (const unsigned char *c = (const unsigned char *)o->sample_prompt; o->sample_tokens > 0 && *c; c++)
        if (*c >= o->model.vocab_size && strcmp(o->sample_prompt, MOE_TRAIN_DEFAULT_PROMPT))
            return moe_train_complain(err, "moe-train: --sample-prompt: its byte %u is past the vocabulary of %d (the "
                                           "prompt's bytes are its tokens)\n", *c, o->model.vocab_size), -1;
    char why[256];
    if (moe_train_signals_check(o->stop_signals, why, sizeof why))
        return moe_train_complain(err, "moe-train: --stop-signals: %s\n", why), -1;
    if (*o->routing_trace_out && *o->resume)
        return moe_train_complain(err, "moe-train: --routing-trace-out records a run from step 1; it cannot be combined with --resume\n"), -1;
    return 0;
}

/* "unknown flag", with the way here: another trainer's name for it (flag_aliases.h), the flag it is a misspelling of,
 * or a value whose flag is missing */
static void unknown_flag(const char *name, FILE *err) {
    char canonical[64]; /* --micro_batch_size is Megatron's --micro-batch-size too (a review) */
    moe_flag_arg_canonical(name, canonical);
    const char *names[NUM_OPTIONS], *alias = moe_train_flag_alias(canonical);
    for (size_t i = 0; i < NUM_OPTIONS; i++) names[i] = kOptions[i].name;
    char hint[256];
    if (alias) snprintf(hint, sizeof hint, ": another trainer's flag; here: %s", alias);
    else moe_flag_arg_hint(name, names, NUM_OPTIONS, hint, sizeof hint);
    moe_train_complain(err, "moe-train: unknown flag '%s'%s (see --help)\n", name, hint);
}

int moe_train_options_parse_flags(int argc, char **argv, moe_train_options *o, FILE *err) {
    set_defaults(o);
    const char *given[NUM_OPTIONS] = {0}; /* the value of each flag seen: a second one is an error, not a winner */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            if (err) moe_train_options_usage(stdout);
            return 1;
        }
        const moe_flag_arg a = moe_flag_arg_split(argv[i]);
        const opt_spec *s = find(a.name);
        if (!s) return unknown_flag(a.name, err), -1;
        const int has_value = a.value || moe_flag_arg_next_is_value(argc, argv, i);
        if (!has_value && !s->implicit) return moe_train_complain(err, "moe-train: %s needs a value\n", a.name), -1;
        const char *value = a.value ? a.value : has_value ? argv[++i] : s->implicit;
        const char **seen = &given[s - kOptions];
        if (*seen)
            return moe_train_complain(err, "moe-train: %s given twice ('%s', then '%s'): give it once\n", s->name, *seen, value),
                   -1;
        *seen = value;
        if (moe_train_option_set(o, s, value, MOE_OPTION_FLAG, s->name, err)) return -1;
    }
    return 0;
}

int moe_train_options_parse(int argc, char **argv, int world_size, moe_train_options *o, FILE *err) {
    int rc = moe_train_options_parse_flags(argc, argv, o, err);
    return rc ? rc : moe_train_options_finish(o, world_size, err);
}

void moe_train_option_format(const moe_train_options *o, const moe_train_option *s, int quote_strings, char *out,
                             size_t nbytes) {
    const void *field = (const char *)o + s->offset;
    const int i = *(const int *)field;
    switch (s->kind) {
    case OPT_INT: /* a negative default is decided from other flags (see moe_train_options_finish) */
        if (i < 0) snprintf(out, nbytes, "auto");
        else snprintf(out, nbytes, "%d", i);
        break;
    case OPT_FLOAT:
        if (moe_train_option_undecided(o, s)) snprintf(out, nbytes, "auto"); /* --min-lr's: from --lr */
        else moe_format_float(*(const float *)field, out, nbytes);
        break;
    case OPT_STRING: snprintf(out, nbytes, quote_strings ? "'%s'" : "%s", *(const char *const *)field); break;
    case OPT_CHOICE: snprintf(out, nbytes, "%s", i < 0 ? "auto" : s->choices[i]); break;
    }
}

static void print_value(const opt_spec *s, const moe_train_options *o, FILE *f) {
    char text[4096];
    moe_train_option_format(o, s, 1, text, sizeof text);
    fputs(text, f);
}

void moe_train_options_usage(FILE *f) {
    moe_train_options d;
    set_defaults(&d);
    fprintf(f, "usage: mpirun -np N moe-train [flags]   (each flag as --flag value or --flag=value)\n"
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

moe_pipeline_split moe_train_pipeline_split(const moe_train_options *o) {
    return (moe_pipeline_split){.pp = o->pp, .chunks = o->virtual_stages, .first_layers = o->first_stage_layers,
                                .last_layers = o->last_stage_layers};
}

moe_train_memory moe_train_options_memory(const moe_train_options *o, int world_size) {
    const moe_plan_model model = moe_plan_model_from_config(&o->model);
    const int stage_ranks = world_size / o->pp; /* the batch is split over a stage's ranks */
    const moe_plan_layout layout = {.world = world_size,
                                    .ep = o->ep,
                                    .pp = o->pp,
                                    .virtual_stages = o->virtual_stages,
                                    .first_stage_layers = o->first_stage_layers,
                                    .last_stage_layers = o->last_stage_layers,
                                    .zero = o->zero,
                                    /* --tp: a tensor group's sequences, each rank holding its blocks of the
                                       weights and its slice of the tokens (the planner's tp; until 2026-12-07 its
                                       tp 1 over the group's sequences: 3.8x the measured peak at tp 4, refusing
                                       what fits, a probe) */
                                    .tp = o->tp,
                                    .micro_batch = o->batch / (stage_ranks / o->tp),
                                    .seq_len = o->model.seq_len,
                                    .bf16 = o->model.moe.precision == MOE_PRECISION_BF16,
                                    .cpu = o->device == MOE_TRAIN_DEVICE_CPU,
                                    .attention = o->model.attention == MOE_ATTENTION_FUSED
                                                     ? MOE_PLAN_ATTENTION_FUSED
                                                     : MOE_PLAN_ATTENTION_MATERIALIZED,
                                    .recompute = o->model.moe.recompute,
                                    .accum_steps = o->micro_batches,
                                    .local_shards = o->model.moe.num_shards / stage_ranks};
    const moe_plan_memory p = moe_plan_model_memory(&model, &layout);
    moe_train_memory m = {.params = p.weights + p.masters + p.gradients,
                          .moments = p.optimizer,
                          .activations = p.activations + p.exchange,
                          .process = MOE_TRAIN_PROCESS_BYTES + p.reduce_scratch};
    m.total = m.params + m.moments + m.activations + m.process;
    return m;
}
