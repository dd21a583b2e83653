/* count_omp_regions.c — an LD_PRELOAD library that counts the OpenMP parallel regions a process enters (libgomp's
 * GOMP_parallel, what GCC's `#pragma omp parallel` compiles to), by call site, and prints them at exit: the count
 * behind core/threads.h's MOE__PARALLEL_FOR (docs/BENCHMARKS.md, "Lanes in turns"). A region entered with one thread
 * (an `if` clause that was false, or a pool of one) still costs libgomp a team and a futex wake.
 *   LD_PRELOAD=build/bench/libcount_omp_regions.so build/tests/test_...
 *   mpirun -np 4 -x LD_PRELOAD=build/bench/libcount_omp_regions.so build/tests/test_world_invariant_mpi --steps 3
 * Each process prints to stderr: its total, those asked for one thread, and its busiest call sites as object+offset
 * (`addr2line -f -e OBJECT OFFSET` names the function). Not thread-safe counting: the pool's threads do not start
 * regions of their own in this project (no nested parallelism), so only the calling thread counts. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

typedef void (*gomp_parallel_fn)(void (*)(void *), void *, unsigned, unsigned);

enum { SITES = 4096, SHOWN = 8 };
static void *site[SITES];
static unsigned long site_count[SITES], total, one_thread;

static void report(void) {
    fprintf(stderr, "count_omp_regions: pid %d: %lu regions, %lu of them asked for one thread\n", (int)getpid(), total,
            one_thread);
    for (int shown = 0; shown < SHOWN; shown++) { /* the busiest sites, one pass each: SHOWN is small */
        int best = -1;
        for (int i = 0; i < SITES; i++)
            if (site_count[i] && (best < 0 || site_count[i] > site_count[best])) best = i;
        if (best < 0) break;
        Dl_info info;
        if (dladdr(site[best], &info) && info.dli_fname)
            fprintf(stderr, "  %lu at %s+0x%lx\n", site_count[best], info.dli_fname,
                    (unsigned long)((char *)site[best] - (char *)info.dli_fbase));
        site_count[best] = 0;
    }
}

void GOMP_parallel(void (*fn)(void *), void *data, unsigned num_threads, unsigned flags) {
    static gomp_parallel_fn real;
    if (!real) {
        real = (gomp_parallel_fn)dlsym(RTLD_NEXT, "GOMP_parallel");
        if (!real) {
            fprintf(stderr, "count_omp_regions: libgomp's GOMP_parallel not found\n");
            abort();
        }
        atexit(report);
    }
    void *caller = __builtin_return_address(0);
    unsigned h = (unsigned)((unsigned long)caller >> 2) % SITES; /* open addressing; a full table counts nothing */
    for (unsigned probe = 0; probe < SITES && site[h] && site[h] != caller; probe++) h = (h + 1) % SITES;
    if (!site[h] || site[h] == caller) site[h] = caller, site_count[h]++;
    total++;
    if (num_threads == 1) one_thread++;
    real(fn, data, num_threads, flags);
}
