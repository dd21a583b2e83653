/* comm_mpi.h — the MPI transport (MPI-3 non-blocking collectives and point-to-point messages polled against the
 * watchdog timeout; the row exchange is point-to-point: comm_mpi.c). */
#ifndef MOE_ALLTOALL_COMM_MPI_H
#define MOE_ALLTOALL_COMM_MPI_H

#include <mpi.h>

#include "alltoall/comm.h"

/* Takes ownership of comm (freed by moe_comm_destroy) and sets MPI_ERRORS_RETURN on it, so failures come
 * back as statuses with a message. timeout_s <= 0 disables the watchdog. */
moe_status moe_comm_create_mpi(MPI_Comm comm, const char *label, double timeout_s, moe_comm **out);

#endif
