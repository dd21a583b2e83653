/* comm.h — a communicator and its transport: one table of function pointers per backend (nccl-tests'
 * pattern), so a new transport is a new table, not a new copy of the callers.
 * Backends: self (a world of one, no MPI), mpi (alltoall_mpi.c). The NCCL backend (CUDA issue) is a
 * third table with the same entries on device buffers.
 * Every entry returns a moe_status; a transport failure or a watchdog timeout prints what it was doing
 * (communicator, rank, operation) before returning MOE_ERR_COMM / MOE_ERR_TIMEOUT. */
#ifndef MOE_ALLTOALL_COMM_H
#define MOE_ALLTOALL_COMM_H

#include <stddef.h>

#include "core/types.h"

typedef struct moe_comm moe_comm;

typedef struct {
    const char *name;
    /* recv[p*count + i] = what peer p passed as send[me*count + i] (MPI_Alltoall of ints) */
    moe_status (*alltoall_ints)(moe_comm *c, const int *send, int *recv, int count_per_peer);
    /* Rows of row_nbytes bytes: send holds send_rows[p] rows for each peer p, in peer order; recv gets
     * recv_rows[p] rows from each peer p, in peer order (MPI_Alltoallv). */
    moe_status (*alltoallv_rows)(moe_comm *c, const void *send, const int *send_rows, void *recv,
                                 const int *recv_rows, size_t row_nbytes);
    /* recv = every rank's send, concatenated in rank order; recv_nbytes[p] is what rank p sends. */
    moe_status (*allgatherv_bytes)(moe_comm *c, const void *send, size_t send_nbytes, void *recv,
                                   const size_t *recv_nbytes);
    moe_status (*allreduce_sum_real)(moe_comm *c, moe_real *buf, size_t count);
    moe_status (*allreduce_sum_f64)(moe_comm *c, double *buf, size_t count);
    moe_status (*barrier)(moe_comm *c);
    /* A copy between two buffers of the memory the payload entries work on (host, or device on GPU
     * transports): how dispatch.c reorders received blocks. */
    moe_status (*copy_payload)(moe_comm *c, void *dst, const void *src, size_t nbytes);
    void (*destroy)(moe_comm *c);
} moe_transport_ops;

struct moe_comm {
    const moe_transport_ops *ops;
    int rank, size;
    const char *label; /* "world", "ep" or "expert-dp", for messages */
    int world_rank;    /* this process's rank in the world, for messages */
    double timeout_s;  /* watchdog: an exchange still running after this long fails with MOE_ERR_TIMEOUT */
    long completed;    /* exchanges completed on this communicator, for messages */
    void *impl;        /* the backend's state */
};

/* For work that each rank does on its own and that must succeed everywhere (loading files, writing a
 * checkpoint on rank 0): returns `mine` if this rank failed, MOE_ERR_PEER if only others did, else MOE_OK
 * (or the transport's error). Collective. */
moe_status moe_comm_agree(moe_comm *c, moe_status mine);

/* copy_payload of the transports on host memory (a memmove). */
moe_status moe_comm_copy_host(moe_comm *c, void *dst, const void *src, size_t nbytes);

/* A communicator of size 1 (rank 0) where every exchange is a copy. */
moe_status moe_comm_create_self(const char *label, moe_comm **out);
void moe_comm_destroy(moe_comm *c);

#endif
