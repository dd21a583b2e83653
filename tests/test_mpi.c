/* test_mpi.c — verdict over ranks and abort-on-failure for the multi-rank tests. */
#include "tests/test_mpi.h"

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
