/* test_gpu_cast.cu — moe_cast_f32_to_bf16_cuda / moe_cast_bf16_to_f32_cuda against the CPU casts (kernels/cast_cpu.c),
 * bit for bit: hand-picked patterns (ties, overflow to inf, subnormals, NaNs with sign and payload, signed
 * zeros), 2^22 random float bit patterns, and all 65536 bf16 values back to fp32. Outputs are poisoned
 * before each run. Exit 77 (skip) when no GPU is present. Run: meson test -C build --suite gpu */
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "kernels/cast.h"
#include "tests/test_gpu_util.h"
}

static const uint32_t kSpecial[] = {
    0x3F808000u, 0x3F818000u, 0x3F808001u, 0x3F807FFFu, 0xBF818000u, 0x7F7F0000u, 0x7F7F7FFFu, 0x7F7F8000u,
    0x7F7FFFFFu, 0xFF7FFFFFu, 0x00000001u, 0x80000001u, 0x00008000u, 0x00008001u, 0x00018000u, 0x007FFFFFu,
    0x7F800000u, 0xFF800000u, 0x00000000u, 0x80000000u, 0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFF800001u,
    0x7FA12345u, 0x7FFFFFFFu, 0xFFFFFFFFu,
};

static void test_to_bf16(moe_gpu *gpu) {
    const size_t nspecial = sizeof kSpecial / sizeof kSpecial[0], n = nspecial + ((size_t)1 << 22) + 3;
    uint32_t *bits = (uint32_t *)malloc(n * sizeof(uint32_t));
    uint16_t *got = (uint16_t *)malloc(n * sizeof(uint16_t));
    moe_rng rng = moe_rng_seeded(4711);
    for (size_t i = 0; i < n; i++) bits[i] = i < nspecial ? kSpecial[i] : (uint32_t)(moe_rng_next(&rng) >> 32);
    float *d_in = (float *)test_gpu_upload(gpu, bits, n * sizeof(float));
    moe_bf16 *d_out = (moe_bf16 *)test_gpu_alloc(gpu, n * sizeof(moe_bf16));
    CHECK_OK(moe_cast_f32_to_bf16_cuda(gpu, d_in, n, d_out));
    test_gpu_download(gpu, got, d_out, n * sizeof(moe_bf16));
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        float x;
        memcpy(&x, &bits[i], sizeof x);
        uint16_t want = moe_bf16_from_float(x);
        if (got[i] != want && bad++ < 5)
            fprintf(stderr, "f32 0x%08X -> GPU 0x%04X, CPU 0x%04X\n", (unsigned)bits[i], got[i], want);
    }
    CHECK(bad == 0, "%zu of %zu fp32 -> bf16 casts differ from the CPU", bad, n);
    printf("fp32 -> bf16: %zu values, %zu mismatches\n", n, bad);
    test_gpu_free(gpu, d_in);
    test_gpu_free(gpu, d_out);
    free(bits), free(got);
}

static void test_to_f32(moe_gpu *gpu) {
    const size_t n = 65536;
    uint16_t *in = (uint16_t *)malloc(n * sizeof(uint16_t));
    uint32_t *got = (uint32_t *)malloc(n * sizeof(uint32_t));
    for (size_t i = 0; i < n; i++) in[i] = (uint16_t)i;
    moe_bf16 *d_in = (moe_bf16 *)test_gpu_upload(gpu, in, n * sizeof(moe_bf16));
    float *d_out = (float *)test_gpu_alloc(gpu, n * sizeof(float));
    CHECK_OK(moe_cast_bf16_to_f32_cuda(gpu, d_in, n, d_out));
    test_gpu_download(gpu, got, d_out, n * sizeof(float));
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        float want = moe_bf16_to_float(in[i]);
        uint32_t wbits;
        memcpy(&wbits, &want, sizeof wbits);
        bad += got[i] != wbits;
    }
    CHECK(bad == 0, "%zu of 65536 bf16 -> fp32 casts differ from the CPU", bad);
    printf("bf16 -> fp32: %zu values, %zu mismatches\n", n, bad);
    CHECK_OK(moe_cast_bf16_to_f32_cuda(gpu, d_in, 0, d_out)); /* n = 0: nothing to do, no launch */
    test_gpu_free(gpu, d_in);
    test_gpu_free(gpu, d_out);
    free(in), free(got);
}

int main(void) {
    moe_gpu *gpu = test_gpu_require("test_gpu_cast");
    test_to_bf16(gpu);
    test_to_f32(gpu);
    moe_gpu_destroy(gpu);
    return test_finish("test_gpu_cast");
}
