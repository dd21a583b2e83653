/* test_gpu_util.c — see test_gpu_util.h. */
#include "tests/test_gpu_util.h"

#include <stdlib.h>

#include "core/fail.h"
#include "core/gpu_cuda.h"

int test_gpu_device_count(const char *test_name) {
    int n = 0;
    moe_status st = moe_gpu_device_count(&n);
    if (st != MOE_OK) {
        fprintf(stderr, "%s: FAIL: %s\n", test_name, moe_failure_message(st));
        exit(1);
    }
    return n;
}

moe_gpu *test_gpu_require(const char *test_name) {
    int n = test_gpu_device_count(test_name);
    if (n == 0) {
        printf("%s: skip: no CUDA device on this machine\n", test_name);
        exit(TEST_SKIP);
    }
    moe_gpu *gpu = NULL;
    moe_status st = moe_gpu_create(0, &gpu);
    if (st != MOE_OK) {
        fprintf(stderr, "%s: a CUDA device is present but its context failed: %s\n", test_name, moe_status_string(st));
        exit(1);
    }
    return gpu;
}

static void must(moe_status st, const char *what) {
    if (st == MOE_OK) return;
    fprintf(stderr, "FAIL: %s: %s\n", what, moe_status_string(st));
    exit(1);
}

void test_gpu_poison(moe_gpu *gpu, void *dev, size_t nbytes) {
    if (cudaMemsetAsync(dev, 0xFF, nbytes, gpu->stream) != cudaSuccess) must(MOE_ERR_CUDA, "poison");
}

void *test_gpu_alloc(moe_gpu *gpu, size_t nbytes) {
    void *p = NULL;
    must(moe_gpu_alloc(gpu, nbytes, &p), "cudaMalloc");
    test_gpu_poison(gpu, p, nbytes ? nbytes : 1);
    return p;
}

void *test_gpu_upload(moe_gpu *gpu, const void *host, size_t nbytes) {
    void *p = test_gpu_alloc(gpu, nbytes);
    must(moe_gpu_upload(gpu, p, host, nbytes), "upload");
    return p;
}

void test_gpu_download(moe_gpu *gpu, void *host, const void *dev, size_t nbytes) {
    must(moe_gpu_download(gpu, host, dev, nbytes), "download");
}

void test_gpu_free(moe_gpu *gpu, void *dev) { moe_gpu_free(gpu, dev); }
