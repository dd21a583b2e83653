/* bench_util_mpi.c — the MPI half of the bench helpers (bench_util_mpi.h). */
#include "bench/bench_util_mpi.h"

void bench_mpi_check(int rc, const char *what) {
    if (rc == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    bench_fail("%s failed: %s", what, text);
}

static void finish(void) { MPI_CHECK(MPI_Finalize()); }
static void abort_all(void) { MPI_Abort(MPI_COMM_WORLD, 1); }

int bench_mpi_init(int *argc, char ***argv, const char *name, int *world) {
    int rank = 0;
    bench_set_name(name);
    bench_set_mpi(rank, finish, abort_all);
    MPI_CHECK(MPI_Init(argc, argv));
    MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, world));
    bench_set_mpi(rank, finish, abort_all);
    return rank;
}
