/* test_world_invariant_mpi.c — training bitwise the same on any power-of-two world, any ep and any pipeline (issues
 * 15, 27, docs/DETERMINISM.md), under mpirun -np W (1, 2, 4, 8). World rank 0 first trains alone (a one-rank layout,
 * the whole batch) as the reference; then the world trains in every pipeline of pp = 1, 2, 4 stages (of the 4 layers)
 * dividing W, times every ep dividing W / pp and E = 8. After 10 steps every step's loss, aux and z loss and gradient
 * norm, every final weight (each stage's tensors found in the whole model's table; each expert compared with the
 * reference's expert of the same global id) and both AdamW moments must be bitwise the reference's, in these
 * configurations (each with capacity drops):
 *   - softmax, drops by token order, 4 micro-batches per step (a 1F1B schedule keeps several in flight), ZeRO-1;
 *   - sigmoid scores with the selection bias and its update, drops by score, with DeepSeek's multi-head latent
 *     attention (q_lora 12, a kv latent of 16, heads of 12 = 8 + 4 RoPE columns, v heads of 6);
 *   - exact ties: every router weight zero, so every score ties and top-k takes the lowest ids (heavy drops);
 *   - as the first, with ZeRO-2 (gradients reduce-scattered layer by layer) against a ZeRO-0 reference, and the
 *     norm's atoms made small so that every range boundary cuts a tensor;
 *   - as the first in bf16 (the GEMMs' weight copies kept across the micro-batches of a step), pipelines of 1 and 2
 *     stages only;
 *   - a Qwen3-MoE (models/model.h: q/k norms per head, head_dim 12 of d 32 / 4 heads, top-4) with DeepSeek-V3's
 *     group-limited routing (the 8 experts in 4 groups, 3 kept) and routed scaling 2.5, under ZeRO-2 against a ZeRO-0
 *     reference.
 * The check can fail: with num_shards = 0 (today's reductions: one product per rank, MPI's all-reduce) the final
 * weights of W >= 2 differ from the reference in some bit (checked too); and replacing the tree all-reduce of the
 * gradients by MPI's fails the W = 4 and 8 runs (tried). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alltoall/parallel_mpi.h"
#include "train/trainer.h"
#include "models/zero.h"
#include "tests/test_mpi.h"
#include "tests/test_training.h"

enum { SHARDS = 8, MAX_STEPS = 16, LAYERS = 4, MICRO = 4 };
/* Steps per run: 10, or `--steps N` (the sanitized build's tests, tests/meson.build: every code path has run by
 * step 3, the moments' first update in step 1 and the buffers' reuse after it; the 10-step comparison of the bits is
 * the main build's), or without --steps the environment's TEST_WORLD_INVARIANT_STEPS (meson's tcp setup: every kind
 * of message has crossed the transport by step 3, and steps 4-10 send the same ones again) */
static int steps = 10;

typedef enum {
    SOFTMAX_ZERO, SIGMOID_BY_SCORE, ALL_TIES, SOFTMAX_ZERO2, TIED_ZERO2, BF16_SOFTMAX, QWEN3_ZERO2, NUM_CASES
} test_case;
static const char *const case_names[] = {"softmax, 4 micro-batches, ZeRO-1",
                                         "sigmoid, drops by score, multi-head latent attention",
                                         "all ties (router weights 0)",
                                         "softmax, 4 micro-batches, ZeRO-2 against ZeRO-0, atoms of 40 values",
                                         "tied embeddings, 4 micro-batches, ZeRO-2 against ZeRO-0",
                                         "bf16, softmax, 4 micro-batches, ZeRO-1",
                                         "Qwen3-MoE (q/k norms per head, head_dim 12), groups 3 of 4, 4 micro-batches, "
                                         "ZeRO-2"};
enum { SMALL_ATOM = 40 }; /* SOFTMAX_ZERO2: ranges fall inside tensors (models/zero.h) */

/* What a run leaves: per step {loss, aux, z, norm}; the full model and moments in the unsharded layout of its rank
 * [dense | its experts], with its expert range. */
typedef struct {
    double steps[MAX_STEPS][4];
    moe_real *params, *m1, *m2;
    size_t dense, experts;
    int first_expert, local_experts;
} run_result;

static moe_train_options options(const char *train, const char *val, test_case c, int shards) {
    const int softmax =
        c == SOFTMAX_ZERO || c == SOFTMAX_ZERO2 || c == TIED_ZERO2 || c == BF16_SOFTMAX || c == QWEN3_ZERO2;
    moe_train_options o = test_small_options(train, val, 1, steps, softmax ? MICRO : 1);
    o.model.num_layers = LAYERS; /* pipelines of 2 and 4 stages */
    o.model.moe.capacity_factor = 1.0f;
    o.model.moe.num_shards = shards;
    o.zero = c == SOFTMAX_ZERO || c == BF16_SOFTMAX ? 1 : c == SOFTMAX_ZERO2 || c == TIED_ZERO2 || c == QWEN3_ZERO2 ? 2 : 0;
    if (c == QWEN3_ZERO2) /* the norms' gradients, per head, summed per shard as every other's */
        o.model.family = MOE_MODEL_FAMILY_QWEN3_MOE, o.model.head_dim = 12, o.model.moe.top_k = 4;
    if (c == QWEN3_ZERO2) /* and DeepSeek-V3's routing: per token too */
        o.model.moe.num_groups = 4, o.model.moe.topk_groups = 3, o.model.moe.routed_scaling = 2.5f;
    if (c == SIGMOID_BY_SCORE) { /* DeepSeek's multi-head latent attention: heads of 12 = 8 + 4 RoPE, v of 6 */
        o.model.num_kv_heads = o.model.num_heads, o.model.head_dim = 12, o.model.qk_rope_dim = 4;
        o.model.v_head_dim = 6, o.model.kv_lora_rank = 16, o.model.q_lora_rank = 12;
    }
    if (c == BF16_SOFTMAX) o.model.moe.precision = MOE_PRECISION_BF16;
    o.model.tie_embeddings = c == TIED_ZERO2;
    if (c == SIGMOID_BY_SCORE) {
        o.model.moe.score_func = MOE_SCORE_SIGMOID;
        o.model.moe.drop_priority = MOE_DROP_BY_SCORE;
        o.model.moe.bias_update_rate = 0.01f;
    }
    return o;
}

/* Zeroes every router weight (the tensors named ...gate.weight), on the host, then uploads. */
static void zero_routers(moe_trainer *t) {
    int count;
    const moe_model_tensor *tensors = moe_model_tensors(t->model, &count);
    moe_real *p = moe_model_params(t->model);
    for (int i = 0; i < count; i++)
        if (strstr(tensors[i].name, "gate.weight")) memset(p + tensors[i].offset, 0, tensors[i].count * sizeof(moe_real));
}

static void train(moe_parallel *par, moe_train_options o, test_case c, int ep, run_result *out) {
    o.ep = ep;
    moe_trainer t;
    test_mpi_require(moe_trainer_create(&t, &o, NULL, par), "trainer");
    if (c == ALL_TIES) zero_routers(&t);
    moe_step_result r = {0};
    r.expert_tokens = calloc((size_t)o.model.num_layers * o.model.moe.num_experts, sizeof(double));
    double drops = 0;
    for (int s = 1; s <= steps; s++) {
        test_mpi_require(moe_trainer_step(&t, s, &r), "step");
        out->steps[s - 1][0] = r.loss, out->steps[s - 1][1] = r.aux, out->steps[s - 1][2] = r.z;
        out->steps[s - 1][3] = r.grad_norm;
        drops += r.drop_fraction;
    }
    CHECK(drops > 0, "%s, ep %d: nothing was dropped", case_names[c], ep);
    out->dense = moe_model_num_dense(t.model), out->experts = moe_model_num_expert(t.model);
    out->local_experts = moe_model_num_local_experts(t.model);
    out->first_expert = moe_parallel_ranks(par).ep_rank * out->local_experts;
    const size_t n = out->dense + out->experts;
    out->params = malloc(n * sizeof(moe_real)), out->m1 = malloc(n * sizeof(moe_real));
    out->m2 = malloc(n * sizeof(moe_real));
    memcpy(out->params, moe_model_params(t.model), n * sizeof(moe_real));
    test_mpi_require(moe_trainer_moments_gather(&t, 0, out->m1), "moments");
    test_mpi_require(moe_trainer_moments_gather(&t, 1, out->m2), "moments");
    free(r.expert_tokens);
    moe_trainer_destroy(&t);
}

static void free_result(run_result *r) { free(r->params), free(r->m1), free(r->m2); }

/* Element differences between a run's buffer (its stage's tensors, its experts) and the reference's over the same
 * tensors: each found in the whole one-rank table by its place there (moe_model_tensor.index), experts by global id.
 * A replica (the tied embedding on the last stage) is compared in the weights, which it must equal, not in the
 * moments, which only the first stage keeps. */
static long differences(const moe_model_tensor *tensors, int count, const moe_model_tensor *whole,
                        const run_result *run, const moe_real *mine, const moe_real *theirs) {
    long diff = 0;
    for (int i = 0; i < count; i++) {
        if (tensors[i].replica && mine != run->params) continue;
        const moe_model_tensor *w = &whole[tensors[i].index];
        const size_t per = (size_t)tensors[i].rows * (tensors[i].cols ? tensors[i].cols : 1);
        const size_t n = tensors[i].experts ? per * run->local_experts : per;
        const size_t skip = tensors[i].experts ? per * run->first_expert : 0;
        for (size_t j = 0; j < n; j++)
            diff += memcmp(&mine[tensors[i].offset + j], &theirs[w->offset + skip + j], sizeof(moe_real)) != 0;
    }
    return diff;
}

/* The reference: world rank 0 alone, the whole batch. */
static void reference(const char *train_path, const char *val_path, test_case c, int shards, run_result *ref,
                      int rank) {
    memset(ref, 0, sizeof *ref);
    if (rank == 0) {
        moe_parallel *self;
        test_mpi_require(moe_parallel_create_self(&self), "self layout");
        moe_train_options o = options(train_path, val_path, c, shards);
        o.zero = c == SOFTMAX_ZERO2 || c == TIED_ZERO2 || c == QWEN3_ZERO2 ? 0 : o.zero; /* ZeRO-2 must give ZeRO-0's bits */
        train(self, o, c, 1, ref);
        moe_parallel_destroy(self);
    }
    test_mpi_wait_asleep(MPI_COMM_WORLD); /* the others, while rank 0 trains */
    const size_t n_max = 1 << 20;
    size_t n = ref->dense + ref->experts;
    MPI_Bcast(&n, sizeof n, MPI_BYTE, 0, MPI_COMM_WORLD);
    if (n > n_max) MPI_Abort(MPI_COMM_WORLD, 1);
    MPI_Bcast(ref, sizeof *ref, MPI_BYTE, 0, MPI_COMM_WORLD); /* the sizes and steps; the pointers are replaced */
    moe_real **bufs[] = {&ref->params, &ref->m1, &ref->m2};
    for (int b = 0; b < 3; b++) {
        if (rank != 0) *bufs[b] = malloc(n * sizeof(moe_real));
        MPI_Bcast(*bufs[b], (int)(n * sizeof(moe_real)), MPI_BYTE, 0, MPI_COMM_WORLD);
    }
}

/* The tensor table of a layout: its stage's tensors, with the local expert counts. */
static const moe_model_tensor *tensor_table(moe_parallel *par, moe_train_options o, int ep, int *count,
                                            moe_trainer *keep) {
    o.ep = ep;
    test_mpi_require(moe_trainer_create(keep, &o, NULL, par), "trainer");
    return moe_model_tensors(keep->model, count);
}

/* The whole model at ep 1 on a layout of its own (*self): the reference's table, entry i at index i. */
static moe_model *whole_model(moe_train_options o, moe_parallel **self) {
    moe_model *m;
    test_mpi_require(moe_parallel_create_self(self), "self layout");
    test_mpi_require(moe_model_create(&o.model, NULL, *self, 1, 1, &m), "whole model");
    return m;
}

/* One layout (pp stages, ep) against the reference: every step's statistics, every weight and moment. */
static void check_layout(const char *train_path, const char *val_path, test_case c, int W, int rank, int pp, int V,
                         int ep, const run_result *ref, const moe_model_tensor *whole) {
    moe_parallel *par;
    test_mpi_require(moe_parallel_create_mpi_pp(MPI_COMM_WORLD, pp, ep, 60, &par), "parallel layout");
    moe_train_options o = options(train_path, val_path, c, SHARDS);
    o.pp = pp, o.virtual_stages = V;
    run_result run = {0};
    train(par, o, c, ep, &run);
    for (int s = 0; s < steps; s++)
        CHECK(!memcmp(run.steps[s], ref->steps[s], sizeof run.steps[s]),
              "%s, W %d pp %d V %d ep %d, step %d: loss %.17g aux %.17g z %.17g norm %.17g, one rank: %.17g %.17g "
              "%.17g %.17g", case_names[c], W, pp, V, ep, s + 1, run.steps[s][0], run.steps[s][1], run.steps[s][2],
              run.steps[s][3], ref->steps[s][0], ref->steps[s][1], ref->steps[s][2], ref->steps[s][3]);
    moe_trainer keep;
    int count;
    const moe_model_tensor *tensors = tensor_table(par, o, ep, &count, &keep);
    const long dp = differences(tensors, count, whole, &run, run.params, ref->params);
    const long d1 = differences(tensors, count, whole, &run, run.m1, ref->m1);
    const long d2 = differences(tensors, count, whole, &run, run.m2, ref->m2);
    CHECK(dp == 0 && d1 == 0 && d2 == 0, "%s, W %d pp %d V %d ep %d, rank %d: %ld weights, %ld first and %ld second "
          "moments differ from the one-rank run", case_names[c], W, pp, V, ep, rank, dp, d1, d2);
    if (c == SOFTMAX_ZERO && pp == 1 && ep == 1 && W > 1) { /* the check can fail: today's reductions part ways */
        run_result plain = {0};
        train(par, options(train_path, val_path, c, 0), c, ep, &plain);
        run_result plain_ref;
        reference(train_path, val_path, c, 0, &plain_ref, rank);
        long total = differences(tensors, count, whole, &plain, plain.params, plain_ref.params);
        MPI_Allreduce(MPI_IN_PLACE, &total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
        CHECK(total > 0, "W %d: without shards the weights still equal the one-rank run's (the check is blind)", W);
        if (rank == 0) printf("W %d: without shards %ld weights differ from one rank\n", W, total);
        free_result(&plain), free_result(&plain_ref);
    }
    moe_trainer_destroy(&keep);
    free_result(&run);
    moe_parallel_destroy(par);
    if (rank == 0) printf("%s: W %d pp %d V %d ep %d checked over %d steps\n", case_names[c], W, pp, V, ep, steps);
}

static void check_case(const char *train_path, const char *val_path, test_case c, int W, int rank) {
    run_result ref;
    moe__zero_set_atom_values(c == SOFTMAX_ZERO2 ? SMALL_ATOM : 0);
    reference(train_path, val_path, c, SHARDS, &ref, rank);
    moe_parallel *self;
    moe_model *whole = whole_model(options(train_path, val_path, c, SHARDS), &self);
    int count;
    const moe_model_tensor *table = moe_model_tensors(whole, &count);
    for (int pp = 1; pp <= W && pp <= (c == BF16_SOFTMAX ? 2 : LAYERS); pp *= 2) /* bf16: fewer, for time */
        for (int V = 1; V <= 2; V++) /* interleaved: pp > 1, every chunk a layer at least, micro-batches in groups of pp */
            for (int ep = 1; ep <= W / pp && ep <= 8; ep *= 2)
                if ((W / pp) % ep == 0 && (V == 1 || (pp > 1 && LAYERS % (pp * V) == 0 && MICRO % pp == 0 &&
                                                      (c == SOFTMAX_ZERO || c == SOFTMAX_ZERO2 || c == TIED_ZERO2 ||
                                                       c == QWEN3_ZERO2))))
                    check_layout(train_path, val_path, c, W, rank, pp, V, ep, &ref, table);
    moe_model_destroy(whole);
    moe_parallel_destroy(self);
    free_result(&ref);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, W;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &W);
    const int steps_given = argc == 3 && !strcmp(argv[1], "--steps");
    const char *steps_env = getenv("TEST_WORLD_INVARIANT_STEPS");
    if (steps_given) steps = atoi(argv[2]);
    else if (steps_env) steps = atoi(steps_env);
    if ((argc != 1 && !steps_given) || steps < 1 || steps > MAX_STEPS) {
        if (rank == 0)
            fprintf(stderr, "usage: test_world_invariant_mpi [--steps 1..%d] (or TEST_WORLD_INVARIANT_STEPS)\n",
                    MAX_STEPS);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    test_corpus corpus;
    test_corpus_create(&corpus, 1 << 14);
    for (int c = 0; c < NUM_CASES; c++) check_case(corpus.train, corpus.val, (test_case)c, W, rank);
    test_corpus_remove(&corpus);
    return test_mpi_finish("test_world_invariant_mpi");
}
