/* gemm_row_consistency.c — does a row's sgemm result depend on the other rows in the call?
 * For a few (k, n) shapes: C = A B^T over 600 rows in one call is the reference; then every call of
 * M rows (M = 1..128, at several offsets) is compared row by row, bitwise. Prints the M values whose
 * rows differ from the reference. Then the same with calls of exactly 64 rows at every offset 0..63
 * (kernels/gemm_rows.h's fixed blocks): rows that differ between offsets. Findings: docs/DETERMINISM.md.
 * No flags of its own (the shapes are the table in main); --help and --dry-run as every bench program.
 *   OPENBLAS_CORETYPE=SkylakeX build/bench/gemm_row_consistency */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_util.h"
#include "core/rng.h"

enum { ROWS = 600, MAX_M = 128, BLOCK = 64 };

static void call(int m, int n, int k, const float *A, const float *B, float *C) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1, A, k, B, k, 0, C, n);
}

static void shape(int k, int n) {
    float *A = malloc(sizeof(float) * ROWS * k), *B = malloc(sizeof(float) * n * k);
    float *ref = malloc(sizeof(float) * ROWS * n), *C = malloc(sizeof(float) * ROWS * n);
    float *by_block = malloc(sizeof(float) * ROWS * n);
    if (!A || !B || !ref || !C || !by_block) bench_fail("out of memory");
    moe_rng rng = moe_rng_seeded(1);
    moe_rng_fill_uniform(&rng, A, (size_t)ROWS * k, 1);
    moe_rng_fill_uniform(&rng, B, (size_t)n * k, 1);
    call(ROWS, n, k, A, B, ref);
    printf("k=%4d n=%4d  call sizes M whose rows differ from a %d-row call:", k, n, ROWS);
    int any = 0;
    for (int m = 1; m <= MAX_M; m++) {
        int differs = 0;
        for (int off = 0; off + m <= ROWS && !differs; off += 37) {
            call(m, n, k, A + (size_t)off * k, B, C);
            differs = memcmp(C, ref + (size_t)off * n, sizeof(float) * m * n) != 0;
        }
        if (differs) printf(" %d", m), any = 1;
    }
    printf("%s\n", any ? "" : " none");
    /* fixed 64-row calls starting at every offset: does a row's result depend on its place in the block? */
    for (int s = 0; s + BLOCK <= ROWS; s += BLOCK) call(BLOCK, n, k, A + (size_t)s * k, B, by_block + (size_t)s * n);
    int rows_checked = 0, rows_differ = 0, differs_from_ref = 0;
    for (int off = 1; off < BLOCK; off++)
        for (int s = off; s + BLOCK <= ROWS - BLOCK; s += BLOCK) {
            call(BLOCK, n, k, A + (size_t)s * k, B, C);
            for (int r = 0; r < BLOCK; r++, rows_checked++)
                rows_differ += memcmp(C + (size_t)r * n, by_block + (size_t)(s + r) * n, sizeof(float) * n) != 0;
        }
    for (int r = 0; r < ROWS / BLOCK * BLOCK; r++)
        differs_from_ref += memcmp(by_block + (size_t)r * n, ref + (size_t)r * n, sizeof(float) * n) != 0;
    printf("              64-row blocks: %d of %d rows differ between block offsets; %d rows differ from the %d-row call\n",
           rows_differ, rows_checked, differs_from_ref, ROWS);
    free(A), free(B), free(ref), free(C), free(by_block);
}

static const bench_cli kCli = {
    .name = "gemm_row_consistency",
    .synopsis = "gemm_row_consistency",
    .about = "does a row's OpenBLAS sgemm result depend on the other rows in the call? (docs/DETERMINISM.md)",
};

int main(int argc, char **argv) {
    bench_parse_flags(&kCli, argc, argv, NULL);
    printf("OpenBLAS %s, core %s, %d threads\n", openblas_get_config(), openblas_get_corename(),
           openblas_get_num_threads());
    const int shapes[][2] = {{32, 8}, {32, 48}, {48, 32}, {64, 128}, {128, 64}, {512, 8}, {512, 1024}, {1024, 512}};
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) shape(shapes[i][0], shapes[i][1]);
    return 0;
}
