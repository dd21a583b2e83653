/* test_attention_gemms.c — the CUDA attention's products (kernels/attention_gemms.h, the list attention.cu hands to
 * cublasSgemmStridedBatched) run on the CPU: each entry as column-major cblas calls, one per sequence, around the
 * two softmax steps written as attention.cu's kernels compute them, compared with the CPU attention
 * (attention_cpu.c) within the "attention" tolerance rows. This checks every transpose, leading dimension, offset,
 * stride and the order of the dK/dV accumulation without a GPU; the kernels themselves are the gpu suite's. */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/threads.h"
#include "kernels/attention.h"
#include "kernels/attention_gemms.h"
#include "tests/test_tolerance.h"
#include "tests/test_util.h"

/* one phase's products, as cuBLAS would run them */
static void run_gemms(moe__att_phase phase, int num_seqs, int S, int H, int KV, int hd, float *const *arrays) {
    moe__att_gemm *g = malloc((size_t)2 * H * sizeof *g);
    CHECK(g != NULL, "out of memory");
    const int count = moe__attention_gemms(phase, S, H, KV, hd, g);
    for (int i = 0; i < count; i++)
        for (int n = 0; n < num_seqs; n++)
            cblas_sgemm(CblasColMajor, g[i].trans_a ? CblasTrans : CblasNoTrans,
                        g[i].trans_b ? CblasTrans : CblasNoTrans, g[i].m, g[i].n, g[i].k, g[i].alpha,
                        arrays[g[i].a] + g[i].a_off + n * g[i].stride_a, g[i].lda,
                        arrays[g[i].b] + g[i].b_off + n * g[i].stride_b, g[i].ldb, g[i].beta,
                        arrays[g[i].c] + g[i].c_off + n * g[i].stride_c, g[i].ldc);
    free(g);
}

/* attention.cu's causal_softmax, row by row */
static void causal_softmax(float *att, size_t rows, int S) {
    for (size_t r = 0; r < rows; r++) {
        float *p = att + r * S, max = -INFINITY;
        const int i = (int)(r % S);
        for (int j = 0; j <= i; j++) max = fmaxf(max, p[j]);
        double sum = 0;
        for (int j = 0; j <= i; j++) sum += p[j] = expf(p[j] - max);
        const float inv = (float)(1 / sum);
        for (int j = 0; j <= i; j++) p[j] *= inv;
        for (int j = i + 1; j < S; j++) p[j] = 0;
    }
}

/* attention.cu's causal_softmax_backward, in place on dS */
static void causal_softmax_backward(const float *att, float *ds, size_t rows, int S, float scale) {
    for (size_t r = 0; r < rows; r++) {
        const float *p = att + r * S;
        float *d = ds + r * S;
        const int i = (int)(r % S);
        double dot = 0;
        for (int j = 0; j <= i; j++) dot += (double)d[j] * p[j];
        for (int j = 0; j <= i; j++) d[j] = p[j] * (d[j] - (float)dot) * scale;
        for (int j = i + 1; j < S; j++) d[j] = 0;
    }
}

static void check_shape(int num_seqs, int S, int H, int KV, int hd) {
    moe_rng rng = moe_rng_seeded((uint64_t)(S * 131 + H * 17 + KV * 5 + hd));
    const size_t nq = (size_t)num_seqs * S * H * hd, nkv = (size_t)num_seqs * S * KV * hd,
                 natt = (size_t)num_seqs * H * S * S;
    float *q = test_alloc_uniform(&rng, nq, 1), *k = test_alloc_uniform(&rng, nkv, 1),
          *v = test_alloc_uniform(&rng, nkv, 1), *dout = test_alloc_uniform(&rng, nq, 1);
    float *att = calloc(natt, 4), *out = calloc(nq, 4), *dq = calloc(nq, 4), *dk = calloc(nkv, 4), *dv = calloc(nkv, 4);
    float *g_att = calloc(natt, 4), *g_out = calloc(nq, 4), *g_ds = calloc(natt, 4), *g_dq = calloc(nq, 4),
          *g_dk = calloc(nkv, 4), *g_dv = calloc(nkv, 4);
    float *scratch = calloc((size_t)moe_threads_get() * S * S, 4);
    CHECK(att && out && dq && dk && dv && g_att && g_out && g_ds && g_dq && g_dk && g_dv && scratch, "out of memory");
    moe_attention_forward_cpu(q, k, v, num_seqs, S, H, KV, hd, att, out);
    moe_attention_backward_cpu(q, k, v, att, dout, num_seqs, S, H, KV, hd, dq, dk, dv, scratch);

    float *arrays[MOE__ATT_ARRAYS] = {0};
    arrays[MOE__ATT_Q] = q, arrays[MOE__ATT_K] = k, arrays[MOE__ATT_V] = v, arrays[MOE__ATT_DOUT] = dout;
    arrays[MOE__ATT_P] = g_att, arrays[MOE__ATT_OUT] = g_out, arrays[MOE__ATT_DS] = g_ds;
    arrays[MOE__ATT_DQ] = g_dq, arrays[MOE__ATT_DK] = g_dk, arrays[MOE__ATT_DV] = g_dv; /* dK, dV start at 0 */
    const size_t rows = (size_t)num_seqs * H * S;
    run_gemms(MOE__ATT_SCORES, num_seqs, S, H, KV, hd, arrays);
    causal_softmax(g_att, rows, S);
    run_gemms(MOE__ATT_OUTPUT, num_seqs, S, H, KV, hd, arrays);
    run_gemms(MOE__ATT_DV_DP, num_seqs, S, H, KV, hd, arrays);
    causal_softmax_backward(g_att, g_ds, rows, S, (float)(1 / sqrt((double)hd)));
    run_gemms(MOE__ATT_DQ_DK, num_seqs, S, H, KV, hd, arrays);

    const char *shape = "seqs %d, S %d, H %d, KV %d, hd %d";
    test_tolerance_check("attention", "f32", g_att, att, natt, shape, num_seqs, S, H, KV, hd);
    test_tolerance_check("attention", "f32", g_out, out, nq, shape, num_seqs, S, H, KV, hd);
    test_tolerance_check("attention backward", "f32", g_dq, dq, nq, shape, num_seqs, S, H, KV, hd);
    test_tolerance_check("attention backward", "f32", g_dk, dk, nkv, shape, num_seqs, S, H, KV, hd);
    test_tolerance_check("attention backward", "f32", g_dv, dv, nkv, shape, num_seqs, S, H, KV, hd);
    float *all[] = {q, k, v, dout, att, out, dq, dk, dv, g_att, g_out, g_ds, g_dq, g_dk, g_dv, scratch};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) free(all[i]);
}

int main(void) {
    const int shapes[][5] = {{2, 1, 4, 2, 16}, {2, 37, 4, 2, 24}, {2, 37, 4, 4, 16}, {3, 37, 4, 1, 24},
                             {1, 130, 4, 2, 16}, {2, 64, 8, 2, 32}};
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
        check_shape(shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3], shapes[i][4]);
    return test_finish("test_attention_gemms");
}
