/* test_mpi.c — verdict over ranks and abort-on-failure for the multi-rank tests. */
#include "tests/test_mpi.h"

#include <stdlib.h>
#include <time.h>

#include "core/fail.h"

int test_mpi_finish(const char *name) {
    int rank, total = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Allreduce(&test_failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) {
        if (total) fprintf(stderr, "%s: %d check(s) failed over all ranks\n", name, total);
        else printf("%s: all checks passed on every rank\n", name);
    }
    MPI_Finalize();
    return total ? 1 : 0;
}

void test_mpi_require(moe_status st, const char *what) {
    if (st == MOE_OK) return;
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    fprintf(stderr, "rank %d: %s failed: %s\n", rank, what, moe_failure_message(st));
    MPI_Abort(MPI_COMM_WORLD, 1);
}

void test_mpi_wait_asleep(MPI_Comm comm) {
    MPI_Request arrived;
    if (MPI_Ibarrier(comm, &arrived) != MPI_SUCCESS) test_mpi_require(MOE_ERR_COMM, "MPI_Ibarrier");
    for (;;) {
        int done = 0;
        if (MPI_Test(&arrived, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) test_mpi_require(MOE_ERR_COMM, "MPI_Test");
        if (done) return;
        const struct timespec look = {0, 1000000};
        nanosleep(&look, NULL);
    }
}

MPI_Comm test_mpi_dup_world(void) {
    MPI_Comm dup;
    if (MPI_Comm_dup(MPI_COMM_WORLD, &dup) != MPI_SUCCESS) test_mpi_require(MOE_ERR_COMM, "MPI_Comm_dup");
    return dup;
}

int test_mpi_min_devices_or_skip(int devices, const char *name) {
    int rank, W, min_devices = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &W);
    MPI_Allreduce(&devices, &min_devices, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (min_devices > 0) return min_devices;
    if (rank == 0) printf("%s: skip: no CUDA device on %s\n", name, W > 1 ? "at least one rank" : "this machine");
    MPI_Finalize();
    exit(TEST_SKIP);
}
