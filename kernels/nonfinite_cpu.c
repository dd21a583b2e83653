/* nonfinite_cpu.c — the first NaN or Inf (nonfinite.h): MOE__SUM_CHUNKS fixed chunks, split over the threads,
 * each finding its own first; the lowest chunk that found one answers, as a scan from the start would.
 * Tested through the trainer's and the layer's non-finite checks (tests/test_nonfinite_mpi.c,
 * tests/test_threads.c). */
#include "kernels/nonfinite.h"

#include <math.h>

#include "core/threads.h"

/* A chunk is tested SCAN_BLOCK values at a time without an early exit (a loop the compiler vectorizes; a loop that
 * stops at the first bad value is scalar), and only a block that holds a bad value is searched for its first: the
 * same answer (tests/test_cpu_scans.c). */
enum { SCAN_BLOCK = 512 };

long long moe_find_nonfinite_cpu(const moe_real *a, size_t count) {
    long long first[MOE__SUM_CHUNKS];
    MOE__PARALLEL_FOR(count >= MOE__PAR_MIN_ELEMS,
    for (int c = 0; c < MOE__SUM_CHUNKS; c++) {
        first[c] = -1;
        const size_t hi = count * (c + 1) / MOE__SUM_CHUNKS;
        for (size_t b = count * c / MOE__SUM_CHUNKS; b < hi && first[c] < 0; b += SCAN_BLOCK) {
            const size_t e = hi - b < SCAN_BLOCK ? hi : b + SCAN_BLOCK;
            int bad = 0;
            for (size_t i = b; i < e; i++) bad |= !isfinite(a[i]);
            for (size_t i = b; bad && i < e; i++)
                if (!isfinite(a[i])) {
                    first[c] = (long long)i;
                    break;
                }
        }
    });
    for (int c = 0; c < MOE__SUM_CHUNKS; c++)
        if (first[c] >= 0) return first[c];
    return -1;
}
