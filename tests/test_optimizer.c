/* test_optimizer.c — the training step's arithmetic (models/optimizer.h) on a tiny model, one process:
 * the learning-rate schedule's known points, the global gradient norm against a brute-force sum,
 * the clip factor (clip / norm above the threshold, 1 below it or with clipping off), and AdamW's weight decay
 * applied to matrices but never to norm weights. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "models/optimizer.h"
#include "tests/test_util.h"

static void test_schedule(void) {
    moe_lr_schedule s = {1e-2f, 1e-3f, 10, 110};
    CHECK(fabsf(moe_lr_at(&s, 1) - 1e-3f) < 1e-9f, "step 1: %g", moe_lr_at(&s, 1));
    CHECK(fabsf(moe_lr_at(&s, 10) - 1e-2f) < 1e-9f, "end of warm-up: %g", moe_lr_at(&s, 10));
    CHECK(fabsf(moe_lr_at(&s, 60) - 5.5e-3f) < 1e-8f, "half-way through the cosine: %g", moe_lr_at(&s, 60));
    CHECK(fabsf(moe_lr_at(&s, 110) - 1e-3f) < 1e-9f, "last step: %g", moe_lr_at(&s, 110));
    CHECK(fabsf(moe_lr_at(&s, 500) - 1e-3f) < 1e-9f, "past the end: %g", moe_lr_at(&s, 500));
    for (long t = 11; t < 110; t++) CHECK(moe_lr_at(&s, t + 1) <= moe_lr_at(&s, t), "not decaying at step %ld", t);
}

int main(void) {
    test_schedule();
    moe_model_config c = moe_model_config_default();
    c.vocab_size = 16, c.num_layers = 2, c.d_model = 8, c.num_heads = 2, c.num_kv_heads = 2, c.d_ff = 8, c.seq_len = 4;
    c.moe = moe_config_default(c.d_model, c.d_ff, 4, 2);
    moe_parallel *par;
    moe_model *m;
    CHECK_OK(moe_parallel_create_self(&par));
    CHECK_OK(moe_model_create(&c, NULL, par, 1, 1, &m));
    CHECK_OK(moe_model_init_weights(m, 5));
    const size_t n = moe_model_num_dense(m) + moe_model_num_expert(m);
    moe_real *g = moe_model_grads(m), *p = moe_model_params(m);
    moe_rng rng = moe_rng_seeded(9);
    moe_rng_fill_uniform(&rng, g, n, 1.0);

    double brute = 0, norm = 0;
    for (size_t i = 0; i < n; i++) brute += (double)g[i] * g[i];
    brute = sqrt(brute);
    CHECK_OK(moe_model_grad_norm(m, par, &norm));
    CHECK(fabs(norm - brute) <= 1e-12 * brute, "norm %.15g, brute force %.15g", norm, brute);

    moe_real *before = malloc(n * sizeof *before);
    CHECK(moe_model_clip_factor(norm, (float)(2 * norm)) == 1.0, "clipped below the threshold");
    CHECK(moe_model_clip_factor(norm, 0.0f) == 1.0, "clipped with clipping off (0)");
    const double factor = moe_model_clip_factor(norm, 1.0f);
    CHECK(fabs(factor - 1.0 / norm) < 1e-12, "clip factor %g, want 1 / %g", factor, norm);

    /* zero gradients: AdamW's update is pure decay, p -= lr * wd * p, and only where decay is on */
    memset(g, 0, n * sizeof *g);
    memcpy(before, p, n * sizeof *p);
    moe_real *m1 = calloc(n, sizeof *m1), *m2 = calloc(n, sizeof *m2);
    const moe_adamw_params hp = {.lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                                 .weight_decay = 0.5f, .step = 1};
    CHECK_OK(moe_model_adamw_step(m, m1, m2, &hp));
    int spans_n, norms = 0;
    const moe_model_tensor *spans = moe_model_tensors(m, &spans_n);
    for (int s = 0; s < spans_n; s++)
        for (size_t i = spans[s].offset; i < spans[s].offset + spans[s].count; i++) {
            moe_real want = moe_tensor_decays(&spans[s]) ? before[i] - 0.1f * 0.5f * before[i] : before[i];
            CHECK(fabsf(p[i] - want) <= 1e-7f * fabsf(want), "%s[%zu]: %g, want %g", spans[s].name, i - spans[s].offset,
                  p[i], want);
            norms += !moe_tensor_decays(&spans[s]);
        }
    CHECK(norms == (2 * c.num_layers + 1) * c.d_model, "%d norm weights found", norms);
    free(before), free(m1), free(m2);
    moe_model_destroy(m);
    moe_parallel_destroy(par);
    return test_finish("test_optimizer");
}
