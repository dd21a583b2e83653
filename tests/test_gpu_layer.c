/* test_gpu_layer.c — the whole MoE layer on the GPU (the CUDA runtime, a world of one) against the CPU layer.
 *
 * Routing: the GPU router (fp32 cuBLAS) and the CPU router (OpenBLAS) may round a logit differently, which
 * can flip a near-tie in top-k; the test requires at most 0.5% of the tokens to choose differently, then
 * replays the GPU's choices in the CPU layer (moe_layer_force_routing) so that the numbers compare on the
 * same routes. Capacity: with the same choices the kept sets must be equal exactly (one host rule).
 * Numbers: the CPU reference runs on the bf16-rounded input and expert weights; what remains is the bf16
 * rounding of the GPU's intermediate rows (H13, act, y, dy), so the tolerances are those of a bf16 chain
 * (the "layer ..." rows of tests/test_tolerance.c). Outputs of the GPU are poisoned (0xFF) before each run.
 * Determinism: a second GPU run gives bitwise the same outputs, input gradients and weight gradients, computed from
 * the experts' bf16 packs kept under the weights' version (their fp32 weights zeroed after the packs were made).
 * Cases: dropless softmax; capacity by token order; capacity by score with sigmoid + bias; skewed routing
 * with an expert that receives zero rows; a width that is not a multiple of 8 (scalar row kernels). */
#include <stdlib.h>
#include <string.h>

#include "alltoall/parallel_gpu.h"
#include "kernels/cast.h"
#include "moe/layer_internal.h"
#include "tests/test_gpu_util.h"
#include "tests/test_tolerance.h"

typedef struct {
    const char *name;
    int d, f, E, k, T;
    moe_score_func func;
    float cf;
    moe_drop_priority prio;
    int zero_rows_expert; /* >= 0: force routing that never picks this expert */
} layer_case;

static void round_to_bf16(moe_real *v, size_t n) {
    for (size_t i = 0; i < n; i++) v[i] = moe_bf16_round(v[i]);
}

typedef struct {
    float *out, *dx, *grads; /* host copies */
    int *experts;            /* [T*k] the GPU's choices */
    moe_layer_stats st;
    int num_dropped;
} gpu_result;

/* One forward + backward of a fresh GPU layer on host inputs; results back on the host. */
/* kept_packs: the weights carry a version (core/types.h), and a first forward makes the experts' bf16 packs; then the
 * experts' fp32 weights on the device are overwritten under the same version, so the measured forward and backward
 * must compute from the kept packs (moe/layer_ops_cuda.c) to give the bits of a run without a version. */
static gpu_result run_gpu(moe_runtime *rt, const moe_parallel *par, const moe_config *cfg, const float *w_host,
                          const float *x, const float *dout, const moe_real *bias, int T, const int *forced,
                          int kept_packs) {
    moe_gpu *gpu = moe_runtime_gpu(rt);
    size_t P = moe_layer_num_params(cfg, 1), n = (size_t)T * cfg->d_model;
    float *w_dev = test_gpu_upload(gpu, w_host, P * sizeof(float));
    float *g_dev = test_gpu_alloc(gpu, P * sizeof(float));
    CHECK_OK(moe_gpu_zero(gpu, g_dev, P * sizeof(float)));
    float *x_dev = test_gpu_upload(gpu, x, n * sizeof(float)), *dout_dev = test_gpu_upload(gpu, dout, n * sizeof(float));
    float *out_dev = test_gpu_alloc(gpu, n * sizeof(float)), *dx_dev = test_gpu_alloc(gpu, n * sizeof(float));
    moe_layer_weights w = moe_layer_weights_view(cfg, 1, w_dev), g = moe_layer_weights_view(cfg, 1, g_dev);
    moe_layer *L;
    CHECK_OK(moe_layer_create(cfg, rt, par, &L));
    memcpy(moe_layer_expert_bias(L), bias, cfg->num_experts * sizeof(moe_real));
    gpu_result r = {malloc(n * sizeof(float)), malloc(n * sizeof(float)), malloc(P * sizeof(float)),
                    malloc((size_t)T * cfg->top_k * sizeof(int)), .num_dropped = 0};
    if (kept_packs) {
        w.version = 7;
        if (forced) CHECK_OK(moe_layer_force_routing(L, forced));
        CHECK_OK(moe_layer_forward(L, &w, x_dev, T, out_dev, &r.st));
        const size_t router = (size_t)cfg->num_experts * cfg->d_model;
        CHECK_OK(moe_gpu_zero(gpu, w_dev + router, (P - router) * sizeof(float))); /* the experts' fp32 weights */
    }
    if (forced) CHECK_OK(moe_layer_force_routing(L, forced));
    CHECK_OK(moe_layer_forward(L, &w, x_dev, T, out_dev, &r.st));
    CHECK_OK(moe_layer_backward(L, &w, dout_dev, dx_dev, &g));
    int Tg = 0;
    CHECK_OK(moe_layer_gather_routing(L, r.experts, &Tg));
    CHECK(Tg == T, "global routing of the GPU layer: %d tokens, want %d", Tg, T);
    r.num_dropped = r.st.num_dropped;
    test_gpu_download(gpu, r.out, out_dev, n * sizeof(float));
    test_gpu_download(gpu, r.dx, dx_dev, n * sizeof(float));
    test_gpu_download(gpu, r.grads, g_dev, P * sizeof(float));
    moe_layer_destroy(L);
    void *bufs[] = {w_dev, g_dev, x_dev, dout_dev, out_dev, dx_dev};
    for (int i = 0; i < 6; i++) test_gpu_free(gpu, bufs[i]);
    return r;
}

static void free_result(gpu_result *r) { free(r->out), free(r->dx), free(r->grads), free(r->experts); }

static void run_case(moe_runtime *rt, const moe_parallel *par, const layer_case *c) {
    printf("-- %s (T=%d d=%d d_ff=%d E=%d k=%d)\n", c->name, c->T, c->d, c->f, c->E, c->k);
    moe_config cfg = moe_config_default(c->d, c->f, c->E, c->k);
    cfg.score_func = c->func, cfg.capacity_factor = c->cf, cfg.drop_priority = c->prio;
    cfg.aux_loss_coef = 0.1f, cfg.z_loss_coef = 0.01f;
    cfg.precision = MOE_PRECISION_BF16; /* the GPU's experts; the CPU reference rounds the same GEMM inputs */
    const int T = c->T, k = c->k;
    size_t n = (size_t)T * c->d, P = moe_layer_num_params(&cfg, 1);
    moe_rng rng = moe_rng_seeded(606);
    test_weights w = test_weights_random(&cfg, 1, &rng);
    moe_real *x = test_alloc_uniform(&rng, n, 1.0), *dout = test_alloc_uniform(&rng, n, 1.0);
    moe_real bias[256] = {0};
    if (c->func == MOE_SCORE_SIGMOID) moe_rng_fill_uniform(&rng, bias, c->E, 0.3);
    /* the GPU rounds these to bf16 on the way into the experts; the reference starts from the same values */
    moe_layer_weights view = moe_layer_weights_view(&cfg, 1, w.buffer);
    round_to_bf16(x, n);
    round_to_bf16(view.w1, 3 * (size_t)c->E * c->f * c->d);
    int *forced = NULL;
    if (c->zero_rows_expert >= 0) { /* token t picks experts t, t+1, ... mod E, skipping the empty one */
        forced = malloc((size_t)T * k * sizeof(int));
        for (int t = 0; t < T; t++)
            for (int j = 0, e = t % c->E; j < k; e = (e + 1) % c->E)
                if (e != c->zero_rows_expert && (t % 3 || e < c->E / 2)) forced[t * k + j++] = e;
    }

    gpu_result g1 = run_gpu(rt, par, &cfg, w.buffer, x, dout, bias, T, forced, 0);
    gpu_result g2 = run_gpu(rt, par, &cfg, w.buffer, x, dout, bias, T, forced, 1);
    CHECK(!memcmp(g1.out, g2.out, n * sizeof(float)) && !memcmp(g1.dx, g2.dx, n * sizeof(float)) &&
              !memcmp(g1.grads, g2.grads, P * sizeof(float)) && !memcmp(g1.experts, g2.experts, (size_t)T * k * sizeof(int)),
          "%s: two GPU runs differ (the second from the experts' kept bf16 packs, their fp32 weights zeroed)", c->name);

    /* the CPU layer on the same input; first its own routing, to count differing choices */
    moe_layer *L;
    CHECK_OK(moe_layer_create(&cfg, NULL, NULL, &L));
    memcpy(moe_layer_expert_bias(L), bias, c->E * sizeof(moe_real));
    moe_real *out = calloc(n, sizeof(moe_real)), *dx = calloc(n, sizeof(moe_real));
    test_weights grads = test_weights_zero(&cfg, 1);
    moe_layer_stats st;
    if (forced) CHECK_OK(moe_layer_force_routing(L, forced));
    CHECK_OK(moe_layer_forward(L, &view, x, T, out, &st));
    int Tg = 0, differing = 0, *cpu_choice = malloc((size_t)T * k * sizeof(int));
    CHECK_OK(moe_layer_gather_routing(L, cpu_choice, &Tg));
    for (int t = 0; t < T; t++) differing += memcmp(cpu_choice + t * k, g1.experts + t * k, k * sizeof(int)) != 0;
    printf("tokens choosing differently on CPU and GPU: %d of %d\n", differing, T);
    CHECK(differing <= T / 200, "%s: %d of %d tokens route differently", c->name, differing, T);
    free(cpu_choice);

    /* then on the GPU's routes */
    CHECK_OK(moe_layer_force_routing(L, g1.experts));
    CHECK_OK(moe_layer_forward(L, &view, x, T, out, &st));
    CHECK_OK(moe_layer_backward(L, &view, dout, dx, &grads.w));
    CHECK(st.num_dropped == g1.num_dropped && st.capacity == g1.st.capacity, "%s: drops %d vs %d", c->name,
          st.num_dropped, g1.num_dropped);
    if (c->zero_rows_expert >= 0)
        CHECK(st.num_tokens_per_expert[c->zero_rows_expert] == 0, "%s: the empty expert got rows", c->name);
    test_tolerance_check_scalar("layer aux loss", "f32", g1.st.aux_loss, st.aux_loss, "%s", c->name);
    test_tolerance_check_scalar("layer z loss", "f32", g1.st.z_loss, st.z_loss, "%s", c->name);
    test_tolerance_check("layer out", "bf16", g1.out, out, n, "out");
    test_tolerance_check("layer dx", "bf16", g1.dx, dx, n, "dx");
    size_t router = (size_t)c->E * c->d;
    test_tolerance_check("layer drouter_w", "bf16", g1.grads, grads.buffer, router, "d router_w");
    test_tolerance_check("layer dexperts", "bf16", g1.grads + router, grads.buffer + router, P - router, "d w1|w3|w2");

    moe_layer_destroy(L);
    free_result(&g1), free_result(&g2);
    free(out), free(dx), free(x), free(dout), free(forced);
    test_weights_free(&w), test_weights_free(&grads);
}

int main(void) {
    moe_gpu *probe = test_gpu_require("test_gpu_layer");
    moe_gpu_destroy(probe);
    moe_runtime *rt;
    moe_parallel *par;
    CHECK_OK(moe_runtime_create_cuda(0, &rt));
    CHECK_OK(moe_parallel_create_self_gpu(moe_runtime_gpu(rt), &par));
    const layer_case cases[] = {
        {"dropless softmax", 256, 512, 8, 2, 1024, MOE_SCORE_SOFTMAX, 0, MOE_DROP_BY_TOKEN_ORDER, -1},
        {"capacity 1.0 by token order", 128, 256, 16, 2, 2048, MOE_SCORE_SOFTMAX, 1.0f, MOE_DROP_BY_TOKEN_ORDER, -1},
        {"sigmoid + bias, capacity 1.25 by score", 128, 192, 8, 4, 1000, MOE_SCORE_SIGMOID, 1.25f, MOE_DROP_BY_SCORE, -1},
        {"skewed, expert 5 gets no rows", 64, 128, 8, 2, 777, MOE_SCORE_SOFTMAX, 0, MOE_DROP_BY_TOKEN_ORDER, 5},
        {"top-1, width 12 (scalar row kernels)", 12, 40, 4, 1, 300, MOE_SCORE_SOFTMAX, 1.5f, MOE_DROP_BY_TOKEN_ORDER, -1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) run_case(rt, par, &cases[i]);
    moe_parallel_destroy(par);
    moe_runtime_destroy(rt);
    return test_finish("test_gpu_layer");
}
