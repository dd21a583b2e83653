/* test_gpu_util.c — see test_gpu_util.h. */
#include "tests/test_gpu_util.h"

#include <math.h>
#include <stdlib.h>

#include "core/gpu_cuda.h"

moe_gpu *test_gpu_require(const char *test_name) {
    int n = moe_gpu_device_count();
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

int test_close(const char *what, const float *got, const float *want, size_t n, double max_nmse, double atol,
               double rtol) {
    double err2 = 0, ref2 = 0, worst = 0;
    size_t worst_i = 0, bad = 0;
    for (size_t i = 0; i < n; i++) {
        double g = got[i], w = want[i], e = fabs(g - w);
        if (isnan(g) || isnan(w)) e = INFINITY;
        err2 += e * e, ref2 += w * w;
        if (!(e <= atol + rtol * fabs(w))) bad++;
        if (!(e <= worst)) worst = e, worst_i = i;
    }
    double nmse = ref2 > 0 ? err2 / ref2 : err2;
    int ok = bad == 0 && nmse <= max_nmse;
    printf("%-44s n=%-9zu nmse %.2e (max %.0e)  worst |diff| %.3g at %zu (got %.6g want %.6g)  %zu outside %.0e+%.0e|w|\n",
           what, n, nmse, max_nmse, worst, worst_i, n ? got[worst_i] : 0.0, n ? want[worst_i] : 0.0, bad, atol, rtol);
    CHECK(ok, "%s: outside tolerance", what);
    return ok;
}
