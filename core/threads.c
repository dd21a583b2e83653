/* threads.c — thread counts of the OpenMP pool and of OpenBLAS (threads.h). Without OpenMP (a compiler
 * without it) everything runs on one thread and the setters touch only OpenBLAS. */
#define _GNU_SOURCE /* sched_getaffinity */
#include "core/threads.h"

#include <cblas.h>
#include <pthread.h>
#include <signal.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

moe_cpu_share moe_threads_cpu_share(void) {
    const long online = sysconf(_SC_NPROCESSORS_ONLN);
    moe_cpu_share c = {.online = online > 0 ? (int)online : 1, .node_ranks = 1};
    c.allowed = c.online;
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) c.allowed = CPU_COUNT(&set);
    const char *local = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    const long ranks = local ? strtol(local, NULL, 10) : 1;
    c.node_ranks = ranks > 0 && ranks < 1 << 20 ? (int)ranks : 1;
    return c;
}

int moe_threads_default(void) {
    const moe_cpu_share c = moe_threads_cpu_share();
    const int n = c.allowed / c.node_ranks;
    return n >= 1 ? n : 1;
}

const char *moe_threads_advice(int threads, int asked, char *buf, size_t n) {
    const moe_cpu_share c = moe_threads_cpu_share();
    const int bound = c.allowed < c.online, fair = c.online / c.node_ranks > 0 ? c.online / c.node_ranks : 1;
    if (asked && bound && threads > c.allowed) {
        snprintf(buf, n, "warning: --threads %d, but this rank may run on %d of the node's %d CPUs (its affinity mask: "
                 "Open MPI binds a rank to a core unless launched with `mpirun --bind-to none`, as scripts/train.sh "
                 "launches one rank): its threads take turns. Launch with --bind-to none, or give --threads %d",
                 threads, c.allowed, c.online, c.allowed);
        return buf;
    }
    if (asked && !bound && threads > fair) {
        snprintf(buf, n, "warning: --threads %d on each of %d rank(s) of a node of %d CPUs: the threads take turns; "
                 "give --threads %d", threads, c.node_ranks, c.online, fair);
        return buf;
    }
    if (!asked && c.allowed * c.node_ranks < c.online) {
        snprintf(buf, n, "note: this rank may run on %d of the node's %d CPUs (its affinity mask: Open MPI binds a "
                 "rank to a core unless launched with `mpirun --bind-to none`; a container or taskset may also limit "
                 "it), so it runs %d thread(s); with --bind-to none the %d rank(s) on this node would take %d each",
                 c.allowed, c.online, threads, c.node_ranks, fair);
        return buf;
    }
    return NULL;
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

void moe_threads_block_signals(const void *set) {
#ifdef _OPENMP
#pragma omp parallel num_threads(moe_threads_get())
    if (omp_get_thread_num() != 0) pthread_sigmask(SIG_BLOCK, (const sigset_t *)set, NULL);
#else
    (void)set;
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
