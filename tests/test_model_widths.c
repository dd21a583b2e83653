/* test_model_widths.c — models whose widest rows are their attention's, not d_model's, d_ff's or the vocabulary's:
 * Qwen3's heads of a head_dim of their own (H x head_dim = 32 x d_model) and DeepSeek's latent (kv_lora_rank +
 * qk_rope_dim past V), with layout-invariant row blocks (10 rows: one zero-padded block) and the dense weight gradients
 * summed in a shard tree, in fp32 and bf16: forward and backward succeed with a finite loss and gradients. The CPU
 * products' scratch was once sized by d_model, d_ff and V only (a heap overflow: ASan in the sanitized lane, or the
 * products' own check), and the shard tree by the embedding's and attention's counts (MLA's kv_a past them: "invalid
 * argument" at the first step). */
#include <math.h>

#include "models/model.h"
#include "tests/test_util.h"

enum { SEQS = 2 };

static void run_case(const char *name, moe_model_config c) {
    moe_parallel *par;
    moe_model *m;
    CHECK_OK(moe_parallel_create_self(&par));
    CHECK_OK(moe_model_create(&c, NULL, par, SEQS, 1, &m));
    CHECK_OK(moe_model_init_weights(m, 7));
    int in[SEQS * 5], tg[SEQS * 5];
    for (int i = 0; i < SEQS * c.seq_len; i++) in[i] = (i * 7 + 3) % c.vocab_size, tg[i] = (i * 5 + 1) % c.vocab_size;
    double loss = 0;
    moe_status st = moe_model_forward(m, in, tg, SEQS, &loss, NULL);
    CHECK(st == MOE_OK, "%s: forward: %s", name, moe_status_string(st));
    if (st == MOE_OK) {
        moe_model_zero_grads(m);
        st = moe_model_backward(m, 1.0);
        CHECK(st == MOE_OK, "%s: backward: %s", name, moe_status_string(st));
    }
    const moe_real *g = moe_model_grads(m);
    size_t finite = 0;
    const size_t n = moe_model_num_dense(m) + moe_model_num_expert(m);
    for (size_t i = 0; i < n; i++) finite += isfinite(g[i]) != 0;
    CHECK(isfinite(loss) && finite == n, "%s: loss %g, %zu of %zu gradients finite", name, loss, finite, n);
    printf("%-44s loss %.6f, %zu gradients\n", name, loss, n);
    moe_model_destroy(m);
    moe_parallel_destroy(par);
}

int main(void) {
    moe_model_config c = moe_model_config_default();
    c.vocab_size = 11, c.num_layers = 1, c.d_model = 8, c.num_heads = 4, c.num_kv_heads = 2, c.d_ff = 6, c.seq_len = 5;
    c.moe = moe_config_default(c.d_model, c.d_ff, 4, 2);
    c.moe.num_shards = 2; /* the dense weight gradients in a shard tree of 2 local shards */
    for (int bf16 = 0; bf16 <= 1; bf16++) {
        c.moe.precision = bf16 ? MOE_PRECISION_BF16 : MOE_PRECISION_FP32;
        moe_model_config qwen3 = c; /* q [T, 256] from x [T, 8]: 32 x d_model, 23 x V */
        qwen3.family = MOE_MODEL_FAMILY_QWEN3_MOE, qwen3.head_dim = 64;
        run_case(bf16 ? "Qwen3-MoE, head_dim 64, bf16" : "Qwen3-MoE, head_dim 64, fp32", qwen3);
        moe_model_config mla = c; /* kv_a [102, 8]: 102 latent columns, 9 x V; kv_b [4 x (4 + 3), 100] */
        mla.family = MOE_MODEL_FAMILY_DEEPSEEK_V3, mla.num_kv_heads = mla.num_heads, mla.head_dim = 6;
        mla.qk_rope_dim = 2, mla.v_head_dim = 3, mla.kv_lora_rank = 100, mla.q_lora_rank = 90;
        mla.moe.score_func = MOE_SCORE_SIGMOID;
        run_case(bf16 ? "DeepSeek-V3 MLA, kv_lora_rank 100, bf16" : "DeepSeek-V3 MLA, kv_lora_rank 100, fp32", mla);
    }
    return test_finish("test_model_widths");
}
