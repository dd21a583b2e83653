/* test_model_stages.c — the model cut into pipeline stages, and forwards kept in flight (models/model.h's stages and
 * passes), against the whole model on one rank, bitwise:
 *   - stages: the whole model's weights, loss and every gradient equal those of 2 and 4 stages chained by hand (each
 *     stage's output fed to the next, each input gradient back to the previous), tensor by tensor by name; every
 *     stage draws its weights as the whole model does;
 *   - passes: forwards of several micro-batches kept at once and their backwards run later (F0 F1 F2 B0 B1 B2, the
 *     order a pipeline's warm-up makes) give the bits of one pass run F0 B0 F1 B1 F2 B2;
 * over dense and MoE layers, capacity drops, sigmoid routing (its bias moved by the last forward), the world-invariant
 * shard sums, recompute none and full, the families' biases, q/k norms and shared experts (their buffers rebuilt under
 * recompute). A stage holding one end of a tied embedding with no pipeline to hold the other
 * is refused with a message. */
#include <stdlib.h>
#include <string.h>

#include "core/fail.h"
#include "models/model.h"
#include "tests/test_util.h"

enum { SEQS = 2, MICRO = 3 };

/* A small model: 4 layers, MoE every second one. */
static moe_model_config small_config(void) {
    moe_model_config c = moe_model_config_default();
    c.vocab_size = 64, c.num_layers = 4, c.d_model = 32, c.num_heads = 4, c.num_kv_heads = 2, c.d_ff = 48;
    c.seq_len = 8, c.moe_every = 2;
    c.moe.num_experts = 4, c.moe.top_k = 2, c.moe.d_model = c.d_model, c.moe.d_ff = c.d_ff;
    return c;
}

static void make_batch(const moe_model_config *c, int mb, int *in, int *tg) {
    for (int i = 0; i < SEQS * c->seq_len; i++)
        in[i] = (i * 7 + mb * 13 + 3) % c->vocab_size, tg[i] = (in[i] * 5 + 1) % c->vocab_size;
}

/* The tensor named `name` in m, or NULL. */
static const moe_model_tensor *find_tensor(moe_model *m, const char *name) {
    int n;
    const moe_model_tensor *t = moe_model_tensors(m, &n);
    for (int i = 0; i < n; i++)
        if (!strcmp(t[i].name, name)) return &t[i];
    return NULL;
}

/* Every tensor of each stage equals the whole model's of that name, in the buffers `which` picks (params or grads). */
static int compare_stages(const char *label, moe_model *whole, moe_model **stages, int num_stages, int grads) {
    int mismatches = 0, found = 0;
    for (int s = 0; s < num_stages; s++) {
        int n;
        const moe_model_tensor *t = moe_model_tensors(stages[s], &n);
        const moe_real *buf = grads ? moe_model_grads(stages[s]) : moe_model_params(stages[s]);
        const moe_real *ref = grads ? moe_model_grads(whole) : moe_model_params(whole);
        for (int i = 0; i < n; i++) {
            const moe_model_tensor *w = find_tensor(whole, t[i].name);
            CHECK(w && w->count == t[i].count && w->index == t[i].index, "%s: stage %d's %s is not the whole model's",
                  label, s, t[i].name);
            if (!w) continue;
            found++;
            if (memcmp(buf + t[i].offset, ref + w->offset, t[i].count * sizeof(moe_real)) && mismatches++ < 3)
                CHECK(0, "%s: stage %d's %s %s differ from the whole model's", label, s, t[i].name,
                      grads ? "gradients" : "weights");
        }
    }
    int whole_n;
    moe_model_tensors(whole, &whole_n);
    CHECK(found == whole_n, "%s: the stages hold %d tensors, the whole model %d", label, found, whole_n);
    return mismatches;
}

/* The whole model's step (MICRO micro-batches) against num_stages stages of equal layers, chained. */
static void check_stages(const char *label, moe_model_config c, int num_stages) {
    moe_parallel *par;
    CHECK_OK(moe_parallel_create_self(&par));
    moe_model *whole, *stages[4];
    CHECK_OK(moe_model_create(&c, NULL, par, SEQS, MICRO, &whole));
    CHECK_OK(moe_model_init_weights(whole, 7));
    const int per = c.num_layers / num_stages;
    for (int s = 0; s < num_stages; s++) {
        const moe_model_stage st = {.first_layer = s * per, .num_layers = per, .chunks = 1, .passes = 1};
        CHECK_OK(moe_model_create_stage(&c, NULL, par, &st, SEQS, MICRO, &stages[s]));
        CHECK_OK(moe_model_init_weights(stages[s], 7));
        CHECK_OK(moe_model_zero_grads(stages[s]));
    }
    CHECK(compare_stages(label, whole, stages, num_stages, 0) == 0, "%s: initial weights", label);
    CHECK_OK(moe_model_zero_grads(whole));
    const moe_real scale = (moe_real)(1.0 / (MICRO * SEQS * c.seq_len));
    int in[SEQS * 64], tg[SEQS * 64];
    for (int mb = 0; mb < MICRO; mb++) {
        make_batch(&c, mb, in, tg);
        double whole_loss = 0, staged_loss = 0;
        CHECK_OK(moe_model_forward(whole, in, tg, SEQS, &whole_loss, NULL));
        CHECK_OK(moe_model_backward(whole, scale));
        const moe_real *x = NULL;
        for (int s = 0; s < num_stages; s++) {
            CHECK_OK(moe_model_stage_forward(stages[s], in, x, tg, SEQS, &staged_loss, NULL));
            x = moe_model_stage_output(stages[s]);
        }
        const moe_real *dy = NULL;
        for (int s = num_stages - 1; s >= 0; s--) {
            CHECK_OK(moe_model_stage_backward(stages[s], scale, dy));
            dy = moe_model_stage_input_grad(stages[s]);
        }
        CHECK(whole_loss == staged_loss, "%s: micro-batch %d: loss %.17g whole, %.17g in %d stages", label, mb,
              whole_loss, staged_loss, num_stages);
    }
    CHECK(compare_stages(label, whole, stages, num_stages, 1) == 0, "%s: gradients", label);
    printf("%-44s %d stages: loss and gradients bitwise the whole model's\n", label, num_stages);
    for (int s = 0; s < num_stages; s++) moe_model_destroy(stages[s]);
    moe_model_destroy(whole);
    moe_parallel_destroy(par);
}

/* counts[L * E] += each MoE layer's global top-k counts of the selected pass's last forward */
static void add_counts(const moe_model_config *c, const moe_model *m, double *counts) {
    for (int l = 0; l < c->num_layers; l++) {
        const moe_layer_stats *ls = moe_model_layer_stats(m, l);
        for (int e = 0; ls && e < c->moe.num_experts; e++)
            counts[l * c->moe.num_experts + e] += ls->num_selected_per_expert[e];
    }
}

/* MICRO micro-batches one at a time through pass 0, then all forwards first (one pass each) and the backwards after;
 * then sigmoid routing's bias update from each, by the step's counts (every micro-batch's: until 2026-12-07 the last
 * one's alone moved the bias). Same losses, gradients and bias. */
static void check_passes(const char *label, moe_model_config c) {
    moe_parallel *par;
    CHECK_OK(moe_parallel_create_self(&par));
    moe_model *one, *many;
    const moe_model_stage whole = moe_model_stage_whole(&c),
                          stash = {.first_layer = 0, .num_layers = c.num_layers, .chunks = 1, .passes = MICRO};
    CHECK_OK(moe_model_create_stage(&c, NULL, par, &whole, SEQS, MICRO, &one));
    CHECK_OK(moe_model_create_stage(&c, NULL, par, &stash, SEQS, MICRO, &many));
    CHECK(moe_model_num_passes(many) == MICRO, "%s: passes", label);
    CHECK_OK(moe_model_init_weights(one, 11));
    CHECK_OK(moe_model_init_weights(many, 11));
    CHECK_OK(moe_model_zero_grads(one));
    CHECK_OK(moe_model_zero_grads(many));
    const moe_real scale = (moe_real)(1.0 / (MICRO * SEQS * c.seq_len));
    int in[MICRO][SEQS * 64], tg[MICRO][SEQS * 64];
    double loss_one[MICRO] = {0}, loss_many[MICRO] = {0};
    const size_t LE = (size_t)c.num_layers * c.moe.num_experts;
    double *counts_one = calloc(LE, sizeof(double)), *counts_many = calloc(LE, sizeof(double));
    for (int mb = 0; mb < MICRO; mb++) {
        make_batch(&c, mb, in[mb], tg[mb]);
        CHECK_OK(moe_model_forward(one, in[mb], tg[mb], SEQS, &loss_one[mb], NULL));
        add_counts(&c, one, counts_one);
        CHECK_OK(moe_model_backward(one, scale));
    }
    for (int mb = 0; mb < MICRO; mb++) {
        CHECK_OK(moe_model_select_pass(many, 0, mb));
        CHECK_OK(moe_model_forward(many, in[mb], tg[mb], SEQS, &loss_many[mb], NULL));
        add_counts(&c, many, counts_many);
    }
    for (int mb = 0; mb < MICRO; mb++) {
        CHECK_OK(moe_model_select_pass(many, 0, mb));
        CHECK_OK(moe_model_backward(many, scale));
        CHECK(loss_one[mb] == loss_many[mb], "%s: micro-batch %d's loss", label, mb);
    }
    CHECK(moe_model_backward(many, scale) == MOE_ERR_NO_FORWARD, "%s: a pass's second backward is refused", label);
    const size_t n = moe_model_num_dense(one) + moe_model_num_expert(one);
    CHECK(!memcmp(moe_model_grads(one), moe_model_grads(many), n * sizeof(moe_real)), "%s: gradients", label);
    CHECK(!memcmp(counts_one, counts_many, LE * sizeof(double)), "%s: the step's counts", label);
    if (c.moe.score_func == MOE_SCORE_SIGMOID) {
        CHECK_OK(moe_model_update_expert_bias(one, counts_one));
        CHECK_OK(moe_model_update_expert_bias(many, counts_many));
        int moved_by_step = 0; /* a bias that the last micro-batch's counts alone would have moved otherwise */
        for (int l = 0; l < c.num_layers; l++) {
            const moe_real *a = moe_model_expert_bias(one, l), *b = moe_model_expert_bias(many, l);
            if (!a) continue;
            CHECK(!memcmp(a, b, c.moe.num_experts * sizeof(moe_real)), "%s: layer %d's bias", label, l);
            const int E = c.moe.num_experts;
            const double *n = counts_one + (size_t)l * E;
            const moe_layer_stats *ls = moe_model_layer_stats(one, l); /* pass 0's: the last micro-batch's */
            double sum = 0, sum_last = 0;
            for (int e = 0; e < E; e++) sum += n[e], sum_last += ls->num_selected_per_expert[e];
            for (int e = 0; e < E; e++) { /* from a zero bias: rate * sign(mean - n_e) of the step's counts */
                const double want = c.moe.bias_update_rate * ((n[e] < sum / E) - (n[e] > sum / E)),
                             by_last = (ls->num_selected_per_expert[e] < sum_last / E) -
                                       (ls->num_selected_per_expert[e] > sum_last / E);
                CHECK(a[e] == (moe_real)want, "%s: layer %d expert %d: bias %g, the step's counts give %g", label, l, e,
                      a[e], want);
                moved_by_step |= (moe_real)want != (moe_real)(c.moe.bias_update_rate * by_last);
            }
        }
        CHECK(moved_by_step, "%s: no bias tells the step's counts from the last micro-batch's (a test that cannot "
              "fail)", label);
        for (int l = 0; l < c.num_layers; l++) {
            const moe_real *b = moe_model_expert_bias(many, l);
            if (!b) continue;
            for (int i = 0; i < MICRO; i++) { /* every pass routes with the one bias */
                CHECK_OK(moe_model_select_pass(many, 0, i));
                CHECK(moe_layer_expert_bias(moe_model_moe_layer(many, l)) == b, "%s: pass %d's bias", label, i);
            }
        }
    }
    printf("%-44s %d passes in flight: losses and gradients bitwise one pass's\n", label, MICRO);
    free(counts_one), free(counts_many);
    moe_model_destroy(one);
    moe_model_destroy(many);
    moe_parallel_destroy(par);
}

static void check_refusals(void) {
    moe_parallel *par;
    CHECK_OK(moe_parallel_create_self(&par));
    moe_model_config c = small_config();
    moe_model *m = NULL;
    const moe_model_stage bad_range = {.first_layer = 3, .num_layers = 2, .chunks = 1, .passes = 1},
                          no_pass = {.first_layer = 0, .num_layers = 2, .chunks = 1, .passes = 0};
    CHECK(moe_model_create_stage(&c, NULL, par, &bad_range, SEQS, 1, &m) == MOE_ERR_INVALID_CONFIG && !m,
          "layers past the model refused");
    CHECK(moe_model_create_stage(&c, NULL, par, &no_pass, SEQS, 1, &m) == MOE_ERR_INVALID_CONFIG && !m,
          "no pass refused");
    c.tie_embeddings = 1;
    const moe_model_stage first_half = {.first_layer = 0, .num_layers = 2, .chunks = 1, .passes = 1};
    CHECK(moe_model_create_stage(&c, NULL, par, &first_half, SEQS, 1, &m) == MOE_ERR_INVALID_CONFIG && !m,
          "a tied embedding's end without a pipeline refused");
    CHECK(strstr(moe_failure_message(MOE_ERR_INVALID_CONFIG), "tied"), "the refusal names tied embeddings: %s",
          moe_failure_message(MOE_ERR_INVALID_CONFIG));
    const moe_model_stage all = moe_model_stage_whole(&c);
    CHECK_OK(moe_model_create_stage(&c, NULL, par, &all, SEQS, 1, &m)); /* both ends on one stage: fine */
    int in[SEQS * 64], tg[SEQS * 64];
    make_batch(&c, 0, in, tg);
    double loss = 0;
    CHECK(moe_model_stage_forward(m, NULL, NULL, tg, SEQS, &loss, NULL) == MOE_ERR_INVALID_ARG, "the first stage needs tokens");
    moe_model_destroy(m);
    c.tie_embeddings = 0;
    const moe_model_stage second_half = {.first_layer = 2, .num_layers = 2, .chunks = 1, .passes = 1};
    CHECK_OK(moe_model_create_stage(&c, NULL, par, &second_half, SEQS, 1, &m));
    CHECK(moe_model_forward(m, in, tg, SEQS, &loss, NULL) == MOE_ERR_INVALID_ARG, "a stage is not the whole model");
    CHECK(moe_model_stage_forward(m, in, NULL, tg, SEQS, &loss, NULL) == MOE_ERR_INVALID_ARG, "a later stage needs x");
    moe_model_destroy(m);
    moe_parallel_destroy(par);
}

/* The pipeline's cut (models/model.h's moe_pipeline_split): DeepSeek-V3's 61 layers in 16 stages of 1, 14 x 4 and 4
 * layers, 10 layers in 4 stages of 1 (first given), 3, 3, 3, and 4 in 1 each (both given); each stage's layers follow
 * the last one's, every layer belongs to the stage that holds it; and the cuts that leave no equal share are
 * refused. */
static void check_pipeline_split(void) {
    moe_model_config c = small_config();
    const struct { int layers; moe_pipeline_split split; int want[16]; } cuts[] = {
        {61, {.pp = 16, .chunks = 1, .first_layers = 1, .last_layers = 4},
         {1, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4}},
        {10, {.pp = 4, .chunks = 1, .first_layers = 1}, {1, 3, 3, 3}},
        {8, {.pp = 2, .chunks = 2}, {2, 2}},
        {4, {.pp = 4, .chunks = 1, .first_layers = 1, .last_layers = 1}, {1, 1, 1, 1}},
    };
    for (size_t i = 0; i < sizeof cuts / sizeof *cuts; i++) {
        c.num_layers = cuts[i].layers;
        const moe_pipeline_split *p = &cuts[i].split;
        CHECK(!moe_pipeline_split_problem(p, c.num_layers), "cut %zu refused: %s", i,
              moe_pipeline_split_problem(p, c.num_layers));
        for (int s = 0, next = 0; s < p->pp; s++) {
            const moe_model_stage st = moe_model_pipeline_stage(&c, p, s, 1);
            CHECK(st.num_layers == cuts[i].want[s] && (p->chunks > 1 || st.first_layer == next),
                  "cut %zu, stage %d: %d layers from %d, want %d from %d", i, s, st.num_layers, st.first_layer,
                  cuts[i].want[s], next);
            for (int ch = 0; ch < p->chunks; ch++)
                for (int l = st.first_layer + ch * st.chunk_stride; l < st.first_layer + ch * st.chunk_stride +
                                                                         st.num_layers; l++)
                    CHECK(moe_model_pipeline_stage_of(&c, p, l) == s, "cut %zu: layer %d not on stage %d", i, l, s);
            next += st.num_layers;
        }
    }
    const struct { int layers; moe_pipeline_split split; const char *want; } bad[] = {
        {61, {.pp = 16, .chunks = 1}, "must divide the layers"},
        {61, {.pp = 16, .chunks = 1, .first_layers = 2, .last_layers = 4}, "equal share"},
        {4, {.pp = 2, .chunks = 1, .first_layers = 2, .last_layers = 1}, "equal share"},
        {4, {.pp = 2, .chunks = 2, .first_layers = 1}, "one chunk a stage"},
        {4, {.pp = 1, .chunks = 1, .last_layers = 1}, "need a pipeline"},
        {4, {.pp = 4, .chunks = 1, .first_layers = 2, .last_layers = 1}, "equal share"}, /* 1 layer for 2 stages */
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        const char *why = moe_pipeline_split_problem(&bad[i].split, bad[i].layers);
        CHECK(why && strstr(why, bad[i].want), "bad cut %zu: %s, want '%s'", i, why ? why : "accepted", bad[i].want);
    }
}

int main(void) {
    enum { CASES = 9 };
    const char *labels[CASES] = {"dense and MoE layers", "capacity drops", "sigmoid routing",
                                 "world-invariant shard sums", "recompute full", "recompute moe, materialized attention",
                                 "Qwen2-MoE (biases, gated shared expert), recompute full",
                                 "Qwen3-MoE (q/k norms), ungated shared expert, recompute moe",
                                 "multi-head latent attention (q_lora), recompute attention"};
    const int stages[CASES] = {4, 2, 2, 4, 2, 2, 2, 4, 2};
    moe_model_config c[CASES];
    for (int i = 0; i < CASES; i++) c[i] = small_config();
    c[1].moe.capacity_factor = 0.5f;
    c[2].moe.score_func = MOE_SCORE_SIGMOID, c[2].moe.bias_update_rate = 0.01f;
    c[3].moe.num_shards = 2;
    c[4].moe.num_shards = 2, c[4].moe.recompute = MOE_RECOMPUTE_FULL;
    c[5].moe.recompute = MOE_RECOMPUTE_MOE, c[5].attention = MOE_ATTENTION_MATERIALIZED;
    c[6].family = MOE_MODEL_FAMILY_QWEN2_MOE, c[6].shared_d_ff = 12, c[6].moe.recompute = MOE_RECOMPUTE_FULL;
    c[7].family = MOE_MODEL_FAMILY_QWEN3_MOE, c[7].shared_d_ff = 8, c[7].moe.recompute = MOE_RECOMPUTE_MOE;
    c[8].num_kv_heads = c[8].num_heads, c[8].head_dim = 12, c[8].qk_rope_dim = 4, c[8].v_head_dim = 8;
    c[8].kv_lora_rank = 12, c[8].q_lora_rank = 10, c[8].moe.recompute = MOE_RECOMPUTE_ATTENTION;
    check_stages(labels[0], c[0], 2);
    for (int i = 0; i < CASES; i++) {
        check_stages(labels[i], c[i], stages[i]);
        check_passes(labels[i], c[i]);
    }
    check_refusals();
    check_pipeline_split();
    return test_finish("test_model_stages");
}
