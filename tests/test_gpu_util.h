/* test_gpu_util.h — what the GPU tests share: skipping without a GPU, device buffers that abort the test
 * program on failure, and poisoning. Their tolerances: tests/test_tolerance.h.
 *
 * Poison: before every run of an op its outputs are filled with 0xFF bytes (a NaN as fp32 and bf16, -1 as
 * int), so an element the op should write and does not fails the comparison. */
#ifndef MOE_TESTS_TEST_GPU_UTIL_H
#define MOE_TESTS_TEST_GPU_UTIL_H

#include <stddef.h>

#include "core/gpu.h"
#include "tests/test_util.h"

/* The visible CUDA devices (0: no driver, or none); a CUDA that is there but broken (a driver older than the
 * runtime) fails the test with the reason instead of skipping it. */
int test_gpu_device_count(const char *test_name);
/* A context on device 0, or exit(TEST_SKIP) with the reason printed when there is no GPU. */
moe_gpu *test_gpu_require(const char *test_name);

void *test_gpu_alloc(moe_gpu *gpu, size_t nbytes);                          /* poisoned */
void *test_gpu_upload(moe_gpu *gpu, const void *host, size_t nbytes);       /* alloc + copy */
void test_gpu_download(moe_gpu *gpu, void *host, const void *dev, size_t nbytes); /* synchronises */
void test_gpu_poison(moe_gpu *gpu, void *dev, size_t nbytes);
void test_gpu_free(moe_gpu *gpu, void *dev);

#endif
