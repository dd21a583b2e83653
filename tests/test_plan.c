/* test_plan.c — moe-plan's arithmetic (plan/model.h, plan/cluster.h, plan/hf.h):
 *  - the six reference configs (tests/plan_configs/) give exact parameter counts, worked out by hand from each
 *    published config (docs/SCALING.md shows the sums), and those agree with the published totals to the digits
 *    published: Mixtral 8x7B 46.7B / 12.9B, 8x22B 141B / 39B, Qwen3-30B-A3B 30.5B / 3.3B, Qwen3-235B-A22B 235B / 22B,
 *    OLMoE-1B-7B 6.9B / 1.3B, DeepSeek-V3 671B / 37B;
 *  - for shapes moe-train takes, the planner's counts and activation bytes equal what the model itself would
 *    allocate (moe_model_config_footprint), so the two cannot drift apart;
 *  - the placement of EP peers on nodes, the ring all-reduce bytes and the micro-batch count on hand-worked cases;
 *  - the MoE layers' share of the FLOPs, and the measured dense-path and optimizer calibrations on hand-worked cases;
 *  - bad config files are refused with the key named;
 *  - routing skew: a metrics.jsonl's expert counts give each ep its hand-worked skew, bad logs are refused by line,
 *    and the skew scales the routed experts' work and the all-to-all, nothing else;
 *  - ZeRO-2: its gradient bytes (shard, window, ends) and the reduce-scatter's scratch, traffic, time and optimizer
 *    bytes on hand-worked cases; less memory than ZeRO-1 (Mixtral 8x7B fits 64 GPUs only with it); refused, and
 *    skipped by --search, where moe-train's world-invariant sums are off;
 *  - tensor parallelism: tp 1 is none to the bit, a GPU's share of Mixtral 8x7B's parameters at tp 2 and 16 (kv heads
 *    replicated), token-sized memory and the all-to-all halved at tp 2, the collectives' bytes and time, the gradient
 *    sums over the data ranks, recomputation's extra collectives, the q/k norms' all-to-alls (OLMoE's and Qwen3's at
 *    tp 2; Qwen3-30B-A3B's at tp 8, above its 4 kv heads), and each refusal by name.
 *   meson test -C build test_plan */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alltoall/tree_allreduce.h"
#include "checkpoint/internal.h"
#include "core/fail.h"
#include "plan/cluster.h"
#include "plan/hf.h"
#include "plan/routing.h"
#include "plan/search.h"
#include "plan/pipeline.h"
#include "test_util.h"

static const char *dir;

/* dir/file (a config.json) into *m; 0, after a failed check, when it cannot be read */
static int load_config(const char *file, moe_plan_model *m) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    const moe_status st = moe_plan_model_from_hf_config(path, m);
    CHECK(st == MOE_OK, "%s: %s", path, moe_failure_message(st));
    return st == MOE_OK;
}

/* text in a new temporary file; its path in path[] (the caller removes it); 0 when it could not be made */
static int temp_file(const char *text, char path[static 32]) {
    strcpy(path, "/tmp/test_plan_XXXXXX");
    const int fd = mkstemp(path);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    CHECK(f != NULL, "cannot make a temporary file");
    if (!f) return 0;
    fputs(text, f);
    fclose(f);
    return 1;
}

/* published: the total and active counts in billions as published, and the digit they were given to */
static void check_reference(const char *file, int64_t total, int64_t active, double pub_total, double pub_active,
                            double digit, int unsupported) {
    moe_plan_model m;
    if (!load_config(file, &m)) return;
    const moe_plan_params p = moe_plan_model_params(&m);
    CHECK(p.total == total, "%s: total %lld, want %lld", file, (long long)p.total, (long long)total);
    CHECK(p.active == active, "%s: active %lld, want %lld", file, (long long)p.active, (long long)active);
    /* within one unit of the last published digit (Qwen3-30B-A3B's 3.353B is published as 3.3B: cut, not rounded) */
    CHECK(fabs(p.total / 1e9 - pub_total) < digit, "%s: %.3fB total vs published %gB", file, p.total / 1e9, pub_total);
    CHECK(fabs(p.active / 1e9 - pub_active) < digit, "%s: %.3fB active vs published %gB", file, p.active / 1e9,
          pub_active);
    const char *notes[8];
    const int n = moe_plan_model_unsupported(&m, notes, 8);
    CHECK((n > 0) == unsupported, "%s: %d notes of what moe-train cannot train, want %s", file, n,
          unsupported ? "some" : "none");
}

/* The planner against the model's own allocation plan for a shape moe-train takes (fp32, one rank). */
static void check_against_model(moe_model_config c, int seqs) {
    c.moe.d_model = c.d_model, c.moe.d_ff = c.d_ff;
    CHECK(moe_model_layout_problem(&c, 1, 1) == NULL, "test config invalid: %s", moe_model_layout_problem(&c, 1, 1));
    const moe_model_footprint f = moe_model_config_footprint(&c, 1, 1, seqs);
    const moe_plan_model m = moe_plan_model_from_config(&c);
    const moe_plan_params p = moe_plan_model_params(&m);
    CHECK(p.dense == (int64_t)f.dense_params, "dense %lld vs model %zu (L %d d %d E %d every %d tie %d)",
          (long long)p.dense, f.dense_params, c.num_layers, c.d_model, c.moe.num_experts, c.moe_every,
          c.tie_embeddings);
    CHECK(p.expert == (int64_t)f.expert_params, "experts %lld vs model %zu", (long long)p.expert, f.expert_params);
    /* the config.json moe-train saves of it (a family's label, or our variant's with its moe_train object) the planner
     * reads to the same counts (a probe: the variant was refused as an unknown model_type) */
    json_t *saved = moe__checkpoint_config_json(&c);
    char *text = saved ? json_dumps(saved, 0) : NULL, path[32];
    moe_plan_model read;
    if (text && temp_file(text, path)) {
        const moe_status st = moe_plan_model_from_hf_config(path, &read);
        CHECK(st == MOE_OK, "the planner refuses moe-train's config.json: %s", moe_failure_message(st));
        const moe_plan_params q = st == MOE_OK ? moe_plan_model_params(&read) : (moe_plan_params){0};
        CHECK(q.total == p.total && q.active == p.active && q.dense == p.dense,
              "moe-train's config.json planned as %lld total, %lld active, %lld dense; the model has %lld, %lld, %lld",
              (long long)q.total, (long long)q.active, (long long)q.dense, (long long)p.total, (long long)p.active,
              (long long)p.dense);
        remove(path);
    }
    CHECK(text != NULL, "moe-train cannot write the test model's config.json");
    free(text), json_decref(saved);
    if (c.moe.num_experts == 1) { /* no MoE layer: the model's activations are all there is */
        const moe_plan_layout l = {.world = 1, .ep = 1, .micro_batch = seqs, .seq_len = c.seq_len,
                                   .attention = c.attention == MOE_ATTENTION_FUSED ? MOE_PLAN_ATTENTION_FUSED
                                                                                 : MOE_PLAN_ATTENTION_MATERIALIZED,
                                   .recompute = c.moe.recompute};
        const moe_plan_memory mem = moe_plan_model_memory(&m, &l);
        CHECK(mem.activations == (double)f.activation_bytes, "activations %.0f vs model %zu (recompute %d)",
              mem.activations, f.activation_bytes, (int)c.moe.recompute);
        CHECK(mem.exchange == 0, "a dense model has no exchange buffers (%.0f)", mem.exchange);
    }
}

/* Each recompute level holds less and adds forward work to the step (hardware FLOPs), never to MFU's FLOPs. */
static void check_recompute(void) {
    moe_plan_model mix;
    if (!load_config("mixtral-8x7b.json", &mix)) return;
    moe_plan_cluster c = moe_plan_cluster_h100(4);
    moe_plan_run r = {.layout = {.world = 32, .ep = 8, .zero = 1, .micro_batch = 1, .seq_len = 4096, .bf16 = 1,
                                 .attention = MOE_PLAN_ATTENTION_FUSED},
                      .global_batch = 32};
    moe_plan_prediction last = {0};
    for (int level = MOE_RECOMPUTE_NONE; level <= MOE_RECOMPUTE_FULL; level++) {
        r.layout.recompute = (moe_recompute)level;
        const moe_plan_prediction p = moe_plan_predict(&mix, &c, &r);
        const moe_plan_recompute_flops f = moe_plan_model_recompute_flops_per_token(&mix, 4096, r.layout.recompute);
        CHECK(p.recompute_flops_per_token == f.dense + f.moe, "recompute FLOPs %g vs %g", p.recompute_flops_per_token,
              f.dense + f.moe);
        if (level == MOE_RECOMPUTE_NONE) {
            CHECK(p.recompute_flops_per_token == 0, "none recomputes %g FLOPs", p.recompute_flops_per_token);
        } else {
            CHECK(p.memory.activations + p.memory.exchange < last.memory.activations + last.memory.exchange,
                  "recompute %d holds %.3g bytes, not less than the level below's %.3g", level,
                  p.memory.activations + p.memory.exchange, last.memory.activations + last.memory.exchange);
            CHECK(p.compute_s > last.compute_s && p.flops_per_token == last.flops_per_token &&
                      p.mfu_serial < last.mfu_serial,
                  "recompute %d: compute %g s (below %g), model FLOPs %g (%g), MFU %g (%g)", level, p.compute_s,
                  last.compute_s, p.flops_per_token, last.flops_per_token, p.mfu_serial, last.mfu_serial);
        }
        last = p;
    }
    /* full recompute runs each layer's forward again, less the router: about a third of the 6N products */
    const moe_plan_recompute_flops full = moe_plan_model_recompute_flops_per_token(&mix, 4096, MOE_RECOMPUTE_FULL);
    const double third = moe_plan_model_flops_per_token(&mix, 4096) / 3;
    CHECK(full.dense + full.moe > 0.8 * third && full.dense + full.moe < third, "full recompute %g FLOPs per token vs "
          "a third of the model's %g", full.dense + full.moe, third);
}

static moe_plan_prediction predict(const moe_plan_model *m, int64_t G, int64_t nodes, int64_t ep, int64_t mb,
                                   int64_t global_batch) {
    moe_plan_cluster c = moe_plan_cluster_h100(1);
    c.gpus_per_node = G, c.nodes = nodes;
    moe_plan_run r = {.layout = {.world = G * nodes, .ep = ep, .micro_batch = mb, .seq_len = 64, .bf16 = 1},
                      .global_batch = global_batch};
    CHECK(moe_plan_run_problem(m, &c, &r) == NULL, "run refused: %s", moe_plan_run_problem(m, &c, &r));
    return moe_plan_predict(m, &c, &r);
}

static double relative_error(double got, double want) { return fabs(got - want) / fabs(want); }

static void check_layouts(void) {
    moe_model_config c = moe_model_config_default();
    c.moe.num_experts = 48;
    const moe_plan_model m = moe_plan_model_from_config(&c);
    const struct { int64_t G, nodes, ep; int intra, inter; } cases[] = {
        {8, 2, 16, 7, 8}, {8, 1, 4, 3, 0}, {4, 4, 8, 3, 4}, {8, 2, 1, 0, 0},
        {8, 3, 6, 1, 4}, /* group [6, 12): ranks 6-7 on node 0, 8-11 on node 1; rank 6 or 7 has 4 peers away */
    };
    for (unsigned i = 0; i < sizeof cases / sizeof *cases; i++) {
        const int64_t W = cases[i].G * cases[i].nodes;
        const moe_plan_prediction p = predict(&m, cases[i].G, cases[i].nodes, cases[i].ep, 1, W);
        CHECK(p.alltoall_peers_intra == cases[i].intra && p.alltoall_peers_inter == cases[i].inter,
              "G %lld nodes %lld ep %lld: peers %d on node, %d off, want %d, %d", (long long)cases[i].G,
              (long long)cases[i].nodes, (long long)cases[i].ep, p.alltoall_peers_intra, p.alltoall_peers_inter,
              cases[i].intra, cases[i].inter);
    }
    /* 16 GPUs, ep 4: dense gradients over 16 (2 * 15/16 of 4 bytes each), experts over dp 4 (2 * 3/4) */
    const moe_plan_params par = moe_plan_model_params(&m);
    const moe_plan_prediction p = predict(&m, 8, 2, 4, 2, 16 * 2 * 3);
    CHECK(p.accum_steps == 3, "accum %lld, want 3", (long long)p.accum_steps);
    CHECK(fabs(p.allreduce_dense_bytes - 2.0 * 15 / 16 * 4 * (double)par.dense) < 1,
          "dense all-reduce %.0f bytes", p.allreduce_dense_bytes);
    CHECK(fabs(p.allreduce_expert_bytes - 2.0 * 3 / 4 * 4 * (double)par.expert / 4) < 1,
          "expert all-reduce %.0f bytes", p.allreduce_expert_bytes);
    /* the gradient sums' scratch. Without world-invariant sums none on the GPU path (NCCL in place), the larger
     * region on the CPU path (MPI's copy); with moe-train's default (16 x 2 sequences: 32 shards, 2 per GPU) the
     * tree's half of the larger region (here under one piece), 3 slots of the largest dense gradient (moe-train's rule
     * counts a dense SwiGLU's three, 3 x 256 x 128) and log2(4 x 2) + 2 = 5 expert leaves of 128 x 256 */
    CHECK(p.memory.reduce_scratch == 0, "NCCL's all-reduce: scratch %.0f bytes", p.memory.reduce_scratch);
    moe_plan_layout lay = {.world = 16, .ep = 4, .micro_batch = 2, .seq_len = 64, .bf16 = 1, .cpu = 1};
    const double larger = (double)par.dense > (double)par.expert / 4 ? (double)par.dense : (double)par.expert / 4;
    CHECK(moe_plan_model_memory(&m, &lay).reduce_scratch == 4 * larger, "MPI's all-reduce: scratch %.0f bytes",
          moe_plan_model_memory(&m, &lay).reduce_scratch);
    lay.local_shards = -1, lay.cpu = 0;
    CHECK(moe_plan_default_local_shards(16, 16, 2) == 2 && moe_plan_default_local_shards(16, 16, 3) == 1 &&
              moe_plan_default_local_shards(6, 6, 1) == 0 && moe_plan_default_local_shards(1, 1, 128) == 64 &&
              moe_plan_default_local_shards(4, 8, 2) == 2 && moe_plan_default_local_shards(4, 8, 1) == 0,
          "moe-train's default shards per GPU (with tp 2: 8 ranks of a stage, 4 reading distinct sequences)");
    CHECK(4 * larger < MOE__TREE_PIECE_NBYTES, "the regions fit in one piece of the tree's"); /* else a piece's half */
    const double tree = 4 * ceil(larger / 2) + 3 * (3 * 256.0 * 128) * 4 + 5 * 128.0 * 256 * 4;
    CHECK(moe_plan_model_memory(&m, &lay).reduce_scratch == tree, "world-invariant sums: scratch %.0f bytes, want %.0f",
          moe_plan_model_memory(&m, &lay).reduce_scratch, tree);
    /* their time: both groups span the 2 nodes; the dense ring runs at 8 NICs' 400 GB/s (under NVLink's 450), the
     * expert group (ranks 4 apart, 2 per node) at 2 NICs' 100 GB/s; latency 2 (n-1) steps of 10 us */
    const double ring_dense = 2.0 * 15 * 10e-6 + 2.0 * 15 / 16 * 4 * (double)par.dense / 400e9;
    const double ring_expert = 2.0 * 3 * 10e-6 + 2.0 * 3 / 4 * 4 * (double)par.expert / 4 / 100e9;
    CHECK(p.dense_group_spans_nodes && p.expert_group_spans_nodes &&
              relative_error(p.allreduce_s, ring_dense + ring_expert) < 1e-12,
          "all-reduce %g s, want %g (dense %g, experts %g)", p.allreduce_s, ring_dense + ring_expert, ring_dense,
          ring_expert);
    /* all-to-all: per exchange each GPU sends T k d 2 bytes / ep to each of its 3 peers, 4 exchanges per MoE layer
     * and micro-batch */
    const double per_peer = 2.0 * 64 * c.moe.top_k * c.d_model * 2 / 4;
    CHECK(fabs(p.alltoall_intra_bytes - 4.0 * c.num_layers * 3 * 3 * per_peer) < 1 && p.alltoall_inter_bytes == 0,
          "all-to-all %.0f + %.0f bytes", p.alltoall_intra_bytes, p.alltoall_inter_bytes);
    CHECK(p.step_overlap_s <= p.step_serial_s && p.step_serial_s > 0, "overlap %g > serial %g", p.step_overlap_s,
          p.step_serial_s);
}

/* The MoE layers' share of the FLOPs, and the two measured calibrations (--dense-us-per-token,
 * --optimizer-ns-per-param) on moe-train's default model (L 4, d 128, E 8, k 2, F 256, V 256, S 128), 2 GPUs,
 * ep 2, 2 sequences each (256 tokens per GPU), fp32, against hand-worked values. */

static void check_calibrations(void) {
    const moe_model_config cfg = moe_model_config_default();
    const moe_plan_model m = moe_plan_model_from_config(&cfg);
    /* MoE layers: 6 x 4 x (8 x 128 router + 2 x 3 x 128 x 256 experts); the dense rest: 6 x (4 x 4 x 128^2 + 256 x
     * 128 lm_head) + 12 x 4 x 128 x 128 attention */
    CHECK(moe_plan_model_moe_flops_per_token(&m) == 4743168.0, "MoE FLOPs per token %.0f, want 4743168",
          moe_plan_model_moe_flops_per_token(&m));
    CHECK(moe_plan_model_flops_per_token(&m, 128) - moe_plan_model_moe_flops_per_token(&m) == 2555904.0,
          "dense FLOPs per token %.0f, want 2555904",
          moe_plan_model_flops_per_token(&m, 128) - moe_plan_model_moe_flops_per_token(&m));

    moe_plan_cluster c = moe_plan_cluster_h100(0);
    c.gpus_per_node = 2;
    moe_plan_run r = {.layout = {.world = 2, .ep = 2, .micro_batch = 2, .seq_len = 128}, .global_batch = 4};
    CHECK(moe_plan_run_problem(&m, &c, &r) == NULL, "run refused: %s", moe_plan_run_problem(&m, &c, &r));
    const double rate = 66.9e12 * 0.7, tokens = 256;
    /* without calibrations (the GPU defaults): everything at the GEMM rate, the optimizer's bytes at 3.35 TB/s:
     * 36 x (332928 dense + 3145728 / 2 experts) parameters held and updated */
    moe_plan_prediction p = moe_plan_predict(&m, &c, &r);
    CHECK(relative_error(p.compute_s, 7299072.0 * tokens / rate * 1.25) < 1e-12, "compute %g", p.compute_s);
    CHECK(relative_error(p.compute_moe_s, 4743168.0 * tokens / rate * 1.25) < 1e-12, "MoE compute %g", p.compute_moe_s);
    CHECK(relative_error(p.optimizer_s, 36.0 * 1905792 / 3.35e12) < 1e-12, "optimizer %g", p.optimizer_s);

    /* the dense path measured at 20 µs per token: 5.12 ms per step whatever the GEMM rate; the MoE layers at it */
    c.dense_s_per_token = 20e-6;
    CHECK(moe_plan_cluster_problem(&c) == NULL, "calibrated cluster refused: %s", moe_plan_cluster_problem(&c));
    p = moe_plan_predict(&m, &c, &r);
    CHECK(relative_error(p.compute_dense_s, 5.12e-3) < 1e-12, "measured dense path %g s, want 5.12e-3",
          p.compute_dense_s);
    CHECK(relative_error(p.compute_moe_s, 4743168.0 * tokens / rate * 1.25) < 1e-12, "MoE compute %g", p.compute_moe_s);
    CHECK(p.compute_s == p.compute_dense_s + p.compute_moe_s, "compute %g is not dense + MoE", p.compute_s);
    c.gpu_flops /= 2;
    const moe_plan_prediction slow = moe_plan_predict(&m, &c, &r);
    CHECK(slow.compute_dense_s == p.compute_dense_s && relative_error(slow.compute_moe_s, 2 * p.compute_moe_s) < 1e-12,
          "half the GEMM rate: dense %g (want %g), MoE %g (want %g)", slow.compute_dense_s, p.compute_dense_s,
          slow.compute_moe_s, 2 * p.compute_moe_s);

    /* the optimizer measured at 1 ns per parameter (fp32, every one updated: 36 bytes by the count): 1 ns x the
     * 1905792 parameters held; ZeRO-1 updates 332928 / 2 + 1572864 of them: (32 x 1739328 + 4 x 1905792) / 36 ns;
     * bf16 also copies the 331776 dense matrix values and the experts: (36 x 1905792 + 6 x 1904640) / 36 ns */
    c.optimizer_s_per_param = 1e-9;
    p = moe_plan_predict(&m, &c, &r);
    CHECK(relative_error(p.optimizer_s, 1905792e-9) < 1e-12, "measured optimizer %g s, want 1.905792e-3",
          p.optimizer_s);
    r.layout.zero = 1;
    p = moe_plan_predict(&m, &c, &r);
    CHECK(relative_error(p.optimizer_s, 1757824e-9) < 1e-12, "ZeRO-1 optimizer %g s, want 1.757824e-3", p.optimizer_s);
    r.layout.zero = 0, r.layout.bf16 = 1;
    p = moe_plan_predict(&m, &c, &r);
    CHECK(relative_error(p.optimizer_s, 2223232e-9) < 1e-12, "bf16 optimizer %g s, want 2.223232e-3", p.optimizer_s);

    c.dense_s_per_token = -1;
    const char *problem = moe_plan_cluster_problem(&c);
    CHECK(problem && strstr(problem, "--dense-us-per-token"), "a negative dense time is not refused by name");
    c.dense_s_per_token = 0, c.optimizer_s_per_param = NAN;
    problem = moe_plan_cluster_problem(&c);
    CHECK(problem && strstr(problem, "--optimizer-ns-per-param"), "a NaN optimizer time is not refused by name");
}


/* st: a loader's answer to a bad file made of text; it must refuse it and name want_in_message */
static void check_refused(moe_status st, const char *text, const char *want_in_message) {
    CHECK(st == MOE_ERR_BAD_FILE, "%s: accepted (status %d)", text, (int)st);
    if (st != MOE_OK)
        CHECK(strstr(moe_failure_message(st), want_in_message) != NULL, "message '%s' does not name '%s'",
              moe_failure_message(st), want_in_message);
}

static void check_bad_config(const char *text, const char *want_in_message) {
    char path[32];
    if (!temp_file(text, path)) return;
    moe_plan_model m;
    check_refused(moe_plan_model_from_hf_config(path, &m), text, want_in_message);
    remove(path);
}

static void check_bad_routing(const char *text, const char *want_in_message) {
    char path[32];
    if (!temp_file(text, path)) return;
    moe_plan_routing r;
    const moe_status st = moe_plan_routing_load(path, &r);
    check_refused(st, text, want_in_message);
    if (st == MOE_OK) moe_plan_routing_free(&r);
    remove(path);
}

static void check_routing(void) {
    /* two steps of a 2-MoE-layer, 4-expert run (a run record and an eval line without counts are skipped):
     *   [4 2 1 1]: ep 2 groups 6 | 2 -> 6 / 4 = 1.5;   ep 4: 4 / 2 = 2
     *   [1 1 1 1]: 1 and 1
     *   [0 0 3 5]: 0 | 8 -> 8 / 4 = 2;                 5 / 2 = 2.5
     *   [2 2 2 2]: 1 and 1
     * mean over the 4 samples: ep 2 (1.5 + 1 + 2 + 1) / 4 = 1.375, ep 4 (2 + 1 + 2.5 + 1) / 4 = 1.625, ep 1: 1 */
    char path[32];
    if (!temp_file("{\"record\":\"run\",\"config\":{}}\n"
                   "{\"step\":1,\"loss\":2.5,\"expert_tokens\":[{\"layer\":0,\"tokens\":[4,2,1,1]},"
                   "{\"layer\":1,\"tokens\":[1,1,1,1]}]}\n"
                   "{\"step\":2,\"loss\":2.4,\"expert_tokens\":[{\"layer\":0,\"tokens\":[0,0,3,5]},"
                   "{\"layer\":1,\"tokens\":[2,2,2,2]}]}\n",
                   path))
        return;
    moe_plan_routing r;
    const moe_status st = moe_plan_routing_load(path, &r);
    remove(path);
    CHECK(st == MOE_OK, "routing log refused: %s", moe_failure_message(st));
    if (st != MOE_OK) return;
    CHECK(r.num_experts == 4 && r.num_samples == 4, "%lld experts, %lld samples; want 4 and 4",
          (long long)r.num_experts, (long long)r.num_samples);
    CHECK(moe_plan_routing_skew(&r, 1) == 1, "ep 1 skew %g, want 1", moe_plan_routing_skew(&r, 1));
    CHECK(moe_plan_routing_skew(&r, 2) == 1.375, "ep 2 skew %g, want 1.375", moe_plan_routing_skew(&r, 2));
    CHECK(moe_plan_routing_skew(&r, 4) == 1.625, "ep 4 skew %g, want 1.625", moe_plan_routing_skew(&r, 4));
    moe_plan_routing_free(&r);

    check_bad_routing("{\"step\":1,\"expert_tokens\":[{\"layer\":0,\"tokens\":[1,2]}]}\nnot json\n", ":2:");
    check_bad_routing("{\"step\":1,\"expert_tokens\":[{\"layer\":0,\"tokens\":[1,2]},{\"layer\":1,\"tokens\":[1,2,3]}]}\n",
                      "3 experts");
    check_bad_routing("{\"step\":1,\"expert_tokens\":[{\"layer\":0,\"tokens\":[1,-2]}]}\n", "not a count");
    check_bad_routing("{\"step\":1,\"loss\":2}\n", "no step record with expert_tokens");

    /* the default model on 2 GPUs, ep 2: a skew of 1.5 adds half the routed experts' FLOPs (6 x 4 layers x 2 x 3 x
     * 128 x 256 per token) to the MoE compute and half the bandwidth term to each exchange; the busiest GPU's
     * experts keep half as many rows again (T k = 512 -> 768): per MoE layer 3 [N, 256] activations and 1 [N, 128]
     * exchange row kept, and once for all layers 2 [N, 256] and 4 [N, 128] of scratch, fp32 on the CPU path; on the
     * CUDA path all in bf16 and 3 [N, 256] of expert scratch (dh13, dact); nothing else moves */
    moe_model_config cfg = moe_model_config_default();
    cfg.moe.d_model = cfg.d_model, cfg.moe.d_ff = cfg.d_ff;
    const moe_plan_model m = moe_plan_model_from_config(&cfg);
    moe_plan_cluster c = moe_plan_cluster_h100(0);
    c.gpus_per_node = 2;
    moe_plan_run run = {.layout = {.world = 2, .ep = 2, .micro_batch = 2, .seq_len = 128, .cpu = 1},
                        .global_batch = 4};
    const moe_plan_prediction even = moe_plan_predict(&m, &c, &run);
    run.layout.cpu = 0;
    const moe_plan_prediction even_cuda = moe_plan_predict(&m, &c, &run);
    run.layout.routing_skew = 1.5;
    const moe_plan_prediction skewed_cuda = moe_plan_predict(&m, &c, &run);
    CHECK(skewed_cuda.memory.activations - even_cuda.memory.activations == (4.0 * 3 + 3) * 256 * 256 * 2 &&
              skewed_cuda.memory.exchange - even_cuda.memory.exchange == (4.0 * 1 + 4) * 256 * 128 * 2,
          "skewed memory, CUDA path: activations +%.0f (want 1966080), exchange +%.0f (want 524288)",
          skewed_cuda.memory.activations - even_cuda.memory.activations,
          skewed_cuda.memory.exchange - even_cuda.memory.exchange);
    run.layout.cpu = 1;
    CHECK(moe_plan_run_problem(&m, &c, &run) == NULL, "skew 1.5 refused");
    const moe_plan_prediction skewed = moe_plan_predict(&m, &c, &run);
    const double rate = 66.9e12 * 0.7, tokens = 256, routed = 6.0 * 4 * 2 * 3 * 128 * 256;
    CHECK(relative_error(skewed.compute_moe_s - even.compute_moe_s, 0.5 * routed * tokens / rate * 1.25) < 1e-9,
          "skewed MoE compute %g vs even %g", skewed.compute_moe_s, even.compute_moe_s);
    /* 16 exchanges of 256 x 2 x 128 x 4 / 2 bytes to the one peer at 450 GB/s */
    const double bandwidth_term = 16 * (256.0 * 2 * 128 * 4 / 2) / 450e9;
    CHECK(relative_error(skewed.alltoall_s - even.alltoall_s, 0.5 * bandwidth_term) < 1e-9,
          "skewed all-to-all %g vs even %g", skewed.alltoall_s, even.alltoall_s);
    CHECK(skewed.memory.activations - even.memory.activations == (4.0 * 3 + 2) * 256 * 256 * 4 &&
              skewed.memory.exchange - even.memory.exchange == (4.0 * 1 + 4) * 256 * 128 * 4,
          "skewed memory: activations +%.0f (want 3670016), exchange +%.0f (want 1048576)",
          skewed.memory.activations - even.memory.activations, skewed.memory.exchange - even.memory.exchange);
    CHECK(skewed.compute_dense_s == even.compute_dense_s && skewed.allreduce_s == even.allreduce_s &&
          skewed.optimizer_s == even.optimizer_s && skewed.alltoall_intra_bytes == even.alltoall_intra_bytes,
          "the skew moved the dense path, the all-reduce, the optimizer or the mean bytes");
    /* a capacity factor caps the busiest rank's rows: at cf 1.25 a skew of 1.5 counts as 1.25; at cf 0.8 every
     * rank is capped already, balanced or not, and the skew changes nothing */
    moe_plan_model capped = m;
    capped.capacity_factor = 1.25f;
    run.layout.routing_skew = 1;
    const moe_plan_prediction capped_even = moe_plan_predict(&capped, &c, &run);
    run.layout.routing_skew = 1.5;
    const moe_plan_prediction capped_skewed = moe_plan_predict(&capped, &c, &run);
    CHECK(relative_error(capped_skewed.compute_moe_s - capped_even.compute_moe_s, 0.25 * routed * tokens / rate * 1.25) <
              1e-9, "cf 1.25, skew 1.5: MoE compute %g vs even %g", capped_skewed.compute_moe_s,
          capped_even.compute_moe_s);
    capped.capacity_factor = 0.8f;
    const moe_plan_prediction dropping = moe_plan_predict(&capped, &c, &run);
    run.layout.routing_skew = 1;
    const moe_plan_prediction dropping_even = moe_plan_predict(&capped, &c, &run);
    CHECK(dropping.compute_moe_s == dropping_even.compute_moe_s && dropping.alltoall_s == dropping_even.alltoall_s &&
              dropping.memory.total == dropping_even.memory.total,
          "cf 0.8: a skew moved the prediction though every rank is capped");
    run.layout.ep = 1, run.layout.routing_skew = 1.5;
    const moe_plan_prediction one = moe_plan_predict(&m, &c, &run);
    run.layout.routing_skew = 0;
    const moe_plan_prediction one_even = moe_plan_predict(&m, &c, &run);
    CHECK(one.compute_moe_s == one_even.compute_moe_s, "a skew moved an ep 1 layout (no EP rank to wait for)");
    run.layout.routing_skew = 0.5;
    CHECK(moe_plan_run_problem(&m, &c, &run) != NULL, "a skew below 1 is not refused");
}

/* ZeRO-2 (plan/model.h's layout.zero): the gradients are a shard (dense / W + a GPU's experts / dp), one
 * layer's window and the ends; reduced per micro-batch by reduce-scatter; valid only with world-invariant sums. */
static void check_zero2(void) {
    /* moe-train's default model (L 4 all MoE, d 128, H 4, E 8, F 256, V 256, untied) on 4 GPUs, ep 2, dp 2, 2
     * sequences each: dense 332928 = 2 x 256 x 128 + 128 + 4 x (4 x 128^2 + 256 + 8 x 128); experts 3145728, 1572864
     * per GPU; window 4 x 128^2 + 256 + 8 x 128 (router) + 4 local experts x 3 x 128 x 256 = 460032; ends 2 x 256 x
     * 128 + 128 = 65664; gradients 4 x (332928 / 4 + 1572864 / 2 + 460032 + 65664) = 5581440 bytes */
    moe_model_config cfg = moe_model_config_default();
    const moe_plan_model m = moe_plan_model_from_config(&cfg);
    const moe_plan_gradient_buffers g = moe_plan_model_gradient_buffers(&m, 2, 1);
    CHECK(g.window == 460032 && g.ends == 65664, "window %lld (want 460032), ends %lld (want 65664)",
          (long long)g.window, (long long)g.ends);
    moe_plan_layout lay = {.world = 4, .ep = 2, .zero = 1, .micro_batch = 2, .seq_len = 128, .bf16 = 1,
                           .local_shards = -1};
    const moe_plan_memory one = moe_plan_model_memory(&m, &lay);
    lay.zero = 2;
    const moe_plan_memory two = moe_plan_model_memory(&m, &lay);
    CHECK(two.gradients == 5581440 && one.gradients == 4.0 * (332928 + 1572864),
          "gradients: ZeRO-2 %.0f bytes (want 5581440), ZeRO-1 %.0f (want 7623168)", two.gradients, one.gradients);
    CHECK(two.optimizer == one.optimizer && two.masters == one.masters && two.weights == one.weights &&
              two.activations == one.activations && two.exchange == one.exchange,
          "ZeRO-2 moved more than the gradients and their scratch");
    /* the scratch: one chunk of the reduce-scatter, half the window (under a piece) for ZeRO-1's half of the larger
     * region (the experts' 1572864); the shard tree's slots and the expert leaves as before (8 sequences: 2 shards
     * per GPU) */
    CHECK(moe_plan_layout_local_shards(&lay) == 2, "shards per GPU %lld, want 2",
          (long long)moe_plan_layout_local_shards(&lay));
    CHECK(two.reduce_scratch - one.reduce_scratch == 4.0 * (460032 / 2 - 1572864 / 2),
          "scratch: ZeRO-2 %.0f, ZeRO-1 %.0f bytes", two.reduce_scratch, one.reduce_scratch);
    CHECK(two.total < one.total, "ZeRO-2 total %.0f not below ZeRO-1's %.0f", two.total, one.total);
    /* micro-batches: with world-invariant sums ZeRO-0 and 1 keep the step's sum apart (one more gradient), ZeRO-2 adds
     * into its shard; without the sums the micro-batches accumulate in place */
    lay.accum_steps = 3, lay.zero = 1;
    CHECK(moe_plan_model_memory(&m, &lay).gradients == 2 * one.gradients, "ZeRO-1, 3 micro-batches: gradients %.0f",
          moe_plan_model_memory(&m, &lay).gradients);
    lay.zero = 2;
    CHECK(moe_plan_model_memory(&m, &lay).gradients == two.gradients, "ZeRO-2, 3 micro-batches: gradients %.0f",
          moe_plan_model_memory(&m, &lay).gradients);
    lay.zero = 1, lay.local_shards = 0;
    CHECK(moe_plan_model_memory(&m, &lay).gradients == one.gradients, "no shards, 3 micro-batches: gradients %.0f",
          moe_plan_model_memory(&m, &lay).gradients);
    lay.zero = 2, lay.local_shards = -1, lay.accum_steps = 0;
    /* on one GPU nothing is sharded: the shard is every gradient and the window and ends come on top */
    lay.world = 1, lay.ep = 1;
    CHECK(moe_plan_model_memory(&m, &lay).gradients ==
              4.0 * (332928 + 3145728 + 65536 + 256 + 1024 + 8 * 98304 + 65664),
          "one GPU: ZeRO-2 gradients %.0f", moe_plan_model_memory(&m, &lay).gradients);

    /* a dense layer wider than an MoE layer's share: L 4, every 2nd MoE (E 8, F 256), dense F 1024, tied, ep 4: the
     * MoE layer 65536 + 256 + 1024 + 2 x 98304 = 263424, the dense one 65536 + 256 + 3 x 128 x 1024 = 459008; the
     * ends 256 x 128 + 128 */
    moe_plan_model wide = m;
    wide.moe_every = 2, wide.d_ff_dense = 1024, wide.tie_embeddings = 1;
    const moe_plan_gradient_buffers w = moe_plan_model_gradient_buffers(&wide, 4, 1);
    CHECK(w.window == 459008 && w.ends == 32896, "dense-layer window %lld (want 459008), ends %lld (want 32896)",
          (long long)w.window, (long long)w.ends);

    /* traffic and time: 16 GPUs on 2 nodes, ep 4, 2 sequences each, 3 micro-batches (48 experts, as check_layouts):
     * the reduce-scatter sends (n-1)/n of the gradients per micro-batch, half an all-reduce's; the all-gather after
     * the step is ZeRO-1's */
    cfg.moe.num_experts = 48;
    const moe_plan_model m48 = moe_plan_model_from_config(&cfg);
    const moe_plan_params par = moe_plan_model_params(&m48);
    moe_plan_cluster c = moe_plan_cluster_h100(1);
    c.nodes = 2;
    moe_plan_run r = {.layout = {.world = 16, .ep = 4, .zero = 1, .micro_batch = 2, .seq_len = 64, .bf16 = 1,
                                 .local_shards = -1},
                      .global_batch = 16 * 2 * 3};
    const moe_plan_prediction p1 = moe_plan_predict(&m48, &c, &r);
    r.layout.zero = 2;
    CHECK(moe_plan_run_problem(&m48, &c, &r) == NULL, "ZeRO-2 refused: %s", moe_plan_run_problem(&m48, &c, &r));
    const moe_plan_prediction p2 = moe_plan_predict(&m48, &c, &r);
    CHECK(p2.accum_steps == 3, "accum %lld, want 3", (long long)p2.accum_steps);
    CHECK(relative_error(p2.allreduce_dense_bytes, 3.0 / 2 * p1.allreduce_dense_bytes) < 1e-12 &&
              relative_error(p2.allreduce_expert_bytes, 3.0 / 2 * p1.allreduce_expert_bytes) < 1e-12 &&
              p2.zero_gather_bytes == p1.zero_gather_bytes,
          "ZeRO-2 reduce-scatter %.0f + %.0f bytes vs all-reduce %.0f + %.0f; gather %.0f vs %.0f",
          p2.allreduce_dense_bytes, p2.allreduce_expert_bytes, p1.allreduce_dense_bytes, p1.allreduce_expert_bytes,
          p2.zero_gather_bytes, p1.zero_gather_bytes);
    /* per micro-batch: L + 1 = 5 dense reduce-scatters (each layer, the ends) of 15 steps over the world at 400 GB/s,
     * 4 expert ones of 3 steps over dp 4 at 100 GB/s, 10 us a step; then the gathers, one each */
    const double dense = 4.0 * (double)par.dense, expert = 4.0 * (double)par.expert / 4;
    const double scatter = 3 * (5 * 15 * 10e-6 + 15.0 / 16 * dense / 400e9 + 4 * 3 * 10e-6 + 3.0 / 4 * expert / 100e9);
    const double gather = 15 * 10e-6 + 15.0 / 16 * dense / 400e9 + 3 * 10e-6 + 3.0 / 4 * expert / 100e9;
    CHECK(relative_error(p2.allreduce_s, scatter + gather) < 1e-12, "ZeRO-2 gradient time %g s, want %g",
          p2.allreduce_s, scatter + gather);
    CHECK(p2.compute_s == p1.compute_s && p2.alltoall_s == p1.alltoall_s, "ZeRO-2 moved the compute or all-to-all");
    /* one micro-batch: exactly half the all-reduce's bytes */
    r.global_batch = 32, r.layout.zero = 1;
    const moe_plan_prediction q1 = moe_plan_predict(&m48, &c, &r);
    r.layout.zero = 2;
    const moe_plan_prediction q2 = moe_plan_predict(&m48, &c, &r);
    CHECK(relative_error(q2.allreduce_dense_bytes, q1.allreduce_dense_bytes / 2) < 1e-12 &&
              relative_error(q2.allreduce_expert_bytes, q1.allreduce_expert_bytes / 2) < 1e-12,
          "one micro-batch: reduce-scatter %.0f + %.0f bytes, all-reduce %.0f + %.0f", q2.allreduce_dense_bytes,
          q2.allreduce_expert_bytes, q1.allreduce_dense_bytes, q1.allreduce_expert_bytes);
    /* the optimizer zeroes the shard only, fp32, at 1 ns per 36 bytes: 36 x updated (the dense / 16 and a GPU's
     * experts / 4) bytes; ZeRO-1 zeroes every gradient held: 32 x updated + 4 x held */
    c.optimizer_s_per_param = 1e-9;
    r.layout.bf16 = 0;
    const double updated = (double)par.dense / 16 + (double)par.expert / 4 / 4, held = par.dense + par.expert / 4.0;
    const moe_plan_prediction o2 = moe_plan_predict(&m48, &c, &r);
    r.layout.zero = 1;
    const moe_plan_prediction o1 = moe_plan_predict(&m48, &c, &r);
    CHECK(relative_error(o2.optimizer_s, updated * 1e-9) < 1e-12 &&
              relative_error(o1.optimizer_s, (32 * updated + 4 * held) / 36 * 1e-9) < 1e-12,
          "optimizer: ZeRO-2 %g s (want %g), ZeRO-1 %g s", o2.optimizer_s, updated * 1e-9, o1.optimizer_s);

    /* refused without world-invariant sums: explicitly off, 6 GPUs (not a power of two), 128 (over 64 shards) */
    r.layout.zero = 2, r.layout.local_shards = 0;
    const char *problem = moe_plan_run_problem(&m48, &c, &r);
    CHECK(problem && strstr(problem, "world-invariant"), "ZeRO-2 without world-invariant sums: %s",
          problem ? problem : "accepted");
    r.layout.local_shards = -1, r.layout.zero = 3;
    problem = moe_plan_run_problem(&m48, &c, &r);
    CHECK(problem && strstr(problem, "--zero"), "--zero 3: %s", problem ? problem : "accepted");

    /* the search without a pipeline or tensor parallelism: on 8 GPUs every ZeRO-1 layout has its ZeRO-2 twin; on 6 and
     * 128 none (with memory to spare, every layout tried fits and is listed; pipelines and tensor-parallel layouts, whose
     * 64 or fewer GPUs reading distinct sequences have the sums, are left out of the count) */
    const int64_t worlds[] = {8, 6, 128};
    for (int i = 0; i < 3; i++) {
        moe_plan_cluster big = moe_plan_cluster_h100(1);
        big.gpus_per_node = worlds[i] < 8 ? worlds[i] : 8, big.nodes = worlds[i] < 8 ? 1 : worlds[i] / 8;
        big.gpu_memory = 1e15;
        moe_plan_run base = {.layout = {.world = worlds[i], .seq_len = 64, .bf16 = 1, .local_shards = -1},
                             .global_batch = 2 * worlds[i]};
        moe_plan_candidate *all;
        int fit, tried, count[3] = {0, 0, 0};
        CHECK(moe_plan_search(&m, &big, &base, NULL, &all, &fit, &tried) == MOE_OK, "search failed");
        for (int k = 0; k < fit; k++)
            if (all[k].run.layout.pp <= 1 && all[k].run.layout.tp <= 1) count[all[k].run.layout.zero]++;
        free(all);
        CHECK(fit == tried && count[0] > 0 && count[0] == count[1] && count[2] == (worlds[i] == 8 ? count[1] : 0),
              "%lld GPUs: %d of %d fit; ZeRO 0, 1, 2: %d, %d, %d layouts", (long long)worlds[i], fit, tried, count[0],
              count[1], count[2]);
    }

    /* Mixtral 8x7B, S 4096, 64 H100s, ep 8, recompute full: ZeRO-1 does not fit 80 GB, ZeRO-2 does; its chunk is a
     * whole 64 MiB piece (half the 218 M-value window is more), ZeRO-1's half a piece */
    moe_plan_model mix;
    if (!load_config("mixtral-8x7b.json", &mix)) return;
    moe_plan_cluster h100 = moe_plan_cluster_h100(1);
    h100.nodes = 8;
    moe_plan_run run = {.layout = {.world = 64, .ep = 8, .zero = 1, .micro_batch = 1, .seq_len = 4096, .bf16 = 1,
                                   .attention = MOE_PLAN_ATTENTION_FUSED, .recompute = MOE_RECOMPUTE_FULL,
                                   .local_shards = -1, .workspace_bytes = 1073741824.0},
                        .global_batch = 64};
    const moe_plan_prediction mix1 = moe_plan_predict(&mix, &h100, &run);
    run.layout.zero = 2;
    const moe_plan_prediction mix2 = moe_plan_predict(&mix, &h100, &run);
    CHECK(!mix1.fits && mix2.fits, "Mixtral 8x7B on 64 GPUs: ZeRO-1 %.1f GiB (%s), ZeRO-2 %.1f GiB (%s)",
          mix1.memory.total / 1073741824.0, mix1.fits ? "fits" : "no", mix2.memory.total / 1073741824.0,
          mix2.fits ? "fits" : "no");
    /* both halve a 64 MiB piece at most: the reduce-scatter's chunk is half a piece (alltoall/tree_allreduce.h) */
    CHECK(mix2.memory.reduce_scratch == mix1.memory.reduce_scratch,
          "Mixtral scratch: ZeRO-2 %.0f, ZeRO-1 %.0f bytes", mix2.memory.reduce_scratch, mix1.memory.reduce_scratch);
}

/* Pipeline parallelism by hand: moe-train's default model (4 layers, d 128, 4 heads, 8 experts of d_ff 256, vocab 256,
 * untied) on 4 GPUs as pp 2 x ep 2, sequences of 64, 4 micro-batches per step. */
static void check_pipeline(void) {
    moe_model_config mc = moe_model_config_default();
    const moe_plan_model model = moe_plan_model_from_config(&mc);
    CHECK(model.num_layers == 4 && model.d_model == 128 && model.num_experts == 8 && model.vocab_size == 256 &&
              model.d_ff_expert == 256 && model.num_heads == 4 && model.num_kv_heads == 4 && !model.tie_embeddings,
          "moe-train's default model changed: rework this case");
    moe_plan_cluster c = moe_plan_cluster_h100(1);
    c.gpus_per_node = 4;
    moe_plan_run r = {.layout = {.world = 4, .ep = 2, .pp = 2, .micro_batch = 1, .seq_len = 64, .bf16 = 1,
                                 .local_shards = -1},
                      .global_batch = 8}; /* 2 GPUs per stage x 4 micro-batches */
    CHECK(moe_plan_run_problem(&model, &c, &r) == NULL, "pp 2 refused: %s", moe_plan_run_problem(&model, &c, &r));
    const moe_plan_prediction p = moe_plan_predict(&model, &c, &r);
    CHECK(p.accum_steps == 4, "micro-batches %lld, want 8 / (4 / 2)", (long long)p.accum_steps);
    /* the bubble: (p - 1)/(V m) = 1/4 of compute, all-to-all, control and the sends */
    CHECK(p.bubble_fraction == 0.25, "bubble %g, want 0.25", p.bubble_fraction);
    CHECK(relative_error(p.bubble_s, 0.25 * (p.compute_s + p.alltoall_s + p.control_s + p.p2p_s)) < 1e-12,
          "bubble %g s", p.bubble_s);
    /* the sends: 2 per micro-batch (activation on, gradient back), 64 x 128 bf16 values, inside the node */
    CHECK(p.p2p_bytes == 2 * 4 * 64 * 128 * 2.0, "sends %g bytes", p.p2p_bytes);
    CHECK(relative_error(p.p2p_s, 8 * (c.intra_latency + 64 * 128 * 2.0 / c.intra_bw)) < 1e-12, "sends %g s", p.p2p_s);
    CHECK(relative_error(p.step_serial_s, p.compute_s + p.optimizer_s + p.alltoall_s + p.control_s + p.allreduce_s +
                                              p.p2p_s + p.bubble_s) < 1e-12, "serial step %g s", p.step_serial_s);
    /* stage 0 holds layers 0-1 and the embedding, stage 1 layers 2-3, the final norm and lm_head. Per layer: attention
     * 4 d^2 = 65536, norms 2d = 256, router E d = 1024, experts 8 x 3 d F = 786432, of which a GPU at ep 2 holds half */
    const moe_plan_stage s0 = moe_plan_pipeline_stage(&model, &(moe_plan_layout){.world = 4, .pp = 2, .accum_steps = 4}, 0);
    const moe_plan_stage s1 = moe_plan_pipeline_stage(&model, &(moe_plan_layout){.world = 4, .pp = 2, .accum_steps = 4}, 1);
    CHECK(s0.layers == 2 && s0.moe_layers == 2 && s0.embedding && !s0.head && s0.in_flight == 2 && s1.layers == 2 &&
              !s1.embedding && s1.head && s1.in_flight == 1,
          "stages: %lld layers (%lld MoE), ends %d %d, in flight %g; %lld, %d %d, %g", (long long)s0.layers,
          (long long)s0.moe_layers, s0.embedding, s0.head, s0.in_flight, (long long)s1.layers, s1.embedding, s1.head,
          s1.in_flight);
    const double dense0 = 256 * 128 + 2 * (65536 + 256 + 1024), experts0 = 2 * 786432 / 2;
    CHECK(p.memory.stage == 0, "the largest stage is %lld, want 0 (2 micro-batches in flight)", (long long)p.memory.stage);
    /* gradients: the micro-batch's and the step's sum beside it (world-invariant sums, 4 micro-batches) */
    CHECK(p.memory.masters == 4 * (dense0 + experts0) && p.memory.gradients == 8 * (dense0 + experts0) &&
              p.memory.optimizer == 8 * (dense0 + experts0),
          "stage 0: masters %.0f, gradients %.0f, optimizer %.0f; want 4, 8, 8 x %.0f", p.memory.masters,
          p.memory.gradients, p.memory.optimizer, dense0 + experts0);
    /* ZeRO-1 shards the moments over the stage's 2 GPUs (dense) and the 1 GPU holding the same experts */
    r.layout.zero = 1;
    const moe_plan_prediction z = moe_plan_predict(&model, &c, &r);
    CHECK(z.memory.optimizer == 8 * (dense0 / 2 + experts0), "ZeRO-1 optimizer %.0f", z.memory.optimizer);
    CHECK(z.allreduce_dense_bytes == 2.0 * (2 - 1) / 2 * 4 * dense0, "dense all-reduce over the stage: %g bytes",
          z.allreduce_dense_bytes);
    r.layout.zero = 0;

    /* activations: what each layer keeps, times the micro-batches in flight: 1 (m = 1), 2 (1F1B, m = 4) and
     * 2 (1 + 1/4) = 2.5 (interleaved, V 2: 5 chunk stashes of half a stage) on stage 0, linear in between */
    moe_plan_layout l = r.layout;
    double act[3];
    const int64_t accum[3] = {1, 4, 4}, virtual_stages[3] = {1, 1, 2};
    const double want_in_flight[3] = {1, 2, 2.5};
    for (int i = 0; i < 3; i++) {
        l.accum_steps = accum[i], l.virtual_stages = virtual_stages[i];
        const moe_plan_stage st = moe_plan_pipeline_stage(&model, &l, 0);
        CHECK(st.in_flight == want_in_flight[i], "in flight %g, want %g", st.in_flight, want_in_flight[i]);
        const moe_plan_memory mem = moe_plan_model_memory(&model, &l);
        act[i] = mem.activations + mem.exchange;
    }
    const double kept = act[1] - act[0];
    CHECK(kept > 0 && relative_error(act[2] - act[1], 0.5 * kept) < 1e-12,
          "activations %g, %g, %g: not linear in the micro-batches in flight", act[0], act[1], act[2]);

    /* pp 1 (or 0, as every layout before pipelines) is no pipeline: the same prediction to the bit */
    r.layout.pp = 0, r.global_batch = 8;
    const moe_plan_prediction none = moe_plan_predict(&model, &c, &r);
    r.layout.pp = 1, r.layout.virtual_stages = 1;
    const moe_plan_prediction one = moe_plan_predict(&model, &c, &r);
    CHECK(!memcmp(&none, &one, sizeof none) && none.bubble_s == 0 && none.p2p_s == 0 && none.memory.stage == 0,
          "pp 1 differs from no pipeline");

    /* refusals */
    const struct { int64_t pp, V, global_batch; const char *want; } bad[] = {
        {3, 1, 12, "--pp must divide the number of GPUs"},
        {2, 3, 8, "must divide the layers"},
        {1, 2, 8, "--virtual-stages needs --pp above 1"},
        {2, 1, 2, "at least --pp micro-batches"},
        {2, 2, 6, "multiple of --pp"},
        {4, 1, 16, "--ep must divide the GPUs of a pipeline stage"},
    };
    for (unsigned i = 0; i < sizeof bad / sizeof *bad; i++) {
        moe_plan_run b = r;
        b.layout.pp = bad[i].pp, b.layout.virtual_stages = bad[i].V, b.global_batch = bad[i].global_batch;
        const char *problem = moe_plan_run_problem(&model, &c, &b);
        CHECK(problem && strstr(problem, bad[i].want), "pp %lld V %lld batch %lld: %s, want '%s'", (long long)bad[i].pp,
              (long long)bad[i].V, (long long)bad[i].global_batch, problem ? problem : "accepted", bad[i].want);
    }
}

/* Tensor parallelism (--tp, with sequence parallelism): tp 1 is no tensor parallelism to the bit; a GPU's share of the
 * dense parameters (the split tensors / tp, k and v / KV where tp exceeds the kv heads); token-sized memory and
 * the all-to-all / tp; the collectives' count and bytes; the data ranks (batch, gradient sums, ZeRO); the refusals. */
/* DeepSeek-V3's 61 layers (a prime): a pipeline needs uneven ends (--first-stage-layers, --last-stage-layers, as
 * moe-train cuts them: models/model.h). At pp 16 with 1 and 4: the stages between hold 4 each, the slowest stage 4 of
 * a mean 61 / 16 (its compute time scaled by 4 x 16 / 61); without ends it is refused, naming them; the search's own
 * cut is 2 and 3. */
static void check_uneven_pipeline(void) {
    moe_plan_model v3;
    if (!load_config("deepseek-v3.json", &v3)) return;
    moe_plan_cluster c = moe_plan_cluster_h100(1);
    c.nodes = 256;
    moe_plan_run r = {.layout = {.world = 2048, .ep = 64, .pp = 16, .zero = 1, .micro_batch = 1, .seq_len = 4096,
                                 .bf16 = 1, .recompute = MOE_RECOMPUTE_FULL, .local_shards = -1},
                      .global_batch = 16384};
    const char *problem = moe_plan_run_problem(&v3, &c, &r);
    CHECK(problem && strstr(problem, "--first-stage-layers"), "pp 16 of 61 layers: %s", problem ? problem : "accepted");
    r.layout.first_stage_layers = 1, r.layout.last_stage_layers = 4;
    problem = moe_plan_run_problem(&v3, &c, &r);
    CHECK(!problem, "pp 16 of 1, 14 x 4, 4 layers refused: %s", problem);
    const int64_t want[] = {1, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4};
    for (int64_t s = 0; s < 16; s++)
        CHECK(moe_plan_pipeline_stage(&v3, &r.layout, s).layers == want[s], "stage %lld: %lld layers", (long long)s,
              (long long)moe_plan_pipeline_stage(&v3, &r.layout, s).layers);
    CHECK(moe_plan_pipeline_max_layers(&v3, &r.layout) == 4, "the slowest stage's layers");
    const moe_plan_prediction uneven = moe_plan_predict(&v3, &c, &r);
    CHECK(uneven.fits, "DeepSeek-V3 at pp 16 x ep 64, ZeRO-1, recompute full: %.1f GiB",
          uneven.memory.total / 1073741824.0);
    moe_plan_layout cut = r.layout;
    CHECK(moe_plan_layout_cut_layers(&v3, &cut) && cut.first_stage_layers == 2 && cut.last_stage_layers == 3,
          "the search's cut at pp 16: %lld and %lld", (long long)cut.first_stage_layers,
          (long long)cut.last_stage_layers);
    cut.pp = 61;
    CHECK(moe_plan_layout_cut_layers(&v3, &cut) && !cut.first_stage_layers, "pp 61: one layer each, even");
}

static void check_tensor_parallel(void) {
    moe_plan_model mix;
    if (!load_config("mixtral-8x7b.json", &mix)) return;
    moe_plan_cluster c = moe_plan_cluster_h100(1);
    c.nodes = 2; /* 16 GPUs */
    moe_plan_run r = {.layout = {.world = 16, .ep = 4, .micro_batch = 1, .seq_len = 4096, .bf16 = 1, .local_shards = -1,
                                 .zero = 1},
                      .global_batch = 16};
    const moe_plan_prediction one = moe_plan_predict(&mix, &c, &r);
    r.layout.tp = 1;
    const moe_plan_prediction tp1 = moe_plan_predict(&mix, &c, &r);
    CHECK(!memcmp(&one, &tp1, sizeof one) && one.tp_s == 0 && one.tp_bytes == 0, "tp 1 differs from none");

    /* a GPU's share at tp 2 (Mixtral 8x7B: d 4096, 32 heads of 128, 8 kv heads, V 32000, untied, no dense FFN): q, o,
     * k, v, the embedding and lm_head halved; norms and routers whole */
    const moe_plan_stage whole = moe_plan_pipeline_stage(&mix, &r.layout, 0);
    const moe_plan_params par = moe_plan_model_params(&mix);
    const double split = 32.0 * (2 * 4096.0 * 4096 + 2 * 4096.0 * 1024) + 2 * 32000.0 * 4096;
    const moe_plan_tp_share s2 = moe_plan_model_tp_share(&mix, &whole, 2);
    CHECK(s2.dense == (double)par.dense - split / 2 && s2.dense_matrix == (double)par.dense_matrix - split / 2,
          "tp 2 share: dense %.0f of %lld, matrices %.0f", s2.dense, (long long)par.dense, s2.dense_matrix);
    /* at tp 16 the 8 kv heads cannot be split 16 ways: each GPU keeps the kv head its query heads read (1/8 of k, v) */
    const moe_plan_tp_share s16 = moe_plan_model_tp_share(&mix, &whole, 16);
    const double split16 = 32.0 * 2 * 4096.0 * 4096 + 2 * 32000.0 * 4096, kv16 = 32.0 * 2 * 4096.0 * 1024;
    CHECK(s16.dense == (double)par.dense - split16 * 15 / 16 - kv16 * 7 / 8, "tp 16 share: dense %.0f", s16.dense);

    r.layout.tp = 2, r.global_batch = 8; /* 8 groups of 2 read distinct sequences */
    CHECK(moe_plan_run_problem(&mix, &c, &r) == NULL, "tp 2 refused: %s", moe_plan_run_problem(&mix, &c, &r));
    const moe_plan_prediction p = moe_plan_predict(&mix, &c, &r);
    CHECK(p.accum_steps == 1, "tp 2: %lld micro-batches, want 8 / (16 / 2)", (long long)p.accum_steps);
    /* every token-sized buffer halves (sequence parallelism), the experts' too (T/tp tokens per GPU) */
    CHECK(relative_error(2 * p.memory.activations, one.memory.activations) < 1e-12 &&
              relative_error(2 * p.memory.exchange, one.memory.exchange) < 1e-12,
          "tp 2: activations %g, exchange %g; tp 1: %g, %g", p.memory.activations, p.memory.exchange,
          one.memory.activations, one.memory.exchange);
    const double local_expert = (double)par.expert / 4;
    CHECK(p.memory.masters == 4 * (s2.dense + local_expert) && p.memory.optimizer == 8 * (s2.dense / 8 + local_expert / 4),
          "tp 2: masters %.0f, optimizer %.0f (ZeRO-1: the share over 8 data ranks, experts over 16 / 4)",
          p.memory.masters, p.memory.optimizer);
    CHECK(relative_error(2 * p.alltoall_intra_bytes + 2 * p.alltoall_inter_bytes,
                         one.alltoall_intra_bytes + one.alltoall_inter_bytes) < 1e-12,
          "tp 2: the all-to-all carries T/tp tokens per GPU");
    /* the dense gradients over the 8 data ranks, the experts' over the 4 GPUs holding them */
    CHECK(relative_error(p.allreduce_dense_bytes, 2.0 * 7 / 8 * 4 * s2.dense) < 1e-12 &&
              relative_error(p.allreduce_expert_bytes, 2.0 * 3 / 4 * 4 * local_expert) < 1e-12,
          "tp 2: gradient all-reduce %g + %g bytes", p.allreduce_dense_bytes, p.allreduce_expert_bytes);
    /* the collectives: per micro-batch 4 per layer (attention; no dense FFN) and 2 per end, each (tp - 1)/tp of
     * T d bf16 values, one step of 5 us and its bytes at 450 GB/s */
    const double n = 4.0 * 32 + 2 * 2, nbytes = 0.5 * 4096 * 4096 * 2;
    CHECK(relative_error(p.tp_bytes, n * nbytes) < 1e-12 &&
              relative_error(p.tp_s, n * (c.intra_latency + nbytes / c.intra_bw)) < 1e-12,
          "tp 2: collectives %g bytes, %g s", p.tp_bytes, p.tp_s);
    CHECK(relative_error(p.step_serial_s, p.compute_s + p.optimizer_s + p.alltoall_s + p.control_s + p.allreduce_s +
                                              p.tp_s) < 1e-12, "tp 2: serial step %g s", p.step_serial_s);
    /* recomputation repeats the forward's all-gathers (and under full o_proj's reduce-scatters) */
    r.layout.recompute = MOE_RECOMPUTE_FULL;
    CHECK(relative_error(moe_plan_predict(&mix, &c, &r).tp_bytes, (n + 2 * 32) * nbytes) < 1e-12,
          "tp 2, recompute full: collectives %g bytes", moe_plan_predict(&mix, &c, &r).tp_bytes);
    r.layout.recompute = MOE_RECOMPUTE_NONE;
    /* q/k norms over the whole projections (OLMoE's) run at tp 2, adding per layer 4 all-to-alls of q's and of k's
     * columns (A/2 and B/2 of T rows, half of each to the other GPU), 6 under recompute; each head's (Qwen3's) 2 */
    const double qk_nbytes = 0.5 * 4096 * 2 * (4096.0 / 2 + 1024.0 / 2);
    const struct { moe_qk_norm norm; int moves, again; } qk[] = {{MOE_QK_NORM_PROJECTION, 4, 2},
                                                                 {MOE_QK_NORM_HEAD, 2, 0}};
    for (int i = 0; i < 2; i++) {
        moe_plan_model normed = mix;
        normed.qk_norm = qk[i].norm;
        CHECK(moe_plan_run_problem(&normed, &c, &r) == NULL, "q/k norms %d at tp 2 refused: %s", (int)qk[i].norm,
              moe_plan_run_problem(&normed, &c, &r));
        const double moves = 32.0 * qk[i].moves, again = 32.0 * qk[i].again;
        const moe_plan_prediction q = moe_plan_predict(&normed, &c, &r);
        CHECK(relative_error(q.tp_bytes, n * nbytes + moves * qk_nbytes) < 1e-12 &&
                  relative_error(q.tp_s, n * (c.intra_latency + nbytes / c.intra_bw) +
                                             moves * (2 * c.intra_latency + qk_nbytes / c.intra_bw)) < 1e-12,
              "q/k norms %d at tp 2: collectives %g bytes, %g s", (int)qk[i].norm, q.tp_bytes, q.tp_s);
        r.layout.recompute = MOE_RECOMPUTE_ATTENTION;
        CHECK(relative_error(moe_plan_predict(&normed, &c, &r).tp_bytes,
                             (n + 32) * nbytes + (moves + again) * qk_nbytes) < 1e-12,
              "q/k norms %d at tp 2, recompute attention: collectives %g bytes", (int)qk[i].norm,
              moe_plan_predict(&normed, &c, &r).tp_bytes);
        r.layout.recompute = MOE_RECOMPUTE_NONE;
    }
    /* each head's norms at a tp above the kv heads (Qwen3-30B-A3B at tp 8: 32 heads of 128, 4 kv heads, each on 2
     * GPUs): per layer 2 all-to-alls of q's A/8 columns and k's head_dim (a kv head's first holder sends them; not
     * B/8), beside the 4 collectives per layer and 2 per end of T d */
    moe_plan_model qwen;
    if (load_config("qwen3-30b-a3b.json", &qwen)) {
        const moe_plan_cluster node = moe_plan_cluster_h100(1);
        const moe_plan_run r8 = {.layout = {.world = 8, .tp = 8, .ep = 1, .micro_batch = 1, .seq_len = 4096,
                                            .bf16 = 1, .local_shards = -1},
                                 .global_batch = 1};
        CHECK(moe_plan_run_problem(&qwen, &node, &r8) == NULL, "Qwen3-30B-A3B at tp 8 refused: %s",
              moe_plan_run_problem(&qwen, &node, &r8));
        const double n8 = 4.0 * 48 + 2 * 2, nbytes8 = 7.0 / 8 * 4096 * 2048 * 2,
                     qk8 = 7.0 / 8 * 4096 * 2 * (32 * 128.0 / 8 + 128);
        const moe_plan_prediction q8 = moe_plan_predict(&qwen, &node, &r8);
        CHECK(relative_error(q8.tp_bytes, n8 * nbytes8 + 2 * 48 * qk8) < 1e-12,
              "Qwen3-30B-A3B at tp 8: collectives %g bytes, want %g", q8.tp_bytes, n8 * nbytes8 + 2 * 48 * qk8);
    }

    /* DeepSeek-V3 at tp 2 (multi-head latent attention, models/mla.c): q_b, kv_b and o halved with the dense FFNs and
     * the ends, q_a and kv_a whole; its attention block moves the latents (3 KL + 2 dr + 3 QL + 2 d values a token
     * and layer, cluster.c) where plain attention moves 4 d */
    moe_plan_model v3;
    if (load_config("deepseek-v3.json", &v3)) {
        const double d = 7168, H = 128, A = H * 192, L = 61, V = 129280, QL = 1536, KL = 512, dr = 64;
        const double split = L * (QL * A + KL * H * (128 + 128) + H * 128 * d) + 3 * 3 * d * 18432 + 2 * V * d;
        moe_plan_run r3 = {.layout = {.world = 16, .ep = 8, .tp = 2, .micro_batch = 1, .seq_len = 4096, .bf16 = 1,
                                      .local_shards = -1},
                           .global_batch = 8};
        CHECK(moe_plan_run_problem(&v3, &c, &r3) == NULL, "DeepSeek-V3 at tp 2 refused: %s",
              moe_plan_run_problem(&v3, &c, &r3));
        const moe_plan_stage all = moe_plan_pipeline_stage(&v3, &r3.layout, 0);
        const moe_plan_tp_share v3s = moe_plan_model_tp_share(&v3, &all, 2);
        const double v3_dense = (double)moe_plan_model_params(&v3).dense;
        CHECK(v3s.dense == v3_dense - split / 2, "DeepSeek-V3's share at tp 2: %.0f, want %.0f", v3s.dense,
              v3_dense - split / 2);
        const double width = L * (3 * KL + 2 * dr + 3 * QL + 2 * d) + 3 * 4 * d + 2 * 2 * d;
        const moe_plan_prediction p3 = moe_plan_predict(&v3, &c, &r3);
        CHECK(relative_error(p3.tp_bytes, 0.5 * 4096 * width * 2) < 1e-12, "DeepSeek-V3 at tp 2: collectives %g "
              "bytes, want %g", p3.tp_bytes, 0.5 * 4096 * width * 2);
    }

    /* refusals, each named */
    moe_plan_model odd = mix;
    odd.num_heads = 24, odd.num_kv_heads = 3, odd.head_dim = 4096 / 24, odd.vocab_size = 32001;
    moe_plan_model twelve = odd; /* 12 heads: not 8 ways */
    twelve.num_heads = 12, twelve.num_kv_heads = 12;
    const struct { const moe_plan_model *m; int64_t tp, ep, batch; const char *want; } bad[] = {
        {&mix, 3, 1, 16, "power of two"},
        {&mix, 16, 1, 16, "--gpus-per-node"},
        {&twelve, 8, 1, 16, "attention heads"},
        {&odd, 4, 1, 16, "kv heads"},
        {&odd, 2, 1, 16, "kv heads"},
        {&mix, 2, 16, 16, "--ep must divide the GPUs of a pipeline stage over --tp"},
        {&mix, 2, 4, 12, "every tensor-parallel group reads its own sequences"},
    };
    for (unsigned i = 0; i < sizeof bad / sizeof *bad; i++) {
        moe_plan_run b = r;
        b.layout.tp = bad[i].tp, b.layout.ep = bad[i].ep, b.global_batch = bad[i].batch;
        const char *problem = moe_plan_run_problem(bad[i].m, &c, &b);
        CHECK(problem && strstr(problem, bad[i].want), "tp %lld ep %lld: %s, want '%s'", (long long)bad[i].tp,
              (long long)bad[i].ep, problem ? problem : "accepted", bad[i].want);
    }
    odd.num_heads = 32, odd.num_kv_heads = 8, odd.head_dim = 128; /* only the vocabulary is odd now */
    const char *problem = moe_plan_run_problem(&odd, &c, &r);
    CHECK(problem && strstr(problem, "vocabulary"), "V 32001 at tp 2: %s", problem ? problem : "accepted");
}

int main(int argc, char **argv) {
    dir = argc > 1 ? argv[1] : "tests/plan_configs";
    check_reference("mixtral-8x7b.json", 46702792704LL, 12879925248LL, 46.7, 12.9, 0.1, 0);
    check_reference("mixtral-8x22b.json", 140630071296LL, 39161468928LL, 141, 39, 1, 0);
    check_reference("qwen3-30b-a3b.json", 30532122624LL, 3353032704LL, 30.5, 3.3, 0.1, 0);
    check_reference("qwen3-235b-a22b.json", 235093634560LL, 22190763520LL, 235, 22, 1, 0);
    check_reference("olmoe-1b-7b.json", 6919161856LL, 1282017280LL, 6.9, 1.3, 0.1, 0);
    /* multi-head latent attention, 1 shared expert, 3 dense layers first: 671B total, 37B active as published */
    check_reference("deepseek-v3.json", 671026404352LL, 37552282624LL, 671, 37, 1, 0);

    moe_model_config c = moe_model_config_default();
    check_against_model(c, 3);
    c.num_kv_heads = 2, c.tie_embeddings = 1, c.moe_every = 2, c.num_layers = 5;
    check_against_model(c, 2);
    c.moe.num_experts = 1, c.moe.top_k = 1, c.vocab_size = 300, c.seq_len = 40;
    check_against_model(c, 4);
    c.attention = MOE_ATTENTION_MATERIALIZED; /* the [S, S] probabilities instead of the fused kernels' statistics */
    check_against_model(c, 4);
    for (int r = MOE_RECOMPUTE_ATTENTION; r <= MOE_RECOMPUTE_FULL; r++) { /* what is rebuilt is held once */
        c.moe.recompute = (moe_recompute)r;
        check_against_model(c, 4);
        c.attention = MOE_ATTENTION_FUSED;
        check_against_model(c, 2);
        c.attention = MOE_ATTENTION_MATERIALIZED;
    }
    /* the families (models/model.h): q/k norms and a head_dim of their own, biases, a shared expert, wider dense
     * layers first (DeepSeek's); parameters with MoE layers, and the activations of their dense versions */
    const int families[] = {MOE_MODEL_FAMILY_QWEN3_MOE, MOE_MODEL_FAMILY_OLMOE, MOE_MODEL_FAMILY_QWEN2_MOE};
    for (int i = 0; i < 3; i++) {
        moe_model_config f = moe_model_config_default();
        f.family = families[i], f.dense_d_ff = 320, f.first_dense = 1, f.moe_every = 1;
        f.head_dim = families[i] == MOE_MODEL_FAMILY_QWEN3_MOE ? 48 : 0;
        f.shared_d_ff = families[i] == MOE_MODEL_FAMILY_QWEN2_MOE ? 96 : 0;
        check_against_model(f, 2);
        f.moe.num_experts = 1, f.moe.top_k = 1, f.shared_d_ff = 0; /* a shared expert needs MoE layers */
        check_against_model(f, 3);
    }
    moe_model_config mla = moe_model_config_default(); /* DeepSeek's attention, with and without q's bottleneck */
    mla.num_kv_heads = mla.num_heads, mla.head_dim = 48, mla.qk_rope_dim = 16, mla.v_head_dim = 32;
    mla.kv_lora_rank = 64, mla.q_lora_rank = 48, mla.first_dense = 1, mla.dense_d_ff = 320, mla.shared_d_ff = 64;
    check_against_model(mla, 2);
    mla.moe.num_experts = 1, mla.moe.top_k = 1, mla.shared_d_ff = 0;
    check_against_model(mla, 3);
    mla.q_lora_rank = 0, mla.moe.recompute = MOE_RECOMPUTE_ATTENTION;
    check_against_model(mla, 2);
    check_recompute();

    check_layouts();
    check_calibrations();
    check_routing();
    check_zero2();
    check_pipeline();
    check_uneven_pipeline();
    check_tensor_parallel();

    check_bad_config("{\"model_type\": \"mixtral\", \"hidden_size\": 64}", "num_hidden_layers");
    check_bad_config("{\"model_type\": \"llama\"}", "llama");
    check_bad_config("[1, 2]", "not a JSON object");
    check_bad_config("{\"model_type\": \"qwen3_moe\", \"hidden_size\": 64, \"num_hidden_layers\": 2, "
                     "\"num_attention_heads\": 4, \"vocab_size\": 10, \"num_experts_per_tok\": 2, \"num_experts\": 4, "
                     "\"moe_intermediate_size\": \"big\"}", "moe_intermediate_size");
    check_bad_config("{\"model_type\": \"mixtral\", \"hidden_size\": 64, \"num_hidden_layers\": 2, "
                     "\"num_attention_heads\": 4, \"num_key_value_heads\": 3, \"vocab_size\": 10}", "num_key_value_heads");
    return test_finish("test_plan");
}
