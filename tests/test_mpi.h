/* test_mpi.h — what the multi-rank tests share: a verdict summed over ranks, and aborting the whole job
 * when a library call fails (a failed collective leaves the other ranks waiting). */
#ifndef MOE_TESTS_TEST_MPI_H
#define MOE_TESTS_TEST_MPI_H

#include <mpi.h>

#include "tests/test_util.h"

/* Every rank calls it; returns the exit code (1 if any rank had a failed CHECK). */
int test_mpi_finish(const char *name);

/* MPI_Abort with the status string unless st == MOE_OK. */
void test_mpi_require(moe_status st, const char *what);

/* Returns once every rank of comm has called it, each waiting asleep (a look every millisecond) rather than in an
 * MPI call: for the ranks that wait while one rank computes alone (a one-rank reference). Ranks inside a blocking
 * MPI call poll, yielding the CPU at every look when they outnumber the cores (Open MPI's mpi_yield_when_idle), and
 * each such yield-poller takes a fair share of the cores from the rank they wait for and from whatever else runs. */
void test_mpi_wait_asleep(MPI_Comm comm);

/* A dup of MPI_COMM_WORLD (for a communicator that takes ownership of its MPI_Comm); aborts on failure. */
MPI_Comm test_mpi_dup_world(void);

/* The number of CUDA devices of the rank that has the fewest (devices: this rank's). When that is 0, every rank
 * skips together (a lone exit would leave the others in their first collective): rank 0 prints
 * "name: skip: no CUDA device on ...", MPI is finalized and the program exits 77. */
int test_mpi_min_devices_or_skip(int devices, const char *name);

#endif
