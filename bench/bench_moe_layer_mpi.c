/* bench_moe_layer_mpi.c — the MPI hooks shared by the cpu-ep and gpu-ep variants (bench_moe_layer_mpi.h). */
#include "bench/bench_moe_layer_mpi.h"

void bench_layer_mpi_start(int *argc, char ***argv, const char *program, int *world_size) {
    bench_mpi_init(argc, argv, program, world_size);
}

/* Every rank parses the same arguments, so every rank reaches the same usage error (bench_util.h). */
void bench_layer_mpi_check(const bench_layer_options *o) {
    if (o->world_size % o->ep) bench_usage_errorf("--ep %d does not divide the world size %d", o->ep, o->world_size);
    if (o->experts % o->ep) bench_usage_errorf("--ep %d does not divide --experts %d", o->ep, o->experts);
}

void bench_layer_mpi_finish(void) { MPI_CHECK(MPI_Finalize()); }
