/* bench_moe_layer_mpi.h — what the two variants of the MoE layer benchmark under mpirun (cpu-ep, gpu-ep)
 * share: their two common flags, how they start and end, and their check of --ep against the world. */
#ifndef BENCH_MOE_LAYER_MPI_H
#define BENCH_MOE_LAYER_MPI_H

#include "bench/bench_moe_layer_driver.h"
#include "bench/bench_util_mpi.h"

#define BENCH_LAYER_MPI_FLAGS                                                                                \
    BENCH_INT("--ep", bench_layer_options, ep, 1, 4096, "expert-parallel ranks (divides W and --experts)"),  \
        BENCH_REAL("--timeout", bench_layer_options, timeout_s, 1, 86400,                                    \
                   "seconds before a stuck exchange aborts the job")

/* bench_mpi_init: MPI started, *world_size = W. */
void bench_layer_mpi_start(int *argc, char ***argv, const char *program, int *world_size);
/* --ep divides the world size and --experts. */
void bench_layer_mpi_check(const bench_layer_options *o);
/* MPI_Finalize. */
void bench_layer_mpi_finish(void);

#endif
