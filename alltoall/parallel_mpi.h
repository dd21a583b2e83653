/* parallel_mpi.h — the parallel layout over MPI (groups by MPI_Comm_split; layout in parallel.h). */
#ifndef MOE_ALLTOALL_PARALLEL_MPI_H
#define MOE_ALLTOALL_PARALLEL_MPI_H

#include <mpi.h>

#include "alltoall/parallel.h"

/* Collective over `world`. MOE_ERR_INVALID_CONFIG (on every rank alike) when ep_size < 1 or does not
 * divide the world size. timeout_s: the watchdog of every exchange (<= 0: none). */
moe_status moe_parallel_create_mpi(MPI_Comm world, int ep_size, double timeout_s, moe_parallel **out);

#endif
