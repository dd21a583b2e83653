/* bench_util_mpi.h — the MPI half of bench_util.h (see there), for the programs that run under mpirun. */
#ifndef BENCH_UTIL_MPI_H
#define BENCH_UTIL_MPI_H

#include <mpi.h>

#include "bench/bench_util.h"

/* Names the program, then MPI_Init with MPI_ERRORS_RETURN on MPI_COMM_WORLD; from here on, usage errors,
 * --help and --dry-run finalize MPI on every rank and failures abort the job. Returns this rank; *world
 * gets the size. Parse the flags (bench_parse_flags) next, before any collective. */
int bench_mpi_init(int *argc, char ***argv, const char *name, int *world);

/* Fails ("what failed: <MPI's text>", MPI_Abort) unless rc is MPI_SUCCESS. */
void bench_mpi_check(int rc, const char *what);
#define MPI_CHECK(call) bench_mpi_check((call), #call)

#endif
