/* threads.h — the CPU path's threads: one OpenMP pool (libgomp) runs the loops of kernels/, router/, experts/
 * and moe/, and the GEMM engine's calls (kernels/gemm_rows.h spreads a product's single-threaded library calls over
 * it); OpenBLAS is kept on one thread (threads.c says why), so a run uses N threads, not N per library. Results
 * never depend on N (docs/DETERMINISM.md): a parallel loop's iterations write disjoint outputs, a GEMM's calls are
 * fixed by its shape, and a sum is formed over chunks fixed by its length (MOE__SUM_CHUNKS), added in chunk order.
 * Tested by tests/test_threads.c (1, 2 and 3 threads, bitwise).
 * No host syncs (CPU only). */
#ifndef MOE_CORE_THREADS_H
#define MOE_CORE_THREADS_H

#include <stddef.h>

/* Where a rank's threads may run: the online CPUs of its affinity mask, the machine's online CPUs, and the ranks on
 * its node (OMPI_COMM_WORLD_LOCAL_SIZE, else 1). */
typedef struct {
    int allowed, online, node_ranks;
} moe_cpu_share;
moe_cpu_share moe_threads_cpu_share(void);
/* The CPUs this process may run on divided by the ranks on its node; at least 1. */
int moe_threads_default(void);
/* A line for the start of a run when its threads and its CPUs do not match, with the fix (in buf; NULL when they
 * match): asked (--threads given) beyond the CPUs the rank may run on, or the default held below the node's CPUs by
 * a binding (Open MPI binds a lone rank to one core). */
const char *moe_threads_advice(int threads, int asked, char *buf, size_t n);
/* Sets the OpenMP pool's threads to n (n >= 1) and OpenBLAS's to 1. */
void moe_threads_set(int n);
/* The threads a parallel loop gets now. */
int moe_threads_get(void);
/* Blocks `set` (a sigset_t *) in every thread of the pool but the calling one, for good: a signal's frame must never
 * land on a thread inside a GEMM library call (oneDNN 2.6's JIT sgemm points rsp into the heap, so a handler's frame
 * there corrupts the heap: train/signals.h). Threads the pool adds later inherit the caller's mask. */
void moe_threads_block_signals(const void *set);

/* Internal. A loop over fewer elements than this stays on the calling thread (a parallel region costs
 * microseconds). */
#define MOE__PAR_MIN_ELEMS 32768
/* Internal. `MOE__PARALLEL_FOR(cond, for (...) body);`: the loop as an OpenMP `parallel for` with a static schedule
 * when cond holds, else as a plain loop on the calling thread. Not `#pragma omp parallel for if (cond)`: libgomp
 * enters a region whose `if` is false all the same (a team allocated and freed, a futex wake at its end: 0.41 us on a
 * Zen 3 core, where the plain loop over a few elements takes 0.006), and the small tensors of a test model ran ~950k
 * such regions in one 4-rank test_world_invariant_mpi (docs/BENCHMARKS.md, "Lanes in turns"). Each element is
 * computed alike in both copies (-ffp-contract=off, meson.build), so the bits never depend on which one ran. */
#define MOE__PARALLEL_FOR(cond, ...)                                   \
    do {                                                               \
        if (cond) {                                                    \
            _Pragma("omp parallel for schedule(static)") __VA_ARGS__; \
        } else {                                                       \
            __VA_ARGS__;                                               \
        }                                                              \
    } while (0)
/* Sums over many elements: this many chunks [c n / CHUNKS, (c + 1) n / CHUNKS), whatever the threads. */
#define MOE__SUM_CHUNKS 64
/* The gradient norm's sums of squares (moe/dense_ops.h's sum_squares): lane j of this many adds the squares of the
 * values j, j + LANES, j + 2 LANES, ... of a range in that order, then the lanes are added in a fixed pairwise tree
 * (lane j += lane j + h for h = LANES / 2, ..., 1): a GPU block of LANES threads and a CPU loop vectorized across the
 * lanes form the same bits. */
#define MOE__SUM_LANES 256

int moe__thread_id(void);   /* 0 .. moe_threads_get() - 1 inside a parallel loop; 0 outside one */
/* BLAS calls made inside a parallel loop run on their caller's thread: the BLAS library's own threads
 * are set to 1 before the loop (returning what they were) and restored after it. */
int moe__blas_serial_begin(void);
void moe__blas_serial_end(int saved);

#endif
