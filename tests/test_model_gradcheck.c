/* test_model_gradcheck.c — the whole language model's gradients against central finite differences, in
 * the float64 build: every parameter (embedding, attention, norms, routers, dense FFN, experts, lm_head)
 * of a tiny model with one dense and one MoE layer, grouped-query attention, tied and untied heads,
 * softmax and sigmoid routing, with and without capacity drops, fused (the default) and materialized attention, and the
 * families' q/k norms (Qwen3-MoE's per head with a head_dim of its own, OLMoE's over the projections), Qwen2-MoE's q/k/v
 * biases and sigmoid-gated shared expert, an ungated shared expert, and DeepSeek's FFN layout (a wider dense first
 * layer) with group-limited routing and routed scaling. The loss is the summed cross-entropy
 * plus the layers' weighted aux and z losses — exactly what backward differentiates. */
#include <math.h>
#include <stdlib.h>

#include "models/model.h"
#include "tests/test_util.h"

enum { SEQS = 2 };

static double total_loss(moe_model *m, const moe_model_config *c, const int *in, const int *tg) {
    double ce = 0;
    CHECK_OK(moe_model_forward(m, in, tg, SEQS, &ce, NULL));
    for (int l = 0; l < c->num_layers; l++) {
        const moe_layer_stats *st = moe_model_layer_stats(m, l);
        if (st) ce += st->weighted_loss;
    }
    return ce;
}

static void run_case(const char *name, moe_model_config c, unsigned long long seed) {
    moe_parallel *par;
    moe_model *m;
    CHECK_OK(moe_parallel_create_self(&par));
    CHECK_OK(moe_model_create(&c, NULL, par, SEQS, 1, &m));
    CHECK_OK(moe_model_init_weights(m, seed));
    moe_real *p = moe_model_params(m), *g = moe_model_grads(m);
    const size_t n = moe_model_num_dense(m) + moe_model_num_expert(m);
    moe_rng rng = moe_rng_seeded(seed);
    for (size_t i = 0; i < n; i++) p[i] += (moe_real)(0.3 * moe_rng_uniform(&rng)); /* away from init symmetry */
    int in[SEQS * 8], tg[SEQS * 8];
    for (int i = 0; i < SEQS * c.seq_len; i++)
        in[i] = (int)(moe_rng_next(&rng) % c.vocab_size), tg[i] = (in[i] * 3 + 1) % c.vocab_size;
    total_loss(m, &c, in, tg);
    moe_model_zero_grads(m);
    CHECK_OK(moe_model_backward(m, 1.0));
    int spans_n, bad = 0;
    const moe_model_tensor *spans = moe_model_tensors(m, &spans_n);
    for (int s = 0; s < spans_n; s++)
        for (size_t i = spans[s].offset; i < spans[s].offset + spans[s].count; i++) {
            const double eps = 1e-6, saved = p[i];
            p[i] = saved + eps;
            double up = total_loss(m, &c, in, tg);
            p[i] = saved - eps;
            double down = total_loss(m, &c, in, tg);
            p[i] = saved;
            double num = (up - down) / (2 * eps);
            if (fabs(num - g[i]) > 1e-7 + 1e-5 * fabs(num) && bad++ < 5)
                CHECK(0, "%s: %s[%zu]: analytic %.10g, finite difference %.10g", name, spans[s].name,
                      i - spans[s].offset, g[i], num);
        }
    int drops = 0;
    for (int l = 0; l < c.num_layers; l++)
        if (moe_model_layer_stats(m, l)) drops += moe_model_layer_stats(m, l)->num_dropped;
    printf("%-36s %6zu parameters, %d dropped assignments, %d mismatches\n", name, n, drops, bad);
    if (c.moe.capacity_factor > 0) CHECK(drops > 0, "%s: meant to drop", name);
    moe_model_destroy(m);
    moe_parallel_destroy(par);
}

int main(void) {
    moe_model_config c = moe_model_config_default();
    c.vocab_size = 11, c.num_layers = 2, c.d_model = 8, c.num_heads = 2, c.num_kv_heads = 1, c.d_ff = 6, c.seq_len = 5;
    c.moe_every = 2; /* layer 0 dense, layer 1 MoE */
    c.moe = moe_config_default(c.d_model, c.d_ff, 4, 2);
    c.moe.aux_loss_coef = 0.1f, c.moe.z_loss_coef = 0.01f;
    run_case("untied, GQA, softmax, dropless", c, 1);
    moe_model_config tied = c;
    tied.tie_embeddings = 1, tied.num_kv_heads = 2, tied.moe_every = 1;
    run_case("tied, MHA, all MoE", tied, 2);
    moe_model_config drops = c;
    drops.moe.capacity_factor = 0.75f, drops.moe.score_func = MOE_SCORE_SIGMOID;
    run_case("sigmoid routing, capacity 0.75", drops, 3);
    moe_model_config dense = c;
    dense.moe = moe_config_default(c.d_model, c.d_ff, 1, 1);
    run_case("dense baseline (E = 1)", dense, 4);
    moe_model_config materialized = c; /* the defaults run the fused attention; the other way too */
    materialized.attention = MOE_ATTENTION_MATERIALIZED;
    run_case("untied, GQA, softmax, dropless, materialized attention", materialized, 1);
    moe_model_config qwen3 = c; /* each head's q/k norm, a head_dim of its own (6, not d / H = 4) */
    qwen3.family = MOE_MODEL_FAMILY_QWEN3_MOE, qwen3.head_dim = 6, qwen3.moe.renormalize = 1;
    run_case("Qwen3-MoE: per-head q/k norms, head_dim 6", qwen3, 5);
    moe_model_config olmoe = c; /* q/k norms over the whole projections, gates not renormalised */
    olmoe.family = MOE_MODEL_FAMILY_OLMOE, olmoe.moe.renormalize = 0;
    run_case("OLMoE: q/k norms over the projections", olmoe, 6);
    moe_model_config qwen2 = c; /* q/k/v biases, a shared expert of its own width with a sigmoid gate */
    qwen2.family = MOE_MODEL_FAMILY_QWEN2_MOE, qwen2.shared_d_ff = 5;
    run_case("Qwen2-MoE: q/k/v biases, gated shared expert", qwen2, 7);
    moe_model_config shared = c; /* an ungated shared expert (DeepSeek's), under tied embeddings */
    shared.shared_d_ff = 3, shared.tie_embeddings = 1;
    run_case("shared expert without a gate", shared, 8);
    moe_model_config deepseek = c; /* DeepSeek's FFNs: a wider dense first layer, an ungated shared expert, sigmoid
                                    * scores in 2 groups of 2 (1 kept), the gates scaled */
    deepseek.first_dense = 1, deepseek.moe_every = 1, deepseek.dense_d_ff = 9, deepseek.shared_d_ff = 3;
    deepseek.moe.score_func = MOE_SCORE_SIGMOID, deepseek.moe.num_groups = 2, deepseek.moe.topk_groups = 1;
    deepseek.moe.routed_scaling = 2.5f;
    run_case("first layer dense (wider), groups, routed scaling", deepseek, 9);
    moe_model_config mla = c; /* DeepSeek's multi-head latent attention: q through a bottleneck, heads of 6 = 4 + 2
                               * RoPE columns, v heads of 3, a latent of 5 */
    mla.num_kv_heads = mla.num_heads, mla.head_dim = 6, mla.qk_rope_dim = 2, mla.v_head_dim = 3;
    mla.kv_lora_rank = 5, mla.q_lora_rank = 4;
    run_case("multi-head latent attention, q_lora_rank 4", mla, 10);
    mla.q_lora_rank = 0, mla.attention = MOE_ATTENTION_MATERIALIZED;
    run_case("multi-head latent attention, q_proj, materialized", mla, 11);
    return test_finish("test_model_gradcheck");
}
