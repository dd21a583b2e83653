/* test_gpu_topk.cu — router_topk_cuda against router_topk_cpu, exactly, on scores full of ties
 * (quantised to a few levels) and on continuous scores. Exit 77 (skip) when no GPU is present.
 * Run: meson test -C build --suite gpu */
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "router/topk.h"
#include "tests/test_util.h"
}

#define CUDA_CHECK(call)                                                                    \
    do {                                                                                    \
        cudaError_t err_ = (call);                                                          \
        if (err_ != cudaSuccess) {                                                          \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(err_)); \
            exit(1);                                                                        \
        }                                                                                   \
    } while (0)

static void compare(int T, int E, int k, int levels, moe_rng *rng) {
    size_t n = (size_t)T * E;
    float *scores = (float *)malloc(n * sizeof(float));
    int *want = (int *)malloc((size_t)T * k * sizeof(int)), *got = (int *)malloc((size_t)T * k * sizeof(int));
    for (size_t i = 0; i < n; i++) {
        double u = (moe_rng_uniform(rng) + 1) / 2;
        scores[i] = levels ? (float)((int)(u * levels)) / levels : (float)u;
    }
    router_topk_cpu(scores, T, E, k, want);
    float *d_scores;
    int *d_expert;
    CUDA_CHECK(cudaMalloc(&d_scores, n * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&d_expert, (size_t)T * k * sizeof(int)));
    CUDA_CHECK(cudaMemcpy(d_scores, scores, n * sizeof(float), cudaMemcpyHostToDevice));
    CHECK_OK(router_topk_cuda(d_scores, T, E, k, d_expert));
    CUDA_CHECK(cudaMemcpy(got, d_expert, (size_t)T * k * sizeof(int), cudaMemcpyDeviceToHost));
    int mismatches = 0;
    for (int i = 0; i < T * k; i++) mismatches += got[i] != want[i];
    CHECK(mismatches == 0, "T=%d E=%d k=%d levels=%d: %d choices differ", T, E, k, levels, mismatches);
    printf("T=%d E=%d k=%d levels=%d: %d mismatches\n", T, E, k, levels, mismatches);
    CUDA_CHECK(cudaFree(d_scores));
    CUDA_CHECK(cudaFree(d_expert));
    free(scores), free(want), free(got);
}

int main(void) {
    int devices = 0;
    cudaError_t err = cudaGetDeviceCount(&devices);
    if (err != cudaSuccess || devices == 0) {
        printf("skip: no CUDA device (%s)\n", err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
        return TEST_SKIP;
    }
    moe_rng rng = moe_rng_seeded(21);
    const int shapes[][3] = {{1, 1, 1}, {1000, 8, 1}, {1000, 8, 2}, {777, 64, 8}, {500, 256, 8}, {64, 1024, 32}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int levels = 0; levels <= 4; levels += 4) compare(shapes[s][0], shapes[s][1], shapes[s][2], levels, &rng);
    return test_finish("test_gpu_topk");
}
