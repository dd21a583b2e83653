/* test_gpu_util.h — what the GPU tests share: skipping without a GPU, device buffers that abort the test
 * program on failure, poisoning, and the tolerance check of the math kernels.
 *
 * Poison: before every run of an op its outputs are filled with 0xFF bytes (a NaN as fp32 and bf16, -1 as
 * int), so an element the op should write and does not fails the comparison. */
#ifndef MOE_TESTS_TEST_GPU_UTIL_H
#define MOE_TESTS_TEST_GPU_UTIL_H

#include <stddef.h>

#include "core/gpu.h"
#include "tests/test_util.h"

/* A context on device 0, or exit(TEST_SKIP) with the reason printed when there is no usable GPU. */
moe_gpu *test_gpu_require(const char *test_name);

void *test_gpu_alloc(moe_gpu *gpu, size_t nbytes);                          /* poisoned */
void *test_gpu_upload(moe_gpu *gpu, const void *host, size_t nbytes);       /* alloc + copy */
void test_gpu_download(moe_gpu *gpu, void *host, const void *dev, size_t nbytes); /* synchronises */
void test_gpu_poison(moe_gpu *gpu, void *dev, size_t nbytes);
void test_gpu_free(moe_gpu *gpu, void *dev);

/* got vs want (n floats): passes when the normalised mean squared error sum (g-w)^2 / sum w^2 <= max_nmse
 * and every |g - w| <= atol + rtol |w| (NaN fails). Prints one line with the worst element either way. */
int test_close(const char *what, const float *got, const float *want, size_t n, double max_nmse, double atol,
               double rtol);

#endif
