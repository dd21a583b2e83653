/* plan/options.c — moe-plan's flag table, parser and the model, cluster and run it builds (plan/options.h). */
#include "plan/options.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "core/fail.h"
#include "core/flag_arg.h"
#include "plan/hf.h"

typedef enum { F_INT, F_NUM, F_CHOICE, F_STRING, F_SWITCH } flag_kind;

typedef struct {
    const char *name, *help;
    flag_kind kind;
    double lo, hi;
    const char *choices[4];
    const char *default_text; /* what --help says */
    int shape;                /* 1: a model shape flag (moe-train's), which --hf-config replaces */
} flag_spec;

static const flag_spec kFlags[] = {
    /* model: moe-train's shape flags, or a Hugging Face config */
    {"--hf-config", "config.json of a Hugging Face Mixtral, Qwen3-MoE, Qwen2-MoE, OLMoE, DeepSeek-V2 or DeepSeek-V3 "
                    "model, or of a moe-train checkpoint", F_STRING, 0, 0, {0}, "none", 0},
    {"--layers", "decoder layers", F_INT, 1, 1 << 20, {0}, "moe-train's 4", 1},
    {"--d-model", "model width", F_INT, 2, 1 << 24, {0}, "128", 1},
    {"--heads", "attention heads (head_dim = d_model / heads)", F_INT, 1, 1 << 16, {0}, "4", 1},
    {"--kv-heads", "key/value heads, divides --heads", F_INT, 1, 1 << 16, {0}, "--heads", 1},
    {"--d-ff", "hidden width of each expert and of dense FFNs", F_INT, 1, 1 << 24, {0}, "256", 1},
    {"--vocab", "vocabulary size", F_INT, 2, 1 << 24, {0}, "256", 1},
    {"--tie-embeddings", "1: lm_head shares the embedding matrix", F_INT, 0, 1, {0}, "0", 1},
    {"--experts", "experts per MoE layer (1: a dense model)", F_INT, 1, 1 << 16, {0}, "8", 1},
    {"--top-k", "experts per token", F_INT, 1, 1 << 16, {0}, "2", 1},
    {"--moe-every", "every n-th FFN is an MoE layer", F_INT, 1, 1 << 20, {0}, "1", 1},
    {"--capacity-factor", "slots per expert = ceil(cf * tokens * k / E); <= 0: dropless", F_NUM, -1, 1e6, {0}, "0", 0},
    /* layout */
    {"--ep", "expert-parallel group size (divides the GPUs and the experts)", F_INT, 1, 1 << 20, {0}, "1", 0},
    {"--dp", "data-parallel size; must be GPUs / (--pp x --ep x --tp)", F_INT, 1, 1 << 20, {0}, "GPUs / (pp x ep x tp)",
     0},
    {"--tp", "tensor-parallel size, innermost: Megatron-LM's tensor parallelism with sequence parallelism (the "
     "attention by heads, dense FFNs by d_ff, the vocabulary by rows; the MoE layers take each GPU's tokens), a power "
     "of two dividing --gpus-per-node; moe-train's --tp runs on the CPU so far (issue 28): this plans what it runs "
     "on GPUs", F_INT, 1,
     1 << 20, {0}, "1; --search tries each", 0},
    {"--pp", "pipeline stages (as moe-train --pp): divides the GPUs (and the layers, unless --first-stage-layers / "
     "--last-stage-layers give the ends theirs); each stage is GPUs / pp of them holding layers / pp layers, run by "
     "the 1F1B schedule", F_INT, 1, 1 << 20, {0}, "1; --search tries each", 0},
    {"--virtual-stages", "model chunks per pipeline stage (as moe-train --virtual-stages): above 1, the interleaved "
     "1F1B schedule; pp x V divides the layers, micro-batches a multiple of pp; needs --pp above 1", F_INT, 1, 1 << 20,
     {0}, "1; --search tries each", 0},
    {"--first-stage-layers", "with --pp: the first stage's layers (as moe-train --first-stage-layers: the stages "
     "between the ends an equal share of the rest; for a model whose layers pp does not divide)", F_INT, 0, 1 << 20,
     {0}, "an equal share; --search picks uneven ends where pp does not divide the layers", 0},
    {"--last-stage-layers", "with --pp: the last stage's layers (as moe-train --last-stage-layers)", F_INT, 0, 1 << 20,
     {0}, "an equal share", 0},
    {"--zero", "as moe-train --zero: 1, ZeRO-1 (AdamW moments sharded: the dense over the GPUs, a GPU's experts over "
     "the GPUs holding the same experts); 2, ZeRO-2 (the gradients too: one layer's window reduce-scattered per "
     "micro-batch into a shard; needs the world-invariant sums: a power-of-two number of GPUs, at most 64 shards)",
     F_INT, 0, 2, {0}, "0; --search tries each", 0},
    {"--shards", "as moe-train --shards: the world-invariant sums' virtual shards of the batch, a power of two that "
     "the GPUs divide and that divides GPUs x micro-batch (more than 64 GPUs need it for --zero 2); 0: the sums off",
     F_INT, 0, 1 << 30, {0}, "moe-train's: the largest power of two dividing GPUs x micro-batch, at most 64", 0},
    {"--micro-batch", "sequences per GPU per micro-batch", F_INT, 1, 1 << 20, {0}, "1", 0},
    {"--seq-len", "tokens per sequence", F_INT, 1, 1 << 24, {0}, "128; 4096 with --hf-config", 0},
    {"--global-batch", "sequences per optimizer step (a multiple of GPUs x micro-batch)", F_INT, 1, 1e12, {0},
     "GPUs x micro-batch", 0},
    {"--precision", "GEMM inputs and exchanged rows (fp32 masters either way)", F_CHOICE, 0, 0, {"bf16", "fp32"}, "bf16", 0},
    {"--attention", "what attention keeps: a fused kernel's row statistics (moe-train's default) or the S x S "
     "probabilities", F_CHOICE, 0, 0, {"materialized", "fused"}, "fused", 0},
    {"--recompute", "what backward recomputes (moe-train --recompute): memory saved, forward work added to the step "
     "(not to MFU)", F_CHOICE, 0, 0, {"none", "attention", "moe", "full"}, "none; --search tries each", 0},
    {"--workspace-gib", "per GPU for libraries, CUDA context and allocator slack (GiB)", F_NUM, 0, 1e6, {0}, "1", 0},
    /* cluster */
    {"--gpus-per-node", "GPUs (ranks) per node", F_INT, 1, 1 << 16, {0}, "8", 0},
    {"--nodes", "nodes", F_INT, 1, 1 << 20, {0}, "1", 0},
    {"--gpu-flops", "peak GEMM TFLOP/s of one GPU at --precision", F_NUM, 1e-9, 1e9, {0},
     "989.4 (H100 SXM bf16 dense), 66.9 fp32", 0},
    {"--gemm-efficiency", "fraction of --gpu-flops the GEMMs sustain", F_NUM, 1e-6, 1, {0}, "0.7", 0},
    {"--non-gemm-overhead", "time outside GEMMs as a fraction of GEMM time", F_NUM, 0, 1e6, {0}, "0.25", 0},
    {"--gpu-memory", "memory of one GPU (GB, 1e9 bytes)", F_NUM, 1e-6, 1e9, {0}, "80", 0},
    {"--mem-bw", "memory bandwidth of one GPU (GB/s; bounds the optimizer step)", F_NUM, 1e-6, 1e9, {0}, "3350", 0},
    {"--intra-bw", "GB/s one GPU sends to peers on its node (NVLink, each way)", F_NUM, 1e-6, 1e9, {0}, "450", 0},
    {"--intra-latency", "µs per collective step inside a node", F_NUM, 0, 1e9, {0}, "5", 0},
    {"--inter-bw", "GB/s one GPU sends to other nodes (its NIC: 400 Gb/s InfiniBand)", F_NUM, 1e-6, 1e9, {0}, "50", 0},
    {"--inter-latency", "µs per collective step between nodes", F_NUM, 0, 1e9, {0}, "10", 0},
    /* measured calibrations (CPU: bench/bench_model_dense's json "dense_us_per_token", "optimizer_ns_per_param") */
    {"--dense-us-per-token", "measured µs per token of the dense path's forward + backward on one GPU (all but the "
     "MoE layers); replaces its FLOPs / GEMM rate", F_NUM, 1e-12, 1e12, {0}, "none: from --gpu-flops", 0},
    {"--optimizer-ns-per-param", "measured ns per parameter of the optimizer step (fp32, every parameter updated); "
     "replaces bytes / --mem-bw", F_NUM, 1e-12, 1e12, {0}, "none: from --mem-bw", 0},
    /* routing: balanced unless a run's routing or a skew is given (plan/routing.h) */
    {"--routing-from", "a moe-train metrics.jsonl (its expert_tokens) whose routing the layout's EP ranks get: each "
     "MoE layer waits for the rank whose experts got the most rows", F_STRING, 0, 0, {0}, "none: balanced", 0},
    {"--routing-skew", "the busiest EP rank's expert rows over the mean, for every ep", F_NUM, 1, 1e6, {0},
     "1 (balanced)", 0},
    /* output */
    {"--search", "rank every layout (pp, V, tp, ep, zero, recompute, micro-batch) that fits by predicted tokens/s", F_SWITCH, 0, 0,
     {0}, "off", 0},
    {"--top", "layouts --search prints", F_INT, 1, 1 << 20, {0}, "10", 0},
    {"--json", "one JSON object instead of the report", F_SWITCH, 0, 0, {0}, "off", 0},
};
#define NUM_FLAGS (sizeof kFlags / sizeof kFlags[0])

static void complain(FILE *err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(err, "moe-plan: ");
    vfprintf(err, fmt, ap);
    fprintf(err, "\n");
    va_end(ap);
}

static int find(const char *name) {
    for (size_t i = 0; i < NUM_FLAGS; i++)
        if (!strcmp(kFlags[i].name, name)) return (int)i;
    return -1;
}

/* Checks one value against its flag; 0 or -1 with the message written. */
static int check_value(const flag_spec *s, const char *v, FILE *err) {
    if (s->kind == F_SWITCH) return 0;
    if (s->kind == F_STRING) return *v ? 0 : (complain(err, "%s needs a non-empty value", s->name), -1);
    if (s->kind == F_CHOICE) {
        char words[160] = "";
        for (int c = 0; c < 4 && s->choices[c]; c++) {
            if (!strcmp(v, s->choices[c])) return 0;
            const int last = c == 3 || !s->choices[c + 1];
            snprintf(words + strlen(words), sizeof words - strlen(words), "%s%s", c == 0 ? "" : last ? " or " : ", ",
                     s->choices[c]);
        }
        return complain(err, "%s must be %s, got '%s'", s->name, words, v), -1;
    }
    char *end;
    errno = 0;
    const double x = s->kind == F_INT ? (double)strtoll(v, &end, 10) : strtod(v, &end);
    if (errno || end == v || *end || !isfinite(x) || x < s->lo || x > s->hi)
        return complain(err, "%s expects %s in [%.*g, %.*g], got '%s'", s->name,
                        s->kind == F_INT ? "an integer" : "a number", s->kind == F_INT ? 19 : 6, s->lo,
                        s->kind == F_INT ? 19 : 6, s->hi, v),
               -1;
    return 0;
}

typedef struct {
    const char *given[NUM_FLAGS];
} flags;

static const char *value(const flags *f, const char *name) {
    const int i = find(name);
    return i >= 0 ? f->given[i] : NULL;
}
static double num(const flags *f, const char *name, double fallback) {
    const char *v = value(f, name);
    return v ? strtod(v, NULL) : fallback;
}
static int64_t integer(const flags *f, const char *name, int64_t fallback) {
    const char *v = value(f, name);
    return v ? (int64_t)strtoll(v, NULL, 10) : fallback;
}

static void usage(FILE *out) {
    fprintf(out, "usage: moe-plan [flags]   (each flag as --flag value or --flag=value)\n"
                 "Predicts parameters, per-GPU memory, traffic, step time, tokens/s and MFU of training an MoE model\n"
                 "with moe-train on a GPU cluster (formulas and sources: docs/SCALING.md).\n\n");
    for (size_t i = 0; i < NUM_FLAGS; i++)
        fprintf(out, "  %-20s %s (default %s)\n", kFlags[i].name, kFlags[i].help, kFlags[i].default_text);
}

static int build_model(const flags *f, moe_plan_options *o, FILE *err) {
    o->hf_config = value(f, "--hf-config");
    if (o->hf_config) {
        for (size_t i = 0; i < NUM_FLAGS; i++)
            if (kFlags[i].shape && f->given[i])
                return complain(err, "%s cannot be combined with --hf-config (the config gives the model)", kFlags[i].name),
                       -1;
        moe_status st = moe_plan_model_from_hf_config(o->hf_config, &o->model);
        if (st != MOE_OK) return complain(err, "%s", moe_failure_message(st)), -1;
    } else {
        moe_model_config c = moe_model_config_default();
        c.num_layers = (int)integer(f, "--layers", c.num_layers), c.d_model = (int)integer(f, "--d-model", c.d_model);
        c.num_heads = (int)integer(f, "--heads", c.num_heads);
        c.num_kv_heads = (int)integer(f, "--kv-heads", c.num_heads);
        c.d_ff = (int)integer(f, "--d-ff", c.d_ff), c.vocab_size = (int)integer(f, "--vocab", c.vocab_size);
        c.tie_embeddings = (int)integer(f, "--tie-embeddings", c.tie_embeddings);
        c.moe.num_experts = (int)integer(f, "--experts", c.moe.num_experts);
        c.moe.top_k = (int)integer(f, "--top-k", c.moe.top_k), c.moe_every = (int)integer(f, "--moe-every", c.moe_every);
        if (c.d_model % c.num_heads)
            return complain(err, "--heads %d must divide --d-model %d (head_dim = d_model / heads)", c.num_heads,
                            c.d_model), -1;
        o->model = moe_plan_model_from_config(&c);
    }
    o->model.capacity_factor = (float)num(f, "--capacity-factor", moe_model_config_default().moe.capacity_factor);
    const char *problem = moe_plan_model_problem(&o->model);
    if (problem) return complain(err, "invalid model%s%s: %s", o->hf_config ? " in " : "",
                                 o->hf_config ? o->hf_config : "", problem), -1;
    return 0;
}

/* --routing-from (its experts must be the model's) or --routing-skew into the run; balanced without either. */
static int read_routing(const flags *f, moe_plan_options *o, FILE *err) {
    const char *path = value(f, "--routing-from");
    o->run.layout.routing_skew = num(f, "--routing-skew", 1);
    if (!path) return 0;
    if (value(f, "--routing-skew"))
        return complain(err, "--routing-from and --routing-skew both give the routing: give one"), -1;
    moe_status st = moe_plan_routing_load(path, &o->routing);
    if (st != MOE_OK) return complain(err, "%s", moe_failure_message(st)), -1;
    if (o->routing.num_experts != o->model.num_experts)
        return complain(err, "%s routes over %lld experts, the model has %lld", path,
                        (long long)o->routing.num_experts, (long long)o->model.num_experts), -1;
    return 0;
}

static int build_cluster_and_run(const flags *f, moe_plan_options *o, FILE *err) {
    const int bf16 = !value(f, "--precision") || !strcmp(value(f, "--precision"), "bf16");
    moe_plan_cluster *c = &o->cluster;
    *c = moe_plan_cluster_h100(bf16);
    c->gpus_per_node = integer(f, "--gpus-per-node", c->gpus_per_node), c->nodes = integer(f, "--nodes", c->nodes);
    c->gpu_flops = num(f, "--gpu-flops", c->gpu_flops / 1e12) * 1e12;
    c->gemm_efficiency = num(f, "--gemm-efficiency", c->gemm_efficiency);
    c->non_gemm_overhead = num(f, "--non-gemm-overhead", c->non_gemm_overhead);
    c->gpu_memory = num(f, "--gpu-memory", c->gpu_memory / 1e9) * 1e9;
    c->mem_bw = num(f, "--mem-bw", c->mem_bw / 1e9) * 1e9;
    c->intra_bw = num(f, "--intra-bw", c->intra_bw / 1e9) * 1e9, c->inter_bw = num(f, "--inter-bw", c->inter_bw / 1e9) * 1e9;
    c->intra_latency = num(f, "--intra-latency", c->intra_latency * 1e6) * 1e-6;
    c->inter_latency = num(f, "--inter-latency", c->inter_latency * 1e6) * 1e-6;
    c->dense_s_per_token = num(f, "--dense-us-per-token", 0) * 1e-6;
    c->optimizer_s_per_param = num(f, "--optimizer-ns-per-param", 0) * 1e-9;
    const char *problem = moe_plan_cluster_problem(c);
    if (problem) return complain(err, "%s", problem), -1;

    moe_plan_layout *l = &o->run.layout;
    l->world = c->gpus_per_node * c->nodes;
    l->ep = integer(f, "--ep", 1), l->zero = (int)integer(f, "--zero", 0);
    l->pp = integer(f, "--pp", 1), l->virtual_stages = integer(f, "--virtual-stages", 1), l->tp = integer(f, "--tp", 1);
    l->first_stage_layers = integer(f, "--first-stage-layers", 0);
    l->last_stage_layers = integer(f, "--last-stage-layers", 0);
    if (l->world % l->pp)
        return complain(err, "--pp %lld must divide the %lld GPUs (each stage is GPUs / pp of them)", (long long)l->pp,
                        (long long)l->world), -1;
    if ((l->world / l->pp) % l->tp)
        return complain(err, "--tp %lld must divide the %lld GPUs of a pipeline stage", (long long)l->tp,
                        (long long)(l->world / l->pp)), -1;
    const int64_t stage_ranks = l->world / l->pp, data_ranks = stage_ranks / l->tp; /* reading distinct sequences */
    l->micro_batch = integer(f, "--micro-batch", 1), l->seq_len = integer(f, "--seq-len", o->hf_config ? 4096 : 128);
    l->bf16 = bf16;
    l->attention = value(f, "--attention") && !strcmp(value(f, "--attention"), "materialized")
                       ? MOE_PLAN_ATTENTION_MATERIALIZED
                       : MOE_PLAN_ATTENTION_FUSED;
    static const char *const recompute[] = {"none", "attention", "moe", "full"};
    for (int i = 0; i < 4; i++)
        if (value(f, "--recompute") && !strcmp(value(f, "--recompute"), recompute[i])) l->recompute = (moe_recompute)i;
    l->workspace_bytes = num(f, "--workspace-gib", 1) * 1073741824.0;
    l->local_shards = -1; /* moe-train's default world-invariant sums, for whatever micro-batch the layout has */
    if (value(f, "--shards")) { /* a multiple of the world: its shards per GPU, for any micro-batch they divide */
        const int64_t S = integer(f, "--shards", 0);
        if (S && ((S & (S - 1)) || S % stage_ranks))
            return complain(err, "--shards %lld must be 0 or a power of two that the %lld GPUs%s divide (as "
                            "moe-train's)", (long long)S, (long long)stage_ranks,
                            l->pp > 1 ? " of a pipeline stage" : ""), -1;
        l->local_shards = S / data_ranks;
    }
    o->run.global_batch = integer(f, "--global-batch", l->world / l->tp * l->micro_batch);
    if (read_routing(f, o, err)) return -1;
    if (o->search) {
        const char *fixed[] = {"--ep", "--dp", "--zero", "--micro-batch", "--recompute", "--pp", "--virtual-stages",
                               "--tp", "--first-stage-layers", "--last-stage-layers"};
        for (int i = 0; i < 10; i++)
            if (value(f, fixed[i]))
                return complain(err, "--search tries every --ep, --pp, --virtual-stages, --tp, --zero, --micro-batch "
                                "and --recompute itself (and the pipeline's uneven ends, --first-stage-layers and "
                                "--last-stage-layers, where pp does not divide the layers): leave out %s",
                                fixed[i]), -1;
        if (l->world > ((int64_t)1 << 20)) /* the layouts tried grow with the GPUs: DeepSeek-V3 at 2^24 took 11.5 s */
            return complain(err, "--search ranks layouts of at most 2^20 (1048576) GPUs, not %lld: plan a layout of "
                            "them by --ep, --pp and --tp", (long long)l->world), -1;
        l->pp = 1, l->virtual_stages = 1, l->tp = 1;
        int64_t pp = 1; /* the batch must split over the GPUs of a stage for some pipeline */
        moe_plan_layout cut = *l;
        while (pp <= l->world && (l->world % pp || (cut.pp = pp, !moe_plan_layout_cut_layers(&o->model, &cut)) ||
                                  o->run.global_batch % (l->world / pp)))
            pp++;
        if (pp > l->world)
            return complain(err, "--global-batch %lld must be a multiple of the %lld GPUs, or of the GPUs of a stage "
                            "(GPUs / --pp for a pp dividing the GPUs that can cut the layers)",
                            (long long)o->run.global_batch, (long long)l->world), -1;
        return 0;
    }
    if (value(f, "--dp") && (data_ranks % l->ep || integer(f, "--dp", 0) != data_ranks / l->ep))
        return complain(err, "--dp %lld with --ep %lld, --pp %lld and --tp %lld on %lld GPUs: pp x dp x ep x tp must be "
                        "the number of GPUs", (long long)integer(f, "--dp", 0), (long long)l->ep, (long long)l->pp,
                        (long long)l->tp, (long long)l->world), -1;
    problem = moe_plan_run_problem(&o->model, c, &o->run);
    if (!problem && o->routing.num_samples) l->routing_skew = moe_plan_routing_skew(&o->routing, l->ep);
    if (problem)
        return complain(err, "%s (GPUs %lld, layers %lld, experts %lld, --pp %lld, --virtual-stages %lld, --tp %lld, "
                        "--ep %lld, --micro-batch %lld, --global-batch %lld)", problem, (long long)l->world,
                        (long long)o->model.num_layers, (long long)o->model.num_experts, (long long)l->pp,
                        (long long)l->virtual_stages, (long long)l->tp, (long long)l->ep, (long long)l->micro_batch,
                        (long long)o->run.global_batch), -1;
    return 0;
}

int moe_plan_options_parse(int argc, char **argv, moe_plan_options *o, FILE *out, FILE *err) {
    memset(o, 0, sizeof *o);
    flags f = {{0}};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return usage(out), 1;
        const moe_flag_arg a = moe_flag_arg_split(argv[i]);
        const int k = find(a.name);
        if (k < 0) {
            const char *names[NUM_FLAGS];
            char hint[256];
            for (size_t j = 0; j < NUM_FLAGS; j++) names[j] = kFlags[j].name;
            moe_flag_arg_hint(a.name, names, (int)NUM_FLAGS, hint, sizeof hint);
            return complain(err, "unknown flag '%s'%s (see --help)", a.name, hint), -1;
        }
        const flag_spec *s = &kFlags[k];
        const char *v = "1";
        if (s->kind == F_SWITCH && a.value) return complain(err, "%s takes no value", s->name), -1;
        if (s->kind != F_SWITCH) {
            if (!a.value && !moe_flag_arg_next_is_value(argc, argv, i))
                return complain(err, "%s needs a value", s->name), -1;
            v = a.value ? a.value : argv[++i];
        }
        if (f.given[k]) return complain(err, "%s given twice ('%s', then '%s'): give it once", s->name, f.given[k], v), -1;
        if (check_value(s, v, err)) return -1;
        f.given[k] = v;
    }
    o->search = value(&f, "--search") != NULL, o->json = value(&f, "--json") != NULL;
    o->top = (int)integer(&f, "--top", 10);
    if (value(&f, "--top") && !o->search) return complain(err, "--top needs --search"), -1;
    if (build_model(&f, o, err)) return -1;
    if (build_cluster_and_run(&f, o, err)) return moe_plan_options_free(o), -1;
    return 0;
}

void moe_plan_options_free(moe_plan_options *o) { moe_plan_routing_free(&o->routing); }
