/* test_tp_model.c — the comparison of test_tp_model.h. Every rank first runs the reference alone: a one-rank layout,
 * tp 1, the whole global batch, the same fixed pieces (tp_shards 8) and batch shards (8). Then the world runs every
 * layout of tp in {1, 2, 4, 8} dividing W and the heads times every ep dividing W: each tensor group reads its data
 * rank's sequences, each rank keeps its slice of their rows. Against the reference, bitwise:
 *   - the initial weights: each rank's blocks of the split tensors (q/k/v rows, o_proj columns) cut from the whole
 *     tensors, its experts by global id (init is the same at any tp);
 *   - the loss of a forward (the ranks' sums added in the fixed tree over the stage);
 *   - the gradient norm (models/optimizer.c: with fixed pieces, a split tensor's terms piece by piece);
 *   - every gradient after the sums the trainer makes (moe_model_reduce_chunk_grads: the pieces' over the
 *     data-parallel group, the rest over the stage, the experts' over the expert-data-parallel group; a tied lm_head's
 *     apart, then into the embedding's).
 * Cases: dropless softmax routing in a Qwen3-MoE (each head's q and k normed, head_dim its own); a capacity of 1.0 with
 * drops by token order (the capacity scan sees every rank's slice); grouped-query attention (KV 2 of H 4) with tied
 * embeddings; a dense FFN layer (gate/up column-, down row-parallel) before an MoE layer; a Qwen2-MoE; an OLMoE (q and
 * k normed over the whole projections: each rank norms its slice's rows of every head, models/attention.c; KV 2, so at
 * tp 4 each kv head's k on 2 ranks; a failure names the norm's weight when its gradient is summed over the slice in
 * token order instead of the shard tree's, and the embedding when the ranks sharing a kv head take their input
 * gradient from k's gradient before the norm: both tried); Qwen3-MoEs with fewer kv heads than tp (each kv head's k
 * normed by each of the ranks holding it, the weight gradient from the slice's rows of every kv head once): 8 heads of
 * 2 kv heads (tp 8 where the world allows: each kv head on 4 ranks), and one kv head of 4 with --recompute full; a
 * failure names k's norm when its weight gradient counts a kv head once per rank holding it (tried); one kv head (so
 * fewer than tp at tp 2 and 4: k_proj and v_proj replicated, their gradients summed over the ranks sharing the head,
 * models/model.h) with the materialized attention kernel, and with the fused one; multi-head latent attention
 * (DeepSeek-V3's with a q latent, V2-Lite's with q_proj: the latents replicated on the slice's rows and gathered, q_b
 * and kv_b by heads, the shared RoPE key's gradient summed over the heads piece by piece, models/mla.c). The GQA and
 * one-kv-head cases also exercise the kv heads' copies (the reference itself runs them: 8 pieces, 4 heads). The check
 * can fail: with tp_shards = tp (each rank's block one piece: Megatron's plain split) the tp 2 runs differ from the
 * reference somewhere (checked: the sums over pieces are then added in another order). */
#include "tests/test_tp_model.h"

#include <stdlib.h>
#include <string.h>

#include "core/fail.h"
#include "models/optimizer.h"
#include "models/zero.h"
#include "tests/test_mpi.h"

enum { SEQS = 8, SEQ_LEN = 16, SHARDS = 8, PIECES = 8, SEED = 7 };

static const char *const case_names[TEST_TP_NUM_CASES] = {
    "dropless, Qwen3-MoE: each head's q/k norms (the weight gradient from the slice's rows of every head), head_dim "
    "12 (not d / H)", "capacity 1.0, drops by token order", "GQA (kv 2 of 4 heads), tied embeddings",
    "a dense FFN layer (gate/up column-, down row-parallel) and an MoE layer",
    "Qwen2-MoE: q/k/v biases split with their heads (kv 2 of 4), a gated shared expert (replicated)",
    "OLMoE: q/k norms over the whole projections (rows moved), kv 2 of 4 (2 ranks each at tp 4), not renormalised",
    "Qwen3-MoE, 8 heads of 2 kv heads (each on 2 ranks at tp 4, 4 at tp 8): each head's q/k norms",
    "Qwen3-MoE, one kv head of 4 (on every rank of the group), head_dim 16, recompute full",
    "DeepSeek-V3: multi-head latent attention with a q latent (8 heads of 8 + 4 RoPE, v 6, latents 12 and 16), "
    "group-limited sigmoid routing, recompute attention",
    "DeepSeek-V2-Lite: multi-head latent attention with q_proj, materialized attention, a dense first layer",
    "one kv head of 4 (kv heads fewer than tp), materialized attention",
    "one kv head of 4 (kv heads fewer than tp), fused attention"};

moe_model_config test_tp_model_config(test_tp_case c, int pieces) {
    const int mqa = c == TEST_TP_MQA_MATERIALIZED || c == TEST_TP_MQA_FUSED;
    moe_model_config cfg = moe_model_config_default();
    const int qwen3 = c == TEST_TP_DROPLESS || c == TEST_TP_QWEN3_GQA || c == TEST_TP_QWEN3_MQA;
    const int mla = c == TEST_TP_MLA_Q_LORA || c == TEST_TP_MLA;
    cfg.vocab_size = 64, cfg.num_layers = 2, cfg.d_model = 32, cfg.num_heads = c == TEST_TP_QWEN3_GQA || mla ? 8 : 4;
    cfg.d_ff = 32;
    const int kv2 = c == TEST_TP_GQA_TIED || c == TEST_TP_QWEN2 || c == TEST_TP_OLMOE || c == TEST_TP_QWEN3_GQA;
    cfg.num_kv_heads = kv2 ? 2 : mqa || c == TEST_TP_QWEN3_MQA ? 1 : mla ? 8 : 4;
    if (c == TEST_TP_QWEN2) cfg.family = MOE_MODEL_FAMILY_QWEN2_MOE, cfg.shared_d_ff = 24;
    if (c == TEST_TP_OLMOE) cfg.family = MOE_MODEL_FAMILY_OLMOE;
    if (qwen3) /* head_dim its own; 16 with one kv head, so that B divides into the 8 pieces */
        cfg.family = MOE_MODEL_FAMILY_QWEN3_MOE, cfg.head_dim = c == TEST_TP_QWEN3_MQA ? 16 : 12;
    if (mla) /* every piece whole heads (8 of them at 8 pieces): the shared key's gradient summed piece by piece */
        cfg.family = MOE_MODEL_FAMILY_DEEPSEEK_V3, cfg.head_dim = 12, cfg.qk_rope_dim = 4, cfg.v_head_dim = 6,
        cfg.kv_lora_rank = 16, cfg.q_lora_rank = c == TEST_TP_MLA_Q_LORA ? 12 : 0;
    cfg.attention = c == TEST_TP_MQA_MATERIALIZED || c == TEST_TP_MLA ? MOE_ATTENTION_MATERIALIZED
                                                                       : MOE_ATTENTION_FUSED;
    cfg.tie_embeddings = c == TEST_TP_GQA_TIED;
    cfg.moe_every = c == TEST_TP_DENSE_FFN ? 2 : 1; /* layer 0 dense, layer 1 MoE */
    cfg.first_dense = c == TEST_TP_MLA;             /* likewise, DeepSeek's way */
    cfg.seq_len = SEQ_LEN;
    cfg.moe = moe_config_default(cfg.d_model, cfg.d_ff, 4, 2);
    cfg.moe.capacity_factor = c == TEST_TP_CAPACITY ? 1.0f : 0.0f;
    cfg.moe.renormalize = c != TEST_TP_OLMOE;
    if (c == TEST_TP_QWEN3_MQA) cfg.moe.recompute = MOE_RECOMPUTE_FULL;
    if (c == TEST_TP_MLA_Q_LORA) {
        cfg.moe.recompute = MOE_RECOMPUTE_ATTENTION;
        cfg.moe.score_func = MOE_SCORE_SIGMOID, cfg.moe.num_groups = 2, cfg.moe.topk_groups = 1;
        cfg.moe.routed_scaling = 2.5f;
    }
    cfg.moe.num_shards = SHARDS;
    cfg.tp_shards = pieces;
    return cfg;
}

/* The global batch: SEQS sequences of random tokens and their next tokens (the same on every rank). */
static void make_batch(int vocab, int *inputs, int *targets) {
    unsigned x = 12345;
    for (int i = 0; i < SEQS * SEQ_LEN; i++) {
        x = x * 1103515245u + 12345u;
        inputs[i] = (int)((x >> 16) % (unsigned)vocab);
        targets[i] = (int)((x >> 8) % (unsigned)vocab);
    }
}

/* What a model leaves: its weights after init, its loss, its reduced gradients, and its table (host memory). */
typedef struct {
    moe_real *params, *grads;
    moe_model_tensor *tensors;
    int num_tensors, tp, tp_rank, first_expert, local_experts;
    int dropped; /* assignments over capacity, this rank's, over the layers */
    double loss, norm; /* the forward's loss; the gradient norm (models/optimizer.h) */
} run_result;

static void free_result(run_result *r) { free(r->params), free(r->grads), free(r->tensors); }

static moe_status to_host(moe_runtime *rt, void *host, const void *buffer, size_t nbytes) {
    if (rt) return moe_runtime_download(rt, host, buffer, nbytes);
    memcpy(host, buffer, nbytes);
    return MOE_OK;
}

/* Under ZeRO-2 no buffer holds the whole gradient: each region's ranges gathered from its group's members (the fixed
 * tree's all-gather) into grads, laid out as the table. Host memory: the CPU's runtime only. */
static moe_status gather_zero2_grads(moe_model *m, moe_real *grads) {
    const moe_zero_layout *z = moe_model_zero(m);
    const moe_zero_region *regions[2] = {&z->dense, &z->expert};
    for (int expert = 0; expert < 2; expert++) {
        const moe_zero_region *r = regions[expert];
        moe_real *region = grads + (expert ? moe_model_num_dense(m) : 0);
        memcpy(region + r->begin, moe_model_range_grads(m, expert), (r->end - r->begin) * sizeof(moe_real));
        if (r->part.count) MOE_TRY(moe_comm_allgather_tree_real(r->group, region, &r->part, 0, r->part.count));
    }
    return MOE_OK;
}

/* One forward and backward of this rank's part of the global batch (a tensor group's sequences: the data rank's),
 * then the gradient sums; the loss added over the stage in the fixed tree. */
static moe_status run(const moe_model_config *cfg, moe_runtime *rt, const moe_parallel *par, const int *inputs,
                      const int *targets, run_result *out) {
    const moe_ranks r = moe_parallel_ranks(par);
    const int tp = r.tp_size > 1 ? r.tp_size : 1, data_ranks = r.stage_size / tp, seqs = SEQS / data_ranks;
    const int data_rank = r.stage_rank / tp;
    moe_model *m;
    MOE_TRY(moe_model_create(cfg, rt, par, seqs, 1, &m));
    moe_status st = moe_model_init_weights(m, SEED);
    const size_t n = moe_model_num_dense(m) + moe_model_num_expert(m);
    out->params = malloc(n * sizeof(moe_real)), out->grads = malloc(n * sizeof(moe_real));
    int count;
    const moe_model_tensor *tensors = moe_model_tensors(m, &count);
    out->tensors = malloc((size_t)count * sizeof *tensors);
    if (!out->params || !out->grads || !out->tensors) st = MOE_ERR_OUT_OF_MEMORY;
    if (st == MOE_OK) st = to_host(rt, out->params, moe_model_params(m), n * sizeof(moe_real));
    if (st == MOE_OK) {
        memcpy(out->tensors, tensors, (size_t)count * sizeof *tensors);
        out->num_tensors = count, out->tp = tp, out->tp_rank = tp > 1 ? r.tp_rank : 0;
        out->local_experts = moe_model_num_local_experts(m), out->first_expert = r.ep_rank * out->local_experts;
    }
    const size_t at = (size_t)data_rank * seqs * SEQ_LEN;
    if (st == MOE_OK) st = moe_model_zero_grads(m);
    if (st == MOE_OK) st = moe_model_forward(m, inputs + at, targets + at, seqs, &out->loss, NULL);
    if (st == MOE_OK) st = moe_comm_allreduce_tree_f64(moe_parallel_stage(par), &out->loss, 1);
    for (int l = 0; st == MOE_OK && l < cfg->num_layers; l++)
        out->dropped += moe_model_layer_stats(m, l) ? moe_model_layer_stats(m, l)->num_dropped : 0;
    /* as the trainer sums a micro-batch with the world-invariant sums: a tied lm_head's gradient kept apart, summed,
     * then added into the embedding's */
    if (st == MOE_OK) st = moe_model_stage_backward(m, 1.0f / (SEQS * SEQ_LEN), NULL);
    if (st == MOE_OK) st = moe_model_reduce_chunk_grads(m, 0);
    if (st == MOE_OK) st = moe_model_finish_tied_grads(m);
    if (st == MOE_OK) st = moe_model_grad_norm(m, par, &out->norm);
    if (st == MOE_OK && cfg->zero == 2) st = gather_zero2_grads(m, out->grads);
    else if (st == MOE_OK) st = to_host(rt, out->grads, moe_model_grads(m), n * sizeof(moe_real));
    moe_model_destroy(m);
    return st;
}

/* Rows of a run's buffer (mine: laid out as its table) that differ from the reference's over the same tensors: each
 * found in the reference's whole table by its index, a split tensor's block by the run's tp_rank (k and v with fewer
 * kv heads than tp: the block of its kv head), experts by global id. *first: the first tensor with a difference. */
static long differences(const run_result *run, const moe_real *mine, const run_result *ref, const moe_real *theirs,
                        const char **first) {
    long diff = 0;
    *first = "none";
    for (int i = 0; i < run->num_tensors; i++) {
        const moe_model_tensor *t = &run->tensors[i], *w = &ref->tensors[t->index];
        const size_t rows = (size_t)t->rows, cols = t->cols ? (size_t)t->cols : 1, per = rows * cols;
        const size_t whole_cols = t->split == MOE_SPLIT_COLS ? (size_t)w->cols : cols;
        const size_t part = (size_t)moe_model_tensor_part(t, run->tp, run->tp_rank);
        size_t from = w->offset; /* where the block's first row starts in the reference */
        if (t->split == MOE_SPLIT_ROWS) from += part * per;
        if (t->split == MOE_SPLIT_COLS) from += part * cols;
        if (t->experts) from += per * run->first_expert;
        const size_t row_count = t->experts ? rows * run->local_experts : rows;
        const long before = diff;
        for (size_t r = 0; r < row_count; r++)
            diff += memcmp(&mine[t->offset + r * cols], &theirs[from + r * whole_cols], cols * sizeof(moe_real)) != 0;
        if (before == 0 && diff > 0) *first = t->name;
    }
    return diff;
}

static void compare(test_tp_case c, int tp, int ep, int pieces, const run_result *ref, const run_result *got,
                    int expect_same, int rank) {
    const char *first_param, *first_grad;
    const long params = differences(got, got->params, ref, ref->params, &first_param);
    const long grads = differences(got, got->grads, ref, ref->grads, &first_grad);
    const int loss_same = !memcmp(&got->loss, &ref->loss, sizeof got->loss);
    const int norm_same = !memcmp(&got->norm, &ref->norm, sizeof got->norm);
    char what[320];
    snprintf(what, sizeof what, "%s, tp %d (%d pieces), ep %d", case_names[c], tp, pieces, ep);
    CHECK(params == 0, "%s: %ld rows of the initial weights differ from the reference's blocks (first: %s)", what,
          params, first_param);
    if (expect_same) {
        CHECK(loss_same && grads == 0 && norm_same,
              "%s: loss %.17g (reference %.17g), %ld gradient rows differ (first: %s), norm %.17g (reference %.17g)",
              what, got->loss, ref->loss, grads, first_grad, got->norm, ref->norm);
    } else {
        CHECK(!loss_same || grads > 0, "%s: the plain split gave the reference's bits: the check cannot fail", what);
        if (rank == 0) printf("  the plain split: loss %s, %ld gradient rows differ\n",
                                             loss_same ? "same" : "differs", grads);
    }
}

void test_tp_model_layouts(const test_tp_model_setup *s, int world, int rank) {
    int inputs[SEQS * SEQ_LEN], targets[SEQS * SEQ_LEN];
    for (int c = 0; c <= s->last_case; c++) {
        moe_model_config ref_cfg = test_tp_model_config(c, PIECES);
        ref_cfg.moe.precision = s->precision;
        make_batch(ref_cfg.vocab_size, inputs, targets);
        moe_parallel *self;
        run_result ref = {0};
        test_mpi_require(s->self(s->ctx, &self), "the one-rank layout");
        test_mpi_require(run(&ref_cfg, s->rt, self, inputs, targets, &ref), "the reference");
        moe_parallel_destroy(self);
        CHECK((ref.dropped > 0) == (c == TEST_TP_CAPACITY), "%s: %d assignments dropped", case_names[c], ref.dropped);
        for (int tp = 1; tp <= world; tp *= 2) {
            if (world % tp || ref_cfg.num_heads % tp) continue;
            for (int ep = 1; ep <= world && ep <= ref_cfg.moe.num_experts; ep *= 2) {
                if (world % ep) continue;
                /* at ep 1 also the plain split (variant 1; at tp 2) and ZeRO-2 (variant 2) */
                for (int variant = 0; variant < 3; variant++) {
                    if ((variant == 1 && (tp != 2 || ep != 1)) || (variant == 2 && (ep != 1 || !s->zero2))) continue;
                    const int pieces = variant == 1 ? tp : PIECES;
                    moe_parallel *par;
                    test_mpi_require(s->layout(s->ctx, ep, tp, &par), "the layout");
                    run_result got = {0};
                    moe_model_config cfg = test_tp_model_config(c, pieces); /* tp and ep: the layout's */
                    cfg.moe.precision = s->precision;
                    cfg.zero = variant == 2 ? 2 : 0;
                    test_mpi_require(run(&cfg, s->rt, par, inputs, targets, &got), "the tensor-parallel run");
                    compare(c, tp, ep, pieces, &ref, &got, variant != 1, rank);
                    free_result(&got);
                    moe_parallel_destroy(par);
                    if (rank == 0) printf("%s: tp %d, ep %d, %d pieces%s over %d ranks: compared\n", case_names[c],
                                          tp, ep, pieces, cfg.zero ? ", ZeRO-2" : "", world);
                }
            }
        }
        free_result(&ref);
    }
}
