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
    moe_status (*alltoallv_host_rows)(moe_comm *c, const void *send, const int *send_rows, void *recv,
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
    /* point-to-point: post one send or receive described by `what` (comm.c has checked its peer, tag and buffer),
     * *req a request of the transport's that begins with a copy of it; wait completes it under the watchdog and
     * frees it whatever the outcome; batch marks the posts that start together (1: begin, 0: end; comm.c pairs them) */
    moe_status (*post)(moe_comm *c, const moe_comm_request *what, moe_comm_request **req);
    moe_status (*wait)(moe_comm *c, moe_comm_request *req);
    moe_status (*batch)(moe_comm *c, int begin);
    void (*destroy)(moe_comm *c); /* frees impl and c */
} moe_transport_ops;

/* A posted point-to-point exchange (comm.h): the head of each transport's request struct. */
struct moe_comm_request {
    moe_comm *comm; /* posted on; waited on there only */
    int sending;    /* 1: a send (buf is read), 0: a receive (buf is written) */
    int peer, tag;  /* a rank of comm; 0 .. MOE_COMM_MAX_TAG */
    size_t nbytes;
    void *buf;      /* the caller's payload memory */
};

struct moe_comm {
    const moe_transport_ops *ops;
    int rank, size;
    const char *label;          /* "world", "ep" or "expert-dp", for messages */
    int world_rank;             /* this process's rank in the world, for messages */
    double timeout_s;           /* watchdog: an exchange still running after this long fails with MOE_ERR_TIMEOUT */
    long completed;             /* exchanges completed on this communicator, for messages */
    moe_exchange_times *times;  /* when set, each entry adds its wall time here (comm_timing.h) */
    moe_tree_algorithm tree_algorithm; /* what the tree all-reduces run (tree_allreduce.h) */
    int in_batch;               /* between moe_comm_batch_begin and _end */
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

/* "receive of 64 bytes from rank 1 with tag 7" (its words in every message about it) into out[n]. */
void moe__comm_request_describe(const moe_comm_request *r, char *out, size_t n);
/* batch of the transports whose posts start at once anyway (self, mpi) */
moe_status moe__comm_batch_none(moe_comm *c, int begin);

/* The point-to-point of a world of one (self, self-gpu): a send is matched with the first unmatched receive posted
 * with its tag, or a receive with the first such send, and the bytes move then by c's copy_payload; a wait on a
 * request never matched fails at once (nothing else can post its match). *queue: the unmatched posts, in order. */
typedef struct moe__self_p2p moe__self_p2p;
moe_status moe__self_p2p_post(moe_comm *c, moe__self_p2p **queue, const moe_comm_request *what,
                              moe_comm_request **req);
moe_status moe__self_p2p_wait(moe_comm *c, moe__self_p2p **queue, moe_comm_request *req);
void moe__self_p2p_free(moe__self_p2p *queue); /* the queue only: requests belong to their posters */

#endif
