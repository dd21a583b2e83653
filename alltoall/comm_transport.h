/* comm_transport.h — inside alltoall/ only: what a communicator is made of, and the table of functions a
 * transport fills in (one table per transport: comm_self.c, comm_mpi.c, comm_self_gpu.c,
 * comm_mpi_staged.c, comm_nccl.c). Code outside alltoall/ uses comm.h. */
#ifndef MOE_ALLTOALL_COMM_TRANSPORT_H
#define MOE_ALLTOALL_COMM_TRANSPORT_H

#include "alltoall/comm.h"
#include "alltoall/comm_timing.h"

struct moe__tree_job; /* tree_allreduce.h */

/* The entries of comm.h, with the same meaning; every entry is required. */
typedef struct {
    const char *name;
    moe_status (*alltoall_ints)(moe_comm *c, const int *send, int *recv, int count_per_peer);
    moe_status (*alltoallv_rows)(moe_comm *c, const void *send, const int *send_rows, void *recv,
                                 const int *recv_rows, size_t row_nbytes);
    moe_status (*allgatherv_bytes)(moe_comm *c, const void *send, size_t send_nbytes, void *recv,
                                   const size_t *recv_nbytes);
    moe_status (*allreduce_sum_real)(moe_comm *c, moe_real *buf, size_t count);
    moe_status (*allreduce_sum_f64)(moe_comm *c, double *buf, size_t count);
    /* called with a power-of-two size only (comm.c checks); the schedule: tree_allreduce.h. tree_real runs one job
     * (checked by comm.c) of the fixed tree on payload memory: the all-reduce of moe_comm_allreduce_tree_real or
     * one of its halves, so a transport writes its tree once */
    moe_status (*tree_real)(moe_comm *c, moe_real *buf, const struct moe__tree_job *job);
    moe_status (*allreduce_tree_f64)(moe_comm *c, double *buf, size_t count);
    moe_status (*scan_sum_ints)(moe_comm *c, const int *in, int *prefix, int *total, int count);
    moe_status (*barrier)(moe_comm *c);
    moe_status (*copy_payload)(moe_comm *c, void *dst, const void *src, size_t nbytes);
    void (*destroy)(moe_comm *c); /* frees impl and c */
} moe_transport_ops;

struct moe_comm {
    const moe_transport_ops *ops;
    int rank, size;
    const char *label;          /* "world", "ep" or "expert-dp", for messages */
    int world_rank;             /* this process's rank in the world, for messages */
    double timeout_s;           /* watchdog: an exchange still running after this long fails with MOE_ERR_TIMEOUT */
    long completed;             /* exchanges completed on this communicator, for messages */
    moe_exchange_times *times;  /* when set, each entry adds its wall time here (comm_timing.h) */
    moe_tree_algorithm tree_algorithm; /* what the tree all-reduces run (tree_allreduce.h) */
    size_t tree_piece_nbytes;   /* the most they move at once (tree_allreduce.h); 0: MOE__TREE_PIECE_NBYTES */
    void *impl;                 /* the transport's state */
};

/* A communicator on `ops` (calloc'ed; the caller fills impl). NULL when out of memory. */
moe_comm *moe__comm_new(const moe_transport_ops *ops, const char *label, int rank, int size, int world_rank,
                        double timeout_s);

/* copy_payload of the transports on host memory (a memmove). */
moe_status moe__comm_copy_host(moe_comm *c, void *dst, const void *src, size_t nbytes);
/* tree_real of the transports of one rank: the tree of one leaf is the identity (one more exchange completed). */
moe_status moe__comm_tree_one(moe_comm *c, moe_real *buf, const struct moe__tree_job *job);

#endif
