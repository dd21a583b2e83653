/* test_gpu_topk.cu — moe_router_topk_cuda against moe_router_topk_cpu, exactly, on scores full of ties
 * (quantised to a few levels) and on continuous scores. Exit 77 (skip) when no GPU is present.
 * Run: meson test -C build --suite gpu */
#include <stdlib.h>
#include <string.h>

extern "C" {
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

int main(void) {
    moe_gpu *gpu = test_gpu_require("test_gpu_topk");
    moe_rng rng = moe_rng_seeded(21);
    const int shapes[][3] = {{1, 1, 1}, {1000, 8, 1}, {1000, 8, 2}, {777, 64, 8}, {500, 256, 8}, {64, 1024, 32}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int levels = 0; levels <= 4; levels += 4) compare(gpu, shapes[s][0], shapes[s][1], shapes[s][2], levels, &rng);
    moe_gpu_destroy(gpu);
    return test_finish("test_gpu_topk");
}
