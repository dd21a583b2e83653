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

#endif
