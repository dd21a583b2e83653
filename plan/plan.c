/* plan/plan.c — moe-plan: how a Mixtral-architecture MoE model would train with moe-train on a GPU cluster, before
 * anyone books one: parameters, per-GPU memory, bytes moved, predicted step time, tokens/s and MFU for one layout,
 * or (--search) every layout ranked. Flags: plan/options.h; formulas: docs/SCALING.md.
 *
 *   build/moe-plan --hf-config tests/plan_configs/mixtral-8x7b.json --nodes 8 --search
 *   build/moe-plan --layers 16 --d-model 1024 --experts 16 --gpus-per-node 8 --ep 8 --micro-batch 4 --json */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan/options.h"
#include "plan/pipeline.h"
#include "plan/search.h"

static const double GiB = 1073741824.0;

/* How the layout reduces its gradients: once per step, or ZeRO-2's per micro-batch into shards. */
static const char *gradient_reduction(const moe_plan_layout *l) {
    return l->zero == 2 ? "reduce-scatter" : "all-reduce";
}

/* The largest of the step's serial terms: what a faster GPU, network or smaller model would have to fix. */
static const char *limit_of(const moe_plan_layout *l, const moe_plan_prediction *p) {
    const struct { double s; const char *what; } t[] = {{p->compute_s, "compute"},
                                                       {p->alltoall_s, "all-to-all bandwidth"},
                                                       {p->allreduce_s, l->zero == 2 ? "gradient reduce-scatter"
                                                                                     : "gradient all-reduce"},
                                                       {p->control_s, "routing control latency"},
                                                       {p->optimizer_s, "optimizer memory bandwidth"},
                                                       {p->bubble_s, "pipeline bubble"},
                                                       {p->p2p_s, "pipeline sends"},
                                                       {p->tp_s, "tensor-parallel collectives"}};
    int best = 0;
    for (int i = 1; i < (int)(sizeof t / sizeof *t); i++)
        if (t[i].s > t[best].s) best = i;
    return t[best].what;
}

static void print_model(const moe_plan_options *o, const char **notes, int num_notes) {
    const moe_plan_model *m = &o->model;
    const moe_plan_params p = moe_plan_model_params(m);
    printf("model: %s\n", o->hf_config ? o->hf_config : "moe-train's shape flags");
    printf("  layers %lld (%lld MoE), d_model %lld, heads %lld x head_dim %lld, kv heads %lld, experts %lld top-%lld, "
           "d_ff %lld (dense %lld), vocab %lld, %s embeddings%s%s\n",
           (long long)m->num_layers, (long long)moe_plan_model_num_moe_layers(m), (long long)m->d_model,
           (long long)m->num_heads, (long long)m->head_dim, (long long)m->num_kv_heads, (long long)m->num_experts,
           (long long)m->top_k, (long long)m->d_ff_expert, (long long)m->d_ff_dense, (long long)m->vocab_size,
           m->tie_embeddings ? "tied" : "untied", m->qk_norm ? ", q/k norms" : "",
           m->d_ff_shared ? ", a shared expert" : "");
    printf("parameters: total %lld (%.2fB), active %lld (%.2fB); dense %lld, experts %lld\n", (long long)p.total,
           p.total / 1e9, (long long)p.active, p.active / 1e9, (long long)p.dense, (long long)p.expert);
    for (int i = 0; i < num_notes; i++) printf("note: moe-train cannot train this model as it is: %s\n", notes[i]);
    if (m->num_experts > 1 && moe_plan_model_num_moe_layers(m) == 0) /* --moe-every or the dense layers past them all */
        printf("note: no layer is an MoE layer (--moe-every %lld, --first-dense-layers %lld of %lld layers): a dense "
               "model, its %lld experts unused\n", (long long)m->moe_every, (long long)m->first_dense,
               (long long)m->num_layers, (long long)m->num_experts);
}

/* The data-parallel size: GPUs / (pp x ep x tp) (pipeline/grid.h). */
static long long dp_of(const moe_plan_layout *l) { return (long long)(moe_plan_layout_data_ranks(l) / l->ep); }
/* The GPUs holding the same experts, over which their gradients are summed: dp x tp (the GPUs of a tensor-parallel
 * group feed their experts distinct tokens). */
static long long expert_dp_of(const moe_plan_layout *l) { return (long long)(moe_plan_layout_stage_ranks(l) / l->ep); }

/* The stage whose memory p reports, under the layout with p's micro-batches. */
static moe_plan_stage stage_of(const moe_plan_options *o, const moe_plan_layout *l, const moe_plan_prediction *p) {
    moe_plan_layout with_steps = *l;
    with_steps.accum_steps = p->accum_steps;
    return moe_plan_pipeline_stage(&o->model, &with_steps, p->memory.stage);
}

static const char *recompute_name(moe_recompute r) {
    static const char *const names[] = {"none", "attention", "moe", "full"};
    return names[r];
}

/* The layout as moe-train's flags (a probe: the planner speaks Megatron's per-GPU micro-batch and global batch,
 * moe-train its global sequences per micro-batch and their count, and nothing translated): --batch is the micro-batch
 * of every data rank of a stage, world / (pp tp) of them. The model's own flags (or --init-from) are the user's. */
static void moe_train_flags(const moe_plan_run *r, const moe_plan_prediction *p, char *out, size_t n) {
    const moe_plan_layout *l = &r->layout;
    int at = snprintf(out, n, "mpirun -np %lld moe-train --ep %lld", (long long)l->world, (long long)l->ep);
    if (moe_plan_layout_pp(l) > 1)
        at += snprintf(out + at, n - at, " --pp %lld --virtual-stages %lld", (long long)moe_plan_layout_pp(l),
                       (long long)moe_plan_layout_virtual_stages(l));
    if (moe_plan_layout_pp(l) > 1 && l->first_stage_layers)
        at += snprintf(out + at, n - at, " --first-stage-layers %lld", (long long)l->first_stage_layers);
    if (moe_plan_layout_pp(l) > 1 && l->last_stage_layers)
        at += snprintf(out + at, n - at, " --last-stage-layers %lld", (long long)l->last_stage_layers);
    if (moe_plan_layout_tp(l) > 1) at += snprintf(out + at, n - at, " --tp %lld", (long long)moe_plan_layout_tp(l));
    snprintf(out + at, n - at, " --zero %d --batch %lld --micro-batches %lld --seq-len %lld --precision %s --attention "
             "%s --recompute %s", l->zero, (long long)(l->micro_batch * moe_plan_layout_data_ranks(l)),
             (long long)p->accum_steps, (long long)l->seq_len, l->bf16 ? "bf16" : "fp32",
             l->attention == MOE_PLAN_ATTENTION_FUSED ? "fused" : "materialized", recompute_name(l->recompute));
}

static void print_prediction(const moe_plan_options *o, const moe_plan_run *r, const moe_plan_prediction *p) {
    const moe_plan_layout *l = &r->layout;
    const moe_plan_cluster *c = &o->cluster;
    const moe_plan_params par = moe_plan_model_params(&o->model);
    printf("FLOPs per token: 6 x %lld + 12 x L x (H x head_dim) x S = %.4g (PaLM / Megatron-LM formula)",
           (long long)par.matmul_active, p->flops_per_token);
    if (p->recompute_flops_per_token > 0)
        printf("; recompute %s adds %.4g (hardware FLOPs, in the step time, not in MFU)", recompute_name(l->recompute),
               p->recompute_flops_per_token);
    printf("\n");
    char pipeline[128] = "";
    if (moe_plan_layout_pp(l) > 1)
        snprintf(pipeline, sizeof pipeline, "pp %lld x %lld virtual stage%s, ", (long long)moe_plan_layout_pp(l),
                 (long long)moe_plan_layout_virtual_stages(l), moe_plan_layout_virtual_stages(l) > 1 ? "s" : "");
    if (moe_plan_layout_pp(l) > 1 && (l->first_stage_layers || l->last_stage_layers)) /* uneven ends */
        snprintf(pipeline + strlen(pipeline) - 2, sizeof pipeline - strlen(pipeline) + 2,
                 " (layers: first stage %lld, last %lld), ", (long long)moe_plan_pipeline_stage(&o->model, l, 0).layers,
                 (long long)moe_plan_pipeline_stage(&o->model, l, moe_plan_layout_pp(l) - 1).layers);
    if (moe_plan_layout_tp(l) > 1)
        snprintf(pipeline + strlen(pipeline), sizeof pipeline - strlen(pipeline), "tp %lld (with sequence parallelism), ",
                 (long long)moe_plan_layout_tp(l));
    printf("layout: %lld GPUs (%lld nodes x %lld), %sep %lld, dp %lld, ZeRO-%d, micro-batch %lld x %lld tokens, %lld "
           "micro-batches per step, global batch %lld sequences, %s, %s attention, recompute %s\n",
           (long long)l->world, (long long)c->nodes, (long long)c->gpus_per_node, pipeline, (long long)l->ep,
           dp_of(l), l->zero, (long long)l->micro_batch, (long long)l->seq_len,
           (long long)p->accum_steps, (long long)r->global_batch, l->bf16 ? "bf16" : "fp32",
           l->attention == MOE_PLAN_ATTENTION_FUSED ? "fused" : "materialized", recompute_name(l->recompute));
    char flags[512];
    moe_train_flags(r, p, flags, sizeof flags);
    printf("as moe-train flags (with the model's): %s\n", flags);
    if (moe_plan_layout_tp(l) > 1)
        printf("note: this plans Megatron-LM's tensor parallelism with sequence parallelism; moe-train's --tp runs it "
               "on the CPU (issue 28: CUDA built, not yet run on a GPU; it keeps a dense FFN's norm output, the final "
               "norm's, two scratch buffers and MLA's latent scratch gathered over the group, more than planned "
               "here)\n");
    const moe_plan_memory *m = &p->memory;
    const moe_plan_stage stage = stage_of(o, l, p);
    if (moe_plan_layout_pp(l) > 1)
        printf("pipeline: the largest stage is %lld of 0..%lld (%lld layers, %lld MoE%s%s), keeping %.4g micro-batches' "
               "activations at its schedule's peak; bubble (pp - 1)/(V m) = %.4g of the pipelined time; sends %.3f GB "
               "per GPU per step %s\n", (long long)m->stage, (long long)moe_plan_layout_pp(l) - 1,
               (long long)stage.layers, (long long)stage.moe_layers, stage.embedding ? ", the embedding" : "",
               stage.head ? ", the final norm and lm_head" : "", stage.in_flight, p->bubble_fraction,
               p->p2p_bytes / 1e9, p->pipeline_spans_nodes ? "across nodes" : "inside a node");
    printf("memory per GPU (GiB): weights %.2f, fp32 masters %.2f, gradients %.2f, optimizer %.2f, activations %.2f, "
           "all-to-all buffers %.2f, gradient-sum scratch %.2f, workspace %.2f; total %.2f of %.2f: %s\n",
           m->weights / GiB, m->masters / GiB, m->gradients / GiB, m->optimizer / GiB, m->activations / GiB,
           m->exchange / GiB, m->reduce_scratch / GiB, m->workspace / GiB, m->total / GiB, c->gpu_memory / GiB,
           p->fits ? "fits" : "DOES NOT FIT");
    if (l->zero == 2) {
        const moe_plan_gradient_buffers g = moe_plan_model_gradient_buffers(&o->model, l->ep, moe_plan_layout_tp(l));
        moe_plan_stage ends_only = stage; /* the stage's ends: its parameters without its layers */
        ends_only.layers = 0, ends_only.moe_layers = 0;
        const double ends = moe_plan_model_tp_share(&o->model, &ends_only, moe_plan_layout_tp(l)).dense;
        printf("ZeRO-2 gradients (GiB): shard %.2f (dense / %lld, experts / %lld), one layer's window %.2f, the ends "
               "(%s) %.2f\n", (m->gradients - 4.0 * ((double)g.window + ends)) / GiB,
               (long long)moe_plan_layout_data_ranks(l), expert_dp_of(l), 4.0 * (double)g.window / GiB,
               !stage.embedding && !stage.head ? "none on this stage"
               : o->model.tie_embeddings       ? "embedding, final norm"
                                               : "embedding, final norm, lm_head",
               4.0 * ends / GiB);
    }
    char how[64] = "once per step";
    if (l->zero == 2) snprintf(how, sizeof how, "per micro-batch, x %lld", (long long)p->accum_steps);
    printf("sent (= received) per GPU per step: all-to-all %.3f GB to %d peers on its node, %.3f GB to %d on others; "
           "gradient %s %s: dense %.3f GB (ring over %lld, %s), experts %.3f GB (ring over %lld, %s)",
           p->alltoall_intra_bytes / 1e9, p->alltoall_peers_intra, p->alltoall_inter_bytes / 1e9,
           p->alltoall_peers_inter, gradient_reduction(l), how, p->allreduce_dense_bytes / 1e9,
           (long long)moe_plan_layout_data_ranks(l), p->dense_group_spans_nodes ? "across nodes" : "inside a node",
           p->allreduce_expert_bytes / 1e9, expert_dp_of(l), p->expert_group_spans_nodes ? "across nodes" : "inside a node");
    if (l->zero) printf(", ZeRO-%d parameter all-gather %.3f GB", l->zero, p->zero_gather_bytes / 1e9);
    if (moe_plan_layout_tp(l) > 1)
        printf(", tensor-parallel all-gathers and reduce-scatters%s %.3f GB (inside a node)",
               o->model.qk_norm ? " (and the q/k norms' all-to-alls)" : "", p->tp_bytes / 1e9);
    printf("\n");
    if (p->routing_skew > 1)
        printf("routing skew %.3f%s: the busiest EP rank's expert rows over the mean, which its MoE work and all-to-all "
               "wait for\n", p->routing_skew, o->routing.num_samples ? " (from --routing-from)" : "");
    printf("time per step (ms): compute %.3f (dense path %.3f %s, MoE layers %.3f), optimizer %.3f (%s), all-to-all "
           "%.3f, routing control %.3f, gradient %s%s %.3f", p->compute_s * 1e3, p->compute_dense_s * 1e3,
           c->dense_s_per_token > 0 ? "measured per token" : "at the GEMM rate", p->compute_moe_s * 1e3,
           p->optimizer_s * 1e3, c->optimizer_s_per_param > 0 ? "measured per parameter" : "memory bandwidth",
           p->alltoall_s * 1e3, p->control_s * 1e3, gradient_reduction(l), l->zero ? " + all-gather" : "",
           p->allreduce_s * 1e3);
    if (moe_plan_layout_tp(l) > 1) printf(", tensor-parallel collectives %.3f", p->tp_s * 1e3);
    if (moe_plan_layout_pp(l) > 1)
        printf(", pipeline sends %.3f, bubble %.3f", p->p2p_s * 1e3, p->bubble_s * 1e3);
    printf("\n");
    printf("predicted step: %.3f ms serial (as moe-train runs), %.3f ms with exchanges overlapped; tokens/s %.4g / "
           "%.4g; MFU %.1f%% / %.1f%%; limited by %s\n",
           p->step_serial_s * 1e3, p->step_overlap_s * 1e3, p->tokens_per_s_serial, p->tokens_per_s_overlap,
           100 * p->mfu_serial, 100 * p->mfu_overlap, limit_of(l, p));
}

static json_t *prediction_json(const moe_plan_options *o, const moe_plan_run *r, const moe_plan_prediction *p) {
    const moe_plan_layout *l = &r->layout;
    const moe_plan_memory *m = &p->memory;
    const double in_flight = stage_of(o, l, p).in_flight;
    json_t *doc = json_pack("{s:I, s:I, s:I, s:i, s:I, s:I, s:I, s:I, s:s, s:s, s:f,"
                     " s:{s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f}, s:b,"
                     " s:{s:f, s:f, s:i, s:i, s:f, s:f, s:f},"
                     " s:{s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f}, s:f, s:f, s:f, s:f, s:s, s:f}",
                     "world", (json_int_t)l->world, "ep", (json_int_t)l->ep, "dp", (json_int_t)dp_of(l),
                     "zero", l->zero, "micro_batch", (json_int_t)l->micro_batch, "seq_len", (json_int_t)l->seq_len,
                     "accum_steps", (json_int_t)p->accum_steps, "global_batch", (json_int_t)r->global_batch,
                     "precision", l->bf16 ? "bf16" : "fp32", "attention",
                     l->attention == MOE_PLAN_ATTENTION_FUSED ? "fused" : "materialized", "flops_per_token",
                     p->flops_per_token, "memory_bytes", "weights", m->weights, "masters", m->masters, "gradients",
                     m->gradients, "optimizer", m->optimizer, "activations", m->activations, "exchange", m->exchange,
                     "workspace", m->workspace, "total", m->total, "fits", p->fits, "bytes_sent_per_step",
                     "alltoall_intra", p->alltoall_intra_bytes, "alltoall_inter", p->alltoall_inter_bytes,
                     "alltoall_peers_intra", p->alltoall_peers_intra, "alltoall_peers_inter", p->alltoall_peers_inter,
                     "allreduce_dense", p->allreduce_dense_bytes, "allreduce_expert", p->allreduce_expert_bytes,
                     "zero_gather", p->zero_gather_bytes, "seconds", "compute", p->compute_s, "compute_dense",
                     p->compute_dense_s, "compute_moe", p->compute_moe_s, "optimizer",
                     p->optimizer_s, "alltoall", p->alltoall_s, "control", p->control_s, "allreduce", p->allreduce_s,
                     "step_serial", p->step_serial_s, "step_overlap", p->step_overlap_s, "tokens_per_s_serial",
                     p->tokens_per_s_serial, "tokens_per_s_overlap", p->tokens_per_s_overlap, "mfu_serial",
                     p->mfu_serial, "mfu_overlap", p->mfu_overlap, "limited_by", limit_of(l, p), "routing_skew",
                     p->routing_skew);
    json_object_set_new(json_object_get(doc, "memory_bytes"), "reduce_scratch", json_real(m->reduce_scratch));
    json_object_set_new(doc, "recompute", json_string(recompute_name(l->recompute)));
    char flags[512];
    moe_train_flags(r, p, flags, sizeof flags);
    json_object_set_new(doc, "moe_train_command", json_string(flags));
    json_object_set_new(doc, "gradient_reduction", json_string(gradient_reduction(l)));
    json_object_set_new(doc, "recompute_flops_per_token", json_real(p->recompute_flops_per_token));
    /* the pipeline (pp 1: no stages, no sends, no bubble) */
    json_object_set_new(doc, "pp", json_integer((json_int_t)moe_plan_layout_pp(l)));
    json_object_set_new(doc, "virtual_stages", json_integer((json_int_t)moe_plan_layout_virtual_stages(l)));
    json_object_set_new(doc, "first_stage_layers", json_integer((json_int_t)l->first_stage_layers));
    json_object_set_new(doc, "last_stage_layers", json_integer((json_int_t)l->last_stage_layers));
    json_object_set_new(doc, "memory_stage", json_integer((json_int_t)m->stage));
    json_object_set_new(doc, "in_flight", json_real(in_flight));
    json_object_set_new(doc, "bubble_fraction", json_real(p->bubble_fraction));
    json_object_set_new(json_object_get(doc, "bytes_sent_per_step"), "p2p", json_real(p->p2p_bytes));
    json_object_set_new(json_object_get(doc, "seconds"), "p2p", json_real(p->p2p_s));
    json_object_set_new(json_object_get(doc, "seconds"), "bubble", json_real(p->bubble_s));
    /* tensor parallelism (tp 1: none of its collectives) */
    json_object_set_new(doc, "tp", json_integer((json_int_t)moe_plan_layout_tp(l)));
    json_object_set_new(doc, "expert_dp", json_integer((json_int_t)expert_dp_of(l)));
    json_object_set_new(json_object_get(doc, "bytes_sent_per_step"), "tp", json_real(p->tp_bytes));
    json_object_set_new(json_object_get(doc, "seconds"), "tp", json_real(p->tp_s));
    return doc;
}

static json_t *model_json(const moe_plan_options *o, const char **notes, int num_notes) {
    const moe_plan_model *m = &o->model;
    const moe_plan_params p = moe_plan_model_params(m);
    json_t *list = json_array();
    for (int i = 0; i < num_notes; i++) json_array_append_new(list, json_string(notes[i]));
    return json_pack("{s:s?, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:b, s:b,"
                     " s:{s:I, s:I, s:I, s:I, s:I}, s:o}",
                     "hf_config", o->hf_config, "layers", (json_int_t)m->num_layers, "moe_layers",
                     (json_int_t)moe_plan_model_num_moe_layers(m), "d_model", (json_int_t)m->d_model, "heads",
                     (json_int_t)m->num_heads, "head_dim", (json_int_t)m->head_dim, "kv_heads",
                     (json_int_t)m->num_kv_heads, "experts", (json_int_t)m->num_experts, "top_k", (json_int_t)m->top_k,
                     "d_ff", (json_int_t)m->d_ff_expert, "d_ff_dense", (json_int_t)m->d_ff_dense, "vocab",
                     (json_int_t)m->vocab_size, "tie_embeddings", m->tie_embeddings, "qk_norm", m->qk_norm,
                     "params", "total", (json_int_t)p.total, "active", (json_int_t)p.active, "dense",
                     (json_int_t)p.dense, "expert", (json_int_t)p.expert, "matmul_active", (json_int_t)p.matmul_active,
                     "unsupported", list);
}

/* The least memory a layout of pp stages (1F1B) and tensor-parallel size tp needs: ep = the largest that divides the
 * stage's GPUs reading distinct sequences and the experts, one sequence per micro-batch, recompute full, and ZeRO-1 or,
 * where it is possible and smaller, ZeRO-2 (its shard, window and ends outweigh whole gradients on few GPUs). Without a
 * pipeline the step's micro-batches are left out (no gradient accumulator counted), as before pipelines; with one they
 * set the activations in flight. */
static moe_plan_memory least_memory_at(const moe_plan_options *o, int64_t pp, int64_t tp, int64_t *ep, int *zero) {
    moe_plan_run r = o->run;
    moe_plan_layout *l = &r.layout;
    l->pp = pp, l->virtual_stages = 1, l->tp = tp;
    moe_plan_layout_cut_layers(&o->model, l);
    const int64_t data = l->world / pp / tp;
    for (int64_t e = 1; e <= data; e++)
        if (data % e == 0 && o->model.num_experts % e == 0) l->ep = e;
    l->zero = 1, l->micro_batch = 1, l->recompute = MOE_RECOMPUTE_FULL, *ep = l->ep, *zero = 1;
    if (pp > 1) l->accum_steps = r.global_batch / data;
    moe_plan_memory least = moe_plan_model_memory(&o->model, l);
    l->zero = 2;
    if (!moe_plan_run_problem(&o->model, &o->cluster, &r)) {
        const moe_plan_memory sharded = moe_plan_model_memory(&o->model, l);
        if (sharded.total < least.total) least = sharded, *zero = 2;
    }
    return least;
}

/* The least over every pipeline and tensor-parallel size the run allows (pp dividing the GPUs and the layers, enough
 * micro-batches; tp as moe_plan_run_problem allows it). */
static moe_plan_memory least_memory(const moe_plan_options *o, int64_t *pp, int64_t *tp, int64_t *ep, int *zero) {
    moe_plan_memory least = least_memory_at(o, 1, 1, ep, zero);
    *pp = 1, *tp = 1;
    for (int64_t p = 1; p <= o->run.layout.world; p++)
        for (int64_t t = 1; t <= o->cluster.gpus_per_node; t *= 2) {
            if (p == 1 && t == 1) continue;
            moe_plan_run r = o->run;
            r.layout.pp = p, r.layout.virtual_stages = 1, r.layout.tp = t, r.layout.ep = 1, r.layout.micro_batch = 1;
            r.layout.zero = 1;
            if (!moe_plan_layout_cut_layers(&o->model, &r.layout)) continue;
            if (moe_plan_run_problem(&o->model, &o->cluster, &r)) continue;
            int64_t e;
            int z;
            const moe_plan_memory m = least_memory_at(o, p, t, &e, &z);
            if (m.total < least.total) least = m, *pp = p, *tp = t, *ep = e, *zero = z;
        }
    return least;
}

static int run_search(const moe_plan_options *o, json_t *doc) {
    moe_plan_candidate *all;
    int fit, tried;
    const moe_plan_routing *routing = o->routing.num_samples ? &o->routing : NULL;
    if (moe_plan_search(&o->model, &o->cluster, &o->run, routing, &all, &fit, &tried) != MOE_OK) {
        fprintf(stderr, "moe-plan: out of memory while searching\n");
        return 1;
    }
    const int shown = fit < o->top ? fit : o->top;
    if (doc) {
        json_t *list = json_array();
        for (int i = 0; i < shown; i++) json_array_append_new(list, prediction_json(o, &all[i].run, &all[i].prediction));
        json_object_set_new(doc, "layouts_tried", json_integer(tried));
        json_object_set_new(doc, "layouts_fit", json_integer(fit));
        json_object_set_new(doc, "layouts", list);
        int64_t ep, pp, tp;
        int zero;
        const moe_plan_memory least = least_memory(o, &pp, &tp, &ep, &zero);
        json_object_set_new(doc, "least_memory", json_pack("{s:I, s:I, s:I, s:i, s:f, s:f, s:f, s:f, s:f}", "pp",
                                                           (json_int_t)pp, "tp", (json_int_t)tp, "ep", (json_int_t)ep,
                                                           "zero", zero, "total", least.total, "activations",
                                                           least.activations, "exchange", least.exchange, "optimizer",
                                                           least.optimizer, "gradients", least.gradients));
    } else {
        printf("search: %d layouts of %lld GPUs tried, %d fit in %.1f GiB; global batch %lld x %lld tokens, %s\n",
               tried, (long long)o->run.layout.world, fit, o->cluster.gpu_memory / GiB, (long long)o->run.global_batch,
               (long long)o->run.layout.seq_len, o->run.layout.bf16 ? "bf16" : "fp32");
        if (fit) printf("%4s %4s %3s %3s %6s %6s %4s %9s %6s %6s %9s %11s %12s %7s %12s %8s  %s\n", "rank", "pp", "V",
                        "tp", "ep", "dp", "zero",
                        "recompute", "micro", "accum", "mem GiB", "step ms", "tokens/s", "MFU", "overlap t/s", "MFU ovl",
                        "limited by");
        for (int i = 0; i < shown; i++) {
            const moe_plan_layout *l = &all[i].run.layout;
            const moe_plan_prediction *p = &all[i].prediction;
            printf("%4d %4lld %3lld %3lld %6lld %6lld %4d %9s %6lld %6lld %9.2f %11.3f %12.4g %6.1f%% %12.4g %7.1f%%  %s\n",
                   i + 1, (long long)moe_plan_layout_pp(l), (long long)moe_plan_layout_virtual_stages(l),
                   (long long)moe_plan_layout_tp(l), (long long)l->ep, dp_of(l), l->zero, recompute_name(l->recompute),
                   (long long)l->micro_batch,
                   (long long)p->accum_steps, p->memory.total / GiB, p->step_serial_s * 1e3, p->tokens_per_s_serial,
                   100 * p->mfu_serial, p->tokens_per_s_overlap, 100 * p->mfu_overlap, limit_of(l, p));
        }
        if (shown) {
            char flags[512];
            moe_train_flags(&all[0].run, &all[0].prediction, flags, sizeof flags);
            printf("rank 1 as moe-train flags (with the model's): %s\n", flags);
        }
        if (!fit) {
            int64_t ep, pp, tp;
            int zero;
            const moe_plan_memory m = least_memory(o, &pp, &tp, &ep, &zero);
            printf("no layout fits: the smallest (pp %lld, tp %lld, ep %lld, ZeRO-%d, recompute full, micro-batch 1) "
                   "needs %.1f GiB per GPU (activations %.1f, all-to-all buffers %.1f, optimizer %.1f, masters %.1f, "
                   "gradients %.1f, bf16 copies %.1f); use more GPUs, a larger --global-batch (more micro-batches allow "
                   "more stages) or a shorter --seq-len (sharded masters and weights are not in this project yet)\n",
                   (long long)pp, (long long)tp, (long long)ep, zero, m.total / GiB,
                   m.activations / GiB, m.exchange / GiB, m.optimizer / GiB, m.masters / GiB, m.gradients / GiB,
                   m.weights / GiB);
        }
    }
    free(all);
    return 0;
}

int main(int argc, char **argv) {
    moe_plan_options o;
    const int parsed = moe_plan_options_parse(argc, argv, &o, stdout, stderr);
    if (parsed) return parsed > 0 ? 0 : 2;
    const char *notes[8];
    const int num_notes = moe_plan_model_unsupported(&o.model, notes, 8);
    json_t *doc = o.json ? json_object() : NULL;
    if (doc) json_object_set_new(doc, "model", model_json(&o, notes, num_notes));
    else print_model(&o, notes, num_notes);
    int status = 0;
    if (o.search) {
        status = run_search(&o, doc);
    } else {
        const moe_plan_prediction p = moe_plan_predict(&o.model, &o.cluster, &o.run);
        if (doc) json_object_set_new(doc, "prediction", prediction_json(&o, &o.run, &p));
        else print_prediction(&o, &o.run, &p);
    }
    if (doc) {
        char *text = json_dumps(doc, JSON_INDENT(2) | JSON_REAL_PRECISION(10));
        if (text) printf("%s\n", text);
        else status = 1;
        free(text);
        json_decref(doc);
    }
    moe_plan_options_free(&o);
    return status;
}
