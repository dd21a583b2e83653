/* test_gpu_topk.cu — moe_router_topk_cuda against moe_router_topk_cpu, exactly, on scores full of ties
 * (quantised to a few levels) and on continuous scores; and group-limited routing's mask (router/group.h) bitwise
 * the CPU's, then top-k over it. Exit 77 (skip) when no GPU is present.
 * Run: meson test -C build --suite gpu */
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "router/group.h"
#include "router/topk.h"
#include "tests/test_gpu_util.h"
}

static void compare(moe_gpu *gpu, int T, int E, int k, int levels, moe_rng *rng) {
    size_t n = (size_t)T * E;
    float *scores = (float *)malloc(n * sizeof(float));
    int *want = (int *)malloc((size_t)T * k * sizeof(int)), *got = (int *)malloc((size_t)T * k * sizeof(int));
    for (size_t i = 0; i < n; i++) {
        double u = (moe_rng_uniform(rng) + 1) / 2;
        scores[i] = levels ? (float)((int)(u * levels)) / levels : (float)u;
    }
    moe_router_topk_cpu(scores, T, E, k, want);
    float *d_scores = (float *)test_gpu_upload(gpu, scores, n * sizeof(float));
    int *d_expert = (int *)test_gpu_alloc(gpu, (size_t)T * k * sizeof(int));
    CHECK_OK(moe_router_topk_cuda(gpu, d_scores, T, E, k, d_expert));
    test_gpu_download(gpu, got, d_expert, (size_t)T * k * sizeof(int));
    int mismatches = 0;
    for (int i = 0; i < T * k; i++) mismatches += got[i] != want[i];
    CHECK(mismatches == 0, "T=%d E=%d k=%d levels=%d: %d choices differ", T, E, k, levels, mismatches);
    printf("T=%d E=%d k=%d levels=%d: %d mismatches\n", T, E, k, levels, mismatches);
    test_gpu_free(gpu, d_scores);
    test_gpu_free(gpu, d_expert);
    free(scores), free(want), free(got);
}

/* DeepSeek-V3's shape scaled down: E experts in G groups, the best topk_groups kept, then top-k among them */
static void compare_groups(moe_gpu *gpu, int T, int E, int G, int topk_groups, int k, int levels, int score,
                           moe_rng *rng) {
    const size_t n = (size_t)T * E;
    float *scores = (float *)malloc(n * sizeof(float)), *want = (float *)malloc(n * sizeof(float));
    float *got = (float *)malloc(n * sizeof(float));
    int *want_e = (int *)malloc((size_t)T * k * sizeof(int)), *got_e = (int *)malloc((size_t)T * k * sizeof(int));
    for (size_t i = 0; i < n; i++) { /* sigmoid scores plus a bias of either sign */
        double u = (moe_rng_uniform(rng) + 1) / 2;
        scores[i] = (levels ? (float)((int)(u * levels)) / levels : (float)u) - 0.25f;
    }
    moe_router_group_mask_cpu(scores, T, E, G, topk_groups, score, want);
    moe_router_topk_cpu(want, T, E, k, want_e);
    float *d_scores = (float *)test_gpu_upload(gpu, scores, n * sizeof(float));
    float *d_masked = (float *)test_gpu_alloc(gpu, n * sizeof(float));
    int *d_expert = (int *)test_gpu_alloc(gpu, (size_t)T * k * sizeof(int));
    test_gpu_poison(gpu, d_masked, n * sizeof(float));
    CHECK_OK(moe_router_group_mask_cuda(gpu, d_scores, T, E, G, topk_groups, score, d_masked));
    CHECK_OK(moe_router_topk_cuda(gpu, d_masked, T, E, k, d_expert));
    test_gpu_download(gpu, got, d_masked, n * sizeof(float));
    test_gpu_download(gpu, got_e, d_expert, (size_t)T * k * sizeof(int));
    int mismatches = 0;
    for (int i = 0; i < T * k; i++) mismatches += got_e[i] != want_e[i];
    CHECK(!memcmp(got, want, n * sizeof(float)), "groups T=%d E=%d G=%d/%d: masks differ", T, E, topk_groups, G);
    CHECK(mismatches == 0, "groups T=%d E=%d G=%d/%d k=%d: %d choices differ", T, E, topk_groups, G, k, mismatches);
    printf("groups T=%d E=%d G=%d of %d k=%d levels=%d score %s: %d mismatches\n", T, E, topk_groups, G, k, levels,
           score == MOE_GROUP_SCORE_MAX ? "max" : "top2", mismatches);
    test_gpu_free(gpu, d_scores), test_gpu_free(gpu, d_masked), test_gpu_free(gpu, d_expert);
    free(scores), free(want), free(got), free(want_e), free(got_e);
}

int main(void) {
    moe_gpu *gpu = test_gpu_require("test_gpu_topk");
    moe_rng rng = moe_rng_seeded(21);
    const int shapes[][3] = {{1, 1, 1}, {1000, 8, 1}, {1000, 8, 2}, {777, 64, 8}, {500, 256, 8}, {64, 1024, 32}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int levels = 0; levels <= 4; levels += 4) compare(gpu, shapes[s][0], shapes[s][1], shapes[s][2], levels, &rng);
    for (int levels = 0; levels <= 4; levels += 4) {
        compare_groups(gpu, 1000, 256, 8, 4, 8, levels, MOE_GROUP_SCORE_TOP2, &rng); /* DeepSeek-V3's routing */
        compare_groups(gpu, 333, 64, 32, 3, 4, levels, MOE_GROUP_SCORE_TOP2, &rng);  /* groups of 2: both */
        compare_groups(gpu, 1000, 160, 8, 3, 6, levels, MOE_GROUP_SCORE_MAX, &rng);  /* DeepSeek-V2's */
        compare_groups(gpu, 500, 16, 16, 4, 3, levels, MOE_GROUP_SCORE_MAX, &rng);   /* groups of 1 expert */
    }
    moe_gpu_destroy(gpu);
    return test_finish("test_gpu_topk");
}
