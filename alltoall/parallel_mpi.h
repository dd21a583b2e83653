/* parallel_mpi.h — the parallel layout over MPI (groups by MPI_Comm_split; layout in parallel.h). */
#ifndef MOE_ALLTOALL_PARALLEL_MPI_H
#define MOE_ALLTOALL_PARALLEL_MPI_H

#include <mpi.h>

#include "alltoall/parallel.h"

/* Collective over `world`. MOE_ERR_INVALID_CONFIG (on every rank alike) when ep_size < 1 or does not
 * divide the world size. timeout_s: the watchdog of every exchange (<= 0: none; NaN: MOE_ERR_INVALID_ARG).
 * Every rank must give the same ep and the same layer configurations (moe-train compares its options at start:
 * train/rank_agreement.h); ranks that disagree on E or ep fail inside Open MPI's non-blocking collectives, which
 * report on MPI_COMM_WORLD, so a program that wants a status back rather than MPI's abort sets MPI_ERRORS_RETURN on
 * MPI_COMM_WORLD (the layout's own communicators have it). */
moe_status moe_parallel_create_mpi(MPI_Comm world, int ep_size, double timeout_s, moe_parallel **out);
/* The same with pp_size pipeline stages (pipeline/grid.h's layout): MOE_ERR_INVALID_CONFIG, with the grid's message,
 * when pp does not divide the world or ep the ranks of a stage. */
moe_status moe_parallel_create_mpi_pp(MPI_Comm world, int pp_size, int ep_size, double timeout_s,
                                      moe_parallel **out);
/* The same with tp_size tensor-parallel ranks (grid.h: tp divides the ranks of a stage). */
moe_status moe_parallel_create_mpi_tp(MPI_Comm world, int pp_size, int ep_size, int tp_size, double timeout_s,
                                      moe_parallel **out);

/* This process's rank among the processes of its node (MPI_COMM_TYPE_SHARED): for picking a GPU. Collective. */
moe_status moe_parallel_node_rank(MPI_Comm world, int *node_rank);

/* Internal to alltoall/ (how the GPU layouts reuse these groups): the same layout, with each of its MPI
 * communicators (a dup of world, the stage, the pipeline, the EP block, the expert-data-parallel group, the tensor and
 * data-parallel groups) turned into a moe_comm by `wrap`, which owns the communicator when it returns MOE_OK and
 * leaves it to the caller otherwise. */
typedef moe_status (*moe__comm_wrap_fn)(void *ctx, MPI_Comm comm, const char *label, double timeout_s,
                                        moe_comm **out);
moe_status moe__parallel_create_mpi_with(MPI_Comm world, int pp_size, int ep_size, int tp_size, double timeout_s,
                                         moe__comm_wrap_fn wrap, void *wrap_ctx, moe_parallel **out);

#endif
