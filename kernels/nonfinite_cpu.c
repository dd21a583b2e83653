/* nonfinite_cpu.c — the first NaN or Inf (nonfinite.h): MOE__SUM_CHUNKS fixed chunks, split over the threads,
 * each finding its own first; the lowest chunk that found one answers, as a scan from the start would.
 * Tested through the trainer's and the layer's non-finite checks (tests/test_nonfinite_mpi.c,
 * tests/test_threads.c). */
#include "kernels/nonfinite.h"

#include <math.h>

#include "core/threads.h"

long long moe_find_nonfinite_cpu(const moe_real *a, size_t count) {
    long long first[MOE__SUM_CHUNKS];
#pragma omp parallel for schedule(static) if (count >= MOE__PAR_MIN_ELEMS)
    for (int c = 0; c < MOE__SUM_CHUNKS; c++) {
        first[c] = -1;
        for (size_t i = count * c / MOE__SUM_CHUNKS; i < count * (c + 1) / MOE__SUM_CHUNKS; i++)
            if (!isfinite(a[i])) {
                first[c] = (long long)i;
                break;
            }
    }
    for (int c = 0; c < MOE__SUM_CHUNKS; c++)
        if (first[c] >= 0) return first[c];
    return -1;
}
