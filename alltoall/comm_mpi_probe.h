/* comm_mpi_probe.h — inside alltoall/ only: when a watchdog fires, who is missing.
 *
 * A rank whose exchange timed out knows only that it waited. To name the peer that never arrived, every MPI
 * communicator has a twin (MPI_Comm_dup) used for one question: "where are you?". Every rank that waits in
 * any exchange, on any communicator, answers the questions queued on every twin with where it waits; the
 * rank that timed out asks each peer and waits a short while. A peer that answers is waiting somewhere
 * (the message says where); one that does not is stopped, gone, or busy outside any exchange — the missing
 * one. Ranks that run outside an exchange (computing) answer when they next wait. When every peer answers (each
 * waits on someone outside this communicator: under pp x tp a rank waits on its pipeline peer, which waits on its
 * tensor group), the world is asked too, so that the stopped rank is named at every layout. */
#ifndef MOE_ALLTOALL_COMM_MPI_PROBE_H
#define MOE_ALLTOALL_COMM_MPI_PROBE_H

#include <mpi.h>
#include <stddef.h>

#include "alltoall/comm_transport.h"

typedef struct moe_mpi_probe moe_mpi_probe;

/* The twin of comm (collective over comm), registered so that every wait loop answers on it. */
moe_status moe__mpi_probe_create(MPI_Comm comm, moe_mpi_probe **out);
void moe__mpi_probe_destroy(moe_mpi_probe *p);

/* The world rank of rank `rank` of the communicator (for messages). */
int moe__mpi_probe_world_rank(const moe_mpi_probe *p, int rank);

/* From every wait loop once it has waited a moment: answers the questions pending on every twin with
 * "op on communicator 'label' (exchange #n)" of c, the exchange this rank waits in. */
void moe__mpi_probe_answer(const moe_comm *c, const char *op);

/* After c's watchdog fired: asks every other rank of c where it is, waits up to window_s for the answers
 * (answering others meanwhile), and writes into out who did not answer and where the others wait; when all of
 * them answered, asks every rank of the widest communicator (the world) the same way. */
void moe__mpi_probe_ask(moe_mpi_probe *p, const moe_comm *c, double window_s, char *out, size_t n);

#endif
