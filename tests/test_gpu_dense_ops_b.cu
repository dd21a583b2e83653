/* test_gpu_dense_ops_b.cu — the dense model's CUDA kernels for RMSNorm, RoPE, cross-entropy and causal GQA
 * attention against their CPU twins (kernels/rmsnorm_cpu.c, rope_cpu.c, cross_entropy_cpu.c, attention_cpu.c:
 * the oracle) on the same inputs, within the "rmsnorm", "rope", "cross entropy" and "attention" rows (f32) of
 * tests/test_tolerance.c. Shapes are odd on purpose:
 * d not a multiple of 32, one token, S = 1 and 37, H = 4 with KV = 1, 2 and 4, head_dim 16 and 24, more
 * tokens than one dw chunk. Every op runs twice on the same inputs and must give the same bits (no atomics).
 * Outputs are poisoned (0xFF, a NaN) before each run; accumulating outputs (rmsnorm's dx, dw) and in-place
 * ones (rope, cross-entropy backward) restart from the same uploaded values. Backward ops take the CPU's saved
 * values (rstd, att) so that they see exactly the CPU's inputs.
 * Exit 77 (skip) when no GPU is present. Run: meson test -C build --suite gpu */
#include <math.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "core/threads.h"
#include "kernels/attention.h"
#include "kernels/cross_entropy.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "tests/test_gpu_util.h"
#include "tests/test_tolerance.h"
}

static float *host_alloc(size_t count) {
    float *p = (float *)malloc(count ? count * sizeof(float) : 1);
    if (!p) {
        fprintf(stderr, "test_gpu_dense_ops_b: out of memory\n");
        exit(1);
    }
    return p;
}

static float *host_copy(const float *a, size_t count) {
    float *b = host_alloc(count);
    memcpy(b, a, count * sizeof(float));
    return b;
}

/* a new host array with count floats of dev (synchronises) */
static float *download_new(moe_gpu *gpu, const float *dev, size_t count) {
    float *host = host_alloc(count);
    test_gpu_download(gpu, host, dev, count * sizeof(float));
    return host;
}

static void check_same_bits(const char *what, const char *shape, const void *a, const void *b, size_t nbytes) {
    CHECK(memcmp(a, b, nbytes) == 0, "%s %s: two runs on the same inputs differ", what, shape);
}

static void test_rmsnorm(moe_gpu *gpu, moe_rng *rng, int T, int d) {
    char shape[64];
    snprintf(shape, sizeof shape, "T=%d d=%d", T, d);
    const size_t td = (size_t)T * d;
    const float eps = 1e-5f;
    float *x = test_alloc_uniform(rng, td, 1.0), *w = test_alloc_uniform(rng, d, 1.0);
    float *dy = test_alloc_uniform(rng, td, 1.0);
    float *dx0 = test_alloc_uniform(rng, td, 1.0), *dw0 = test_alloc_uniform(rng, d, 1.0);
    float *want_y = host_alloc(td), *want_rstd = host_alloc(T);
    float *want_dx = host_copy(dx0, td), *want_dw = host_copy(dw0, d);
    moe_rmsnorm_forward_cpu(x, w, T, d, eps, want_y, want_rstd);
    moe_rmsnorm_backward_cpu(x, w, want_rstd, dy, T, d, want_dx, want_dw);

    float *d_x = (float *)test_gpu_upload(gpu, x, td * sizeof(float));
    float *d_w = (float *)test_gpu_upload(gpu, w, d * sizeof(float));
    float *d_dy = (float *)test_gpu_upload(gpu, dy, td * sizeof(float));
    float *d_rstd_cpu = (float *)test_gpu_upload(gpu, want_rstd, T * sizeof(float));
    float *d_y = (float *)test_gpu_alloc(gpu, td * sizeof(float));
    float *d_rstd = (float *)test_gpu_alloc(gpu, T * sizeof(float));
    float *d_dx = (float *)test_gpu_alloc(gpu, td * sizeof(float));
    float *d_dw = (float *)test_gpu_alloc(gpu, d * sizeof(float));
    float *y[2], *rstd[2], *dx[2], *dw[2];
    for (int run = 0; run < 2; run++) {
        test_gpu_poison(gpu, d_y, td * sizeof(float));
        test_gpu_poison(gpu, d_rstd, T * sizeof(float));
        CHECK_OK(moe_rmsnorm_forward_cuda(gpu, d_x, d_w, T, d, eps, d_y, d_rstd));
        y[run] = download_new(gpu, d_y, td), rstd[run] = download_new(gpu, d_rstd, T);
        test_gpu_poison(gpu, d_dx, td * sizeof(float));
        test_gpu_poison(gpu, d_dw, d * sizeof(float));
        CHECK_OK(moe_gpu_upload(gpu, d_dx, dx0, td * sizeof(float)));
        CHECK_OK(moe_gpu_upload(gpu, d_dw, dw0, d * sizeof(float)));
        CHECK_OK(moe_rmsnorm_backward_cuda(gpu, d_x, d_w, d_rstd_cpu, d_dy, T, d, d_dx, d_dw));
        dx[run] = download_new(gpu, d_dx, td), dw[run] = download_new(gpu, d_dw, d);
    }
    test_tolerance_check("rmsnorm", "f32", y[0], want_y, td, "y %s", shape);
    test_tolerance_check("rmsnorm", "f32", rstd[0], want_rstd, T, "rstd %s", shape);
    test_tolerance_check("rmsnorm backward", "f32", dx[0], want_dx, td, "dx (accumulated) %s", shape);
    test_tolerance_check("rmsnorm backward", "f32", dw[0], want_dw, d, "dw (accumulated) %s", shape);
    check_same_bits("rmsnorm y", shape, y[0], y[1], td * sizeof(float));
    check_same_bits("rmsnorm rstd", shape, rstd[0], rstd[1], T * sizeof(float));
    check_same_bits("rmsnorm dx", shape, dx[0], dx[1], td * sizeof(float));
    check_same_bits("rmsnorm dw", shape, dw[0], dw[1], d * sizeof(float));
    test_gpu_free(gpu, d_x), test_gpu_free(gpu, d_w), test_gpu_free(gpu, d_dy), test_gpu_free(gpu, d_rstd_cpu);
    test_gpu_free(gpu, d_y), test_gpu_free(gpu, d_rstd), test_gpu_free(gpu, d_dx), test_gpu_free(gpu, d_dw);
    for (int run = 0; run < 2; run++) free(y[run]), free(rstd[run]), free(dx[run]), free(dw[run]);
    free(x), free(w), free(dy), free(dx0), free(dw0), free(want_y), free(want_rstd), free(want_dx), free(want_dw);
}

/* forward and backward, each in place on a fresh upload of the same x */
static void test_rope(moe_gpu *gpu, moe_rng *rng, int num_seqs, int S, int H, int hd, const moe_rope *rope) {
    char shape[120];
    snprintf(shape, sizeof shape, "seqs=%d S=%d H=%d hd=%d theta=%g yarn=%g", num_seqs, S, H, hd, rope->theta,
             rope->yarn_factor);
    const size_t count = (size_t)num_seqs * S * H * hd;
    float *x = test_alloc_uniform(rng, count, 1.0);
    float *d_x = (float *)test_gpu_alloc(gpu, count * sizeof(float));
    for (int backward = 0; backward < 2; backward++) {
        const char *what = backward ? "rope backward" : "rope forward";
        float *want = host_copy(x, count), *got[2];
        if (backward)
            moe_rope_backward_cpu(want, num_seqs, S, H, hd, rope);
        else
            moe_rope_forward_cpu(want, num_seqs, S, H, hd, rope);
        for (int run = 0; run < 2; run++) {
            test_gpu_poison(gpu, d_x, count * sizeof(float));
            CHECK_OK(moe_gpu_upload(gpu, d_x, x, count * sizeof(float)));
            if (backward)
                CHECK_OK(moe_rope_backward_cuda(gpu, d_x, num_seqs, S, H, hd, rope));
            else
                CHECK_OK(moe_rope_forward_cuda(gpu, d_x, num_seqs, S, H, hd, rope));
            got[run] = download_new(gpu, d_x, count);
        }
        test_tolerance_check("rope", "f32", got[0], want, count, "%s %s", what, shape);
        check_same_bits(what, shape, got[0], got[1], count * sizeof(float));
        free(want), free(got[0]), free(got[1]);
    }
    CHECK(moe_rope_forward_cuda(gpu, d_x, num_seqs, S, H, hd + 1, rope) == MOE_ERR_INVALID_ARG,
          "rope %s: an odd head_dim is not rejected", shape);
    test_gpu_free(gpu, d_x);
    free(x);
}

/* logits of scale 5, the last row shifted by +1000 (the max subtraction must keep it finite) */
static void test_cross_entropy(moe_gpu *gpu, moe_rng *rng, int T, int V) {
    char shape[64];
    snprintf(shape, sizeof shape, "T=%d V=%d", T, V);
    const size_t tv = (size_t)T * V;
    float *logits = test_alloc_uniform(rng, tv, 5.0);
    for (int i = 0; i < V; i++) logits[(size_t)(T - 1) * V + i] += 1000.0f;
    int *targets = (int *)malloc((size_t)T * sizeof(int));
    for (int t = 0; t < T; t++) targets[t] = (int)(moe_rng_next(rng) % (uint64_t)V);
    const float scale = 1.0f / T;
    const double want_loss = moe_cross_entropy_forward_cpu(logits, targets, T, V);
    float *want_dl = host_copy(logits, tv);
    moe_cross_entropy_backward_cpu(want_dl, targets, T, V, scale);

    float *d_logits = (float *)test_gpu_upload(gpu, logits, tv * sizeof(float));
    int *d_targets = (int *)test_gpu_upload(gpu, targets, (size_t)T * sizeof(int));
    double loss[2];
    float *dl[2];
    for (int run = 0; run < 2; run++) {
        loss[run] = NAN;
        CHECK_OK(moe_cross_entropy_forward_cuda(gpu, d_logits, d_targets, T, V, &loss[run]));
    }
    test_tolerance_check_scalar("cross entropy loss", "f32", loss[0], want_loss, "loss sum %s", shape);
    check_same_bits("cross entropy loss", shape, &loss[0], &loss[1], sizeof(double));
    for (int run = 0; run < 2; run++) {
        test_gpu_poison(gpu, d_logits, tv * sizeof(float));
        CHECK_OK(moe_gpu_upload(gpu, d_logits, logits, tv * sizeof(float)));
        CHECK_OK(moe_cross_entropy_backward_cuda(gpu, d_logits, d_targets, T, V, scale));
        dl[run] = download_new(gpu, d_logits, tv);
    }
    test_tolerance_check("cross entropy backward", "f32", dl[0], want_dl, tv, "dlogits %s", shape);
    check_same_bits("cross entropy backward", shape, dl[0], dl[1], tv * sizeof(float));
    test_gpu_free(gpu, d_logits), test_gpu_free(gpu, d_targets);
    free(logits), free(targets), free(want_dl), free(dl[0]), free(dl[1]);
}

static void test_attention(moe_gpu *gpu, moe_rng *rng, int num_seqs, int S, int H, int KV, int hd) {
    char shape[80];
    snprintf(shape, sizeof shape, "seqs=%d S=%d H=%d KV=%d hd=%d", num_seqs, S, H, KV, hd);
    const size_t nq = (size_t)num_seqs * S * H * hd, nkv = (size_t)num_seqs * S * KV * hd;
    const size_t natt = (size_t)num_seqs * H * S * S;
    float *q = test_alloc_uniform(rng, nq, 1.0), *k = test_alloc_uniform(rng, nkv, 1.0);
    float *v = test_alloc_uniform(rng, nkv, 1.0), *dout = test_alloc_uniform(rng, nq, 1.0);
    float *want_att = host_alloc(natt), *want_out = host_alloc(nq);
    float *want_dq = host_alloc(nq), *want_dk = host_alloc(nkv), *want_dv = host_alloc(nkv);
    float *scratch = host_alloc((size_t)moe_threads_get() * S * S);
    moe_attention_forward_cpu(q, k, v, num_seqs, S, H, KV, hd, want_att, want_out);
    moe_attention_backward_cpu(q, k, v, want_att, dout, num_seqs, S, H, KV, hd, want_dq, want_dk, want_dv, scratch);

    float *d_q = (float *)test_gpu_upload(gpu, q, nq * sizeof(float));
    float *d_k = (float *)test_gpu_upload(gpu, k, nkv * sizeof(float));
    float *d_v = (float *)test_gpu_upload(gpu, v, nkv * sizeof(float));
    float *d_dout = (float *)test_gpu_upload(gpu, dout, nq * sizeof(float));
    float *d_att_cpu = (float *)test_gpu_upload(gpu, want_att, natt * sizeof(float));
    float *d_att = (float *)test_gpu_alloc(gpu, natt * sizeof(float));
    float *d_out = (float *)test_gpu_alloc(gpu, nq * sizeof(float));
    float *d_dq = (float *)test_gpu_alloc(gpu, nq * sizeof(float));
    float *d_dk = (float *)test_gpu_alloc(gpu, nkv * sizeof(float));
    float *d_dv = (float *)test_gpu_alloc(gpu, nkv * sizeof(float));
    float *att[2], *out[2], *dq[2], *dk[2], *dv[2];
    for (int run = 0; run < 2; run++) {
        test_gpu_poison(gpu, d_att, natt * sizeof(float));
        test_gpu_poison(gpu, d_out, nq * sizeof(float));
        CHECK_OK(moe_attention_forward_cuda(gpu, d_q, d_k, d_v, num_seqs, S, H, KV, hd, d_att, d_out));
        att[run] = download_new(gpu, d_att, natt), out[run] = download_new(gpu, d_out, nq);
        test_gpu_poison(gpu, d_dq, nq * sizeof(float));
        test_gpu_poison(gpu, d_dk, nkv * sizeof(float));
        test_gpu_poison(gpu, d_dv, nkv * sizeof(float));
        CHECK_OK(moe_attention_backward_cuda(gpu, d_q, d_k, d_v, d_att_cpu, d_dout, num_seqs, S, H, KV, hd, d_dq, d_dk,
                                             d_dv));
        dq[run] = download_new(gpu, d_dq, nq), dk[run] = download_new(gpu, d_dk, nkv);
        dv[run] = download_new(gpu, d_dv, nkv);
    }
    test_tolerance_check("attention", "f32", att[0], want_att, natt, "att %s", shape);
    test_tolerance_check("attention", "f32", out[0], want_out, nq, "out %s", shape);
    test_tolerance_check("attention backward", "f32", dq[0], want_dq, nq, "dq %s", shape);
    test_tolerance_check("attention backward", "f32", dk[0], want_dk, nkv, "dk %s", shape);
    test_tolerance_check("attention backward", "f32", dv[0], want_dv, nkv, "dv %s", shape);
    /* causality, exactly: nothing above the diagonal */
    size_t above = 0;
    for (size_t r = 0; r < (size_t)num_seqs * H * S; r++)
        for (int j = (int)(r % S) + 1; j < S; j++) above += att[0][r * S + j] != 0.0f;
    CHECK(above == 0, "attention %s: %zu probabilities above the diagonal are not 0", shape, above);
    check_same_bits("attention att", shape, att[0], att[1], natt * sizeof(float));
    check_same_bits("attention out", shape, out[0], out[1], nq * sizeof(float));
    check_same_bits("attention dq", shape, dq[0], dq[1], nq * sizeof(float));
    check_same_bits("attention dk", shape, dk[0], dk[1], nkv * sizeof(float));
    check_same_bits("attention dv", shape, dv[0], dv[1], nkv * sizeof(float));
    CHECK(moe_attention_forward_cuda(gpu, d_q, d_k, d_v, num_seqs, S, H, 3, hd, d_att, d_out) == MOE_ERR_INVALID_ARG,
          "attention %s: KV = 3 (not dividing H = %d) is not rejected", shape, H);
    test_gpu_free(gpu, d_q), test_gpu_free(gpu, d_k), test_gpu_free(gpu, d_v), test_gpu_free(gpu, d_dout);
    test_gpu_free(gpu, d_att_cpu), test_gpu_free(gpu, d_att), test_gpu_free(gpu, d_out);
    test_gpu_free(gpu, d_dq), test_gpu_free(gpu, d_dk), test_gpu_free(gpu, d_dv);
    for (int run = 0; run < 2; run++) free(att[run]), free(out[run]), free(dq[run]), free(dk[run]), free(dv[run]);
    free(q), free(k), free(v), free(dout), free(want_att), free(want_out), free(want_dq), free(want_dk), free(want_dv);
    free(scratch);
}

int main(void) {
    moe_gpu *gpu = test_gpu_require("test_gpu_dense_ops_b");
    moe_rng rng = moe_rng_seeded(20240611);

    test_rmsnorm(gpu, &rng, 1, 1);
    test_rmsnorm(gpu, &rng, 37, 45);
    test_rmsnorm(gpu, &rng, 300, 1000); /* 5 dw chunks of 64 tokens, the last partial */
    test_rmsnorm(gpu, &rng, 3, 4099);

    const moe_rope base = moe_rope_plain(10000.0), big = moe_rope_plain(1e6);
    /* DeepSeek-V3's YaRN (factor 40 over 4096 positions), its amplitude made other than 1 */
    const moe_rope yarn = {10000.0, 40, 4096, 32, 1, 1.25};
    test_rope(gpu, &rng, 2, 1, 4, 16, &base);
    test_rope(gpu, &rng, 2, 37, 4, 24, &base);
    test_rope(gpu, &rng, 1, 4096, 2, 16, &big); /* large angles: p f_0 = p up to 4095 rad */
    test_rope(gpu, &rng, 2, 300, 2, 64, &yarn);

    test_cross_entropy(gpu, &rng, 1, 7);
    test_cross_entropy(gpu, &rng, 37, 1000);
    test_cross_entropy(gpu, &rng, 300, 32003);

    test_attention(gpu, &rng, 2, 1, 4, 2, 16);
    test_attention(gpu, &rng, 2, 37, 4, 2, 24);
    test_attention(gpu, &rng, 2, 37, 4, 4, 16);
    test_attention(gpu, &rng, 3, 37, 4, 1, 24);
    test_attention(gpu, &rng, 1, 130, 4, 2, 16);

    moe_gpu_destroy(gpu);
    return test_finish("test_gpu_dense_ops_b");
}
