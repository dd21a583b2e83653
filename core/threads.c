/* threads.c — thread counts of the OpenMP pool and of OpenBLAS (threads.h). Without OpenMP (a compiler
 * without it) everything runs on one thread and the setters touch only OpenBLAS. */
#define _GNU_SOURCE /* sched_getaffinity */
#include "core/threads.h"

#include <cblas.h>
#include <sched.h>
#include <stdlib.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

int moe_threads_default(void) {
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) cpus = CPU_COUNT(&set);
    const char *local = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    long ranks = local ? strtol(local, NULL, 10) : 1;
    long n = cpus / (ranks > 0 ? ranks : 1);
    return n >= 1 ? (int)n : 1;
}

void moe_threads_set(int n) {
    if (n < 1) n = 1;
#ifdef _OPENMP
    omp_set_num_threads(n);
#endif
    /* OpenBLAS 0.3.21 runs on one thread: its threaded sgemm gives the trainer's GEMMs other bits than its
     * one-thread sgemm (measured: moe-train's losses differ from step 1 between 1 and 2 OpenBLAS threads),
     * it gained nothing at these sizes (280 vs 285 ms a step on 2 cores), and its idle threads spin beside the
     * OpenMP pool's. */
    openblas_set_num_threads(1);
}

int moe_threads_get(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

int moe__thread_id(void) {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

int moe__blas_serial_begin(void) {
    const int saved = openblas_get_num_threads();
    if (saved != 1 && moe_threads_get() > 1) openblas_set_num_threads(1);
    return saved;
}

void moe__blas_serial_end(int saved) {
    if (openblas_get_num_threads() != saved) openblas_set_num_threads(saved);
}
