/* comm.h — a communicator: the ranks of one group (world, expert-parallel or expert-data-parallel) and the
 * exchanges among them. Opaque: callers use these functions; the transports behind them (self, mpi,
 * mpi-staged, nccl) are tables of functions inside alltoall/ (comm_transport.h), nccl-tests' pattern.
 *
 * Memory: "payload" entries (alltoallv_rows, allreduce_sum_real, allreduce_tree_real and its halves
 * reduce_scatter_tree_real and allgather_tree_real, copy_payload) work on the transport's payload memory (host for
 * self and mpi; device for the GPU transports of comm_gpu.h); every other entry takes host pointers on every
 * transport.
 * Failures: every entry returns a moe_status; a transport failure or a watchdog timeout records what the
 * exchange was doing (communicator, rank, operation; core/fail.h) and returns MOE_ERR_COMM /
 * MOE_ERR_TIMEOUT. After either the job cannot go on: end it (MPI_Abort).
 * Host syncs: the host entries return when the exchange is complete; point-to-point posts return at once and
 * their waits when it is complete (below). */
#ifndef MOE_ALLTOALL_COMM_H
#define MOE_ALLTOALL_COMM_H

#include <stddef.h>

#include "core/types.h"

typedef struct moe_comm moe_comm;

int moe_comm_rank(const moe_comm *c);
int moe_comm_size(const moe_comm *c);
const char *moe_comm_transport_name(const moe_comm *c); /* "self", "mpi", "mpi-staged", "nccl" */
/* The watchdog: an exchange still incomplete after this many seconds fails (<= 0: never). Work that is
 * known to be slow on one rank (a checkpoint save) waits under a longer one of its own. */
double moe_comm_timeout(const moe_comm *c);
void moe_comm_set_timeout(moe_comm *c, double seconds);

/* recv[p*count + i] = what peer p passed as send[me*count + i] (MPI_Alltoall of ints). */
moe_status moe_comm_alltoall_ints(moe_comm *c, const int *send, int *recv, int count_per_peer);
/* Rows of row_nbytes bytes (payload memory): send holds send_rows[p] rows for each peer p, in peer order;
 * recv gets recv_rows[p] rows from each peer p, in peer order (MPI_Alltoallv). */
moe_status moe_comm_alltoallv_rows(moe_comm *c, const void *send, const int *send_rows, void *recv,
                                   const int *recv_rows, size_t row_nbytes);
/* The same on host memory, on every transport: control data such as the capacity rule's candidates (the GPU
 * transports forward it to the host transport they wrap). */
moe_status moe_comm_alltoallv_host_rows(moe_comm *c, const void *send, const int *send_rows, void *recv,
                                        const int *recv_rows, size_t row_nbytes);
/* recv = every rank's send, concatenated in rank order; recv_nbytes[p] is what rank p sends. */
moe_status moe_comm_allgatherv_bytes(moe_comm *c, const void *send, size_t send_nbytes, void *recv,
                                     const size_t *recv_nbytes);
/* The same when every rank sends nbytes: recv holds size x nbytes (host memory, as allgatherv_bytes). */
moe_status moe_comm_allgather_bytes(moe_comm *c, const void *send, size_t nbytes, void *recv);
/* Sums over the ranks, in place (allreduce_sum_real on payload memory), in the transport library's order
 * (MPI_Allreduce, ncclAllReduce): repeatable on one layout, not across world sizes. */
moe_status moe_comm_allreduce_sum_real(moe_comm *c, moe_real *buf, size_t count);
moe_status moe_comm_allreduce_sum_f64(moe_comm *c, double *buf, size_t count);
/* Sums over the ranks, in place, in the fixed binary tree over ranks in rank order (tree_reduce.h): rank r's
 * buffer is the tree's r-th node at its level, and every rank gets bitwise the root, ((b0 + b1) + (b2 + b3))
 * for 4 ranks, whichever algorithm runs. The world size must be a power of two: otherwise MOE_ERR_INVALID_CONFIG
 * with a message, on every rank, before any communication. count must be the same on every rank.
 * allreduce_tree_real works on payload memory (on nccl: ncclSend/ncclRecv and an add kernel queued on the
 * communication stream, one host sync at the end; on mpi-staged: one staging copy each way), allreduce_tree_f64
 * on host memory. Scratch: the transport keeps what a partner sends before it is added (payload memory), grown on
 * demand: at most a 64 MiB piece of values, half of one with halving + doubling (tree_allreduce.h). */
moe_status moe_comm_allreduce_tree_real(moe_comm *c, moe_real *buf, size_t count);
moe_status moe_comm_allreduce_tree_f64(moe_comm *c, double *buf, size_t count);
typedef enum {
    MOE_TREE_AUTO = 0,           /* recursive doubling up to 32 KiB, halving + doubling above (the default) */
    MOE_TREE_RECURSIVE_DOUBLING, /* log2 W exchanges of the whole buffer: fewest messages */
    MOE_TREE_HALVING_DOUBLING,   /* reduce-scatter by recursive halving, all-gather by recursive doubling */
} moe_tree_algorithm;
/* Which algorithm the tree all-reduces of c run (every rank must choose the same); the bits never change. */
void moe_comm_set_tree_algorithm(moe_comm *c, moe_tree_algorithm algo);

/* ---- the fixed tree's halves (ZeRO-2: models/zero.h) ----
 * A region of `count` values is partitioned over a group of W = 2^L members by the tree's recursive halving: at step
 * j = 0 .. L-1 (bit 2^j of the member's rank) the range a member holds is split, the member with bit j = 0 keeping the
 * lower part; after L steps each member holds one range, and the ranges tile the region (in bit-reversed rank order).
 * The split of [lo, hi) is the entry of `bounds` nearest to lo + (hi - lo) / 2 within [lo, hi] (lo and hi count as
 * entries; the lower one on a tie), or that midpoint itself when bounds is NULL. A range may be empty (bounds far
 * from a midpoint; a non-NULL bounds with no entries gives the whole region to one member). */
typedef struct {
    size_t count;         /* values in the region                                                       */
    const size_t *bounds; /* ascending positions in (0, count) a split may fall on; NULL: anywhere      */
    size_t num_bounds;
} moe_tree_partition;

/* [*lo, *hi): the range member `rank` of a group of `size` members (a power of two) holds under p. Pure. */
void moe_tree_partition_range(const moe_tree_partition *p, int size, int rank, size_t *lo, size_t *hi);

/* The window [from, from + n) of p's region (buf[0 .. n) on every member) summed over c's members in the fixed
 * tree, reduce-scatter only: afterwards this member's range ∩ window holds the sums, bitwise those
 * moe_comm_allreduce_tree_real gives over the same values; the rest of buf is left part-summed. Windows of one region
 * may be reduced one after another (a model's layers as their backward finishes): an element's sum depends only on the
 * members' rank bits. Needs c's size a power of two (the all-reduce's check and error). */
moe_status moe_comm_reduce_scatter_tree_real(moe_comm *c, moe_real *buf, const moe_tree_partition *p, size_t from,
                                             size_t n);
/* Its mirror: every member's range ∩ window copied into every member's buf (no arithmetic). */
moe_status moe_comm_allgather_tree_real(moe_comm *c, moe_real *buf, const moe_tree_partition *p, size_t from,
                                        size_t n);
/* Both halves: every member passes the same p, from and n; buf is payload memory, as allreduce_tree_real's, with the
 * same host syncs. Errors, before any communication and alike on every member: the size check above
 * (MOE_ERR_INVALID_CONFIG); MOE_ERR_INVALID_ARG with a message for a NULL p, bounds that do not ascend within
 * [0, count] (repeats and the ends themselves are harmless), or a window outside [0, count). One call is one
 * completed exchange. Scratch: the transport's, at most half a tree piece (tree_allreduce.h) for reduce-scatter,
 * none for all-gather, which copies straight into buf. */

/* For each i < count: prefix[i] = sum of in[i] over the ranks before this one (0 on rank 0) and
 * total[i] = sum over all ranks (MPI_Exscan and MPI_Allreduce). Integer sums: exact. */
moe_status moe_comm_scan_sum_ints(moe_comm *c, const int *in, int *prefix, int *total, int count);
moe_status moe_comm_barrier(moe_comm *c);
/* A copy between two buffers of payload memory (how dispatch.c reorders received blocks). */
moe_status moe_comm_copy_payload(moe_comm *c, void *dst, const void *src, size_t nbytes);

/* ---- point-to-point: asynchronous sends and receives of bytes, with handles (a pipeline's activations) ----
 * Post, go on (compute), wait where the data is needed or the buffer is to be reused:
 *   moe_comm_request *r;
 *   MOE_TRY(moe_comm_irecv_bytes(c, grad_in, nbytes, next, TAG_GRAD, &r));  ...  MOE_TRY(moe_comm_wait(c, r));
 * Memory: payload memory (host for self and mpi; device for the GPU transports, ordered against the context's
 * stream: a send reads what the kernels queued before its post wrote, the kernels queued after a wait see what a
 * receive brought). Ownership: from the post until its wait returns the buffer belongs to the exchange: a send's
 * must not be written, a receive's neither read nor written. Every request must be waited for (else it leaks).
 * Matching: `peer` is a rank of c (a world of one sends to itself); a receive of nbytes matches a send of exactly
 * nbytes: a shorter send fails the receive's wait with MOE_ERR_COUNT_MISMATCH (self fails the later post), a
 * longer one with MOE_ERR_COMM (MPI's truncation; Open MPI misses it for a rank's message to itself); nccl cannot
 * tell (undefined). Tags 0 .. MOE_COMM_MAX_TAG separate streams of messages.
 * Order: messages from one rank to another with the same tag are received in posting order (MPI's non-overtaking
 * rule). nccl carries no tags: there every message from one rank to another is received in posting order whatever
 * its tag, so a program meant for every transport posts, for each pair and direction, the sends and the peer's
 * receives in the same order.
 * Progress: a post returns once the buffer is handed off (mpi: MPI_Isend / MPI_Irecv; mpi-staged: a send waits for
 * the stream and copies its bytes to a host buffer of the request's; nccl: queued on the communication stream;
 * self: copied if its match is posted, else queued), so the caller goes on computing. A send completes once its
 * receive is posted: wait on it only where the peer's schedule has posted that receive (a world of one: a wait whose
 * match was never posted fails at once, MOE_ERR_COMM, as nothing else could post it).
 * nccl runs a communicator's operations one after another in posting order: a posted receive holds back everything
 * posted after it (sends and collectives included) until its send arrives. Posts that must progress together (a
 * schedule step's receive and the send its peer waits for: Megatron's batched p2p) go in one batch:
 * moe_comm_batch_begin, the posts, moe_comm_batch_end (nccl: one ncclGroup; elsewhere posts start at once anyway).
 * Waiting: moe_comm_wait blocks the host until the exchange is complete (nccl: its event, polled; mpi-staged: then
 * queues a receive's copy to the device) and frees the request whatever the outcome, except a wait refused for its
 * arguments (MOE_ERR_INVALID_ARG: a NULL request, one of another communicator, a wait inside a batch), which leaves
 * it posted. The watchdog times the wait itself, not the time since the post (which a schedule fills with compute):
 * a request still incomplete after moe_comm_timeout seconds fails with MOE_ERR_TIMEOUT and a message naming the
 * operation, byte count, peer (its rank in c; mpi and mpi-staged add its world rank and who is missing) and tag.
 * After that or any other failure the job cannot go on: requests still posted are abandoned; nccl aborts its
 * communicator. Collectives may run while requests are posted (on nccl they queue behind them). One wait is one
 * exchange completed; timed communicators add each wait's time under MOE_EXCHANGE_P2P (comm_timing.h). */
typedef struct moe_comm_request moe_comm_request;
enum { MOE_COMM_MAX_TAG = 32000 }; /* below MPI's least MPI_TAG_UB (32767) with room for the transport's own tags */
enum { MOE_COMM_ALLGATHER_TAG = MOE_COMM_MAX_TAG }; /* moe_comm_allgather_payload's: other posts leave it alone */

moe_status moe_comm_isend_bytes(moe_comm *c, const void *buf, size_t nbytes, int peer, int tag,
                                moe_comm_request **req);
moe_status moe_comm_irecv_bytes(moe_comm *c, void *buf, size_t nbytes, int peer, int tag, moe_comm_request **req);
/* Errors of a post, before any communication: MOE_ERR_INVALID_ARG with a message for a peer outside c, a tag
 * outside 0 .. MOE_COMM_MAX_TAG, a NULL req, or a NULL buf with nbytes > 0 (*req is NULL then). */
moe_status moe_comm_wait(moe_comm *c, moe_comm_request *req);
/* Opens and closes a batch of posts (no wait inside one; batches do not nest). MOE_ERR_INVALID_ARG with a message
 * when unpaired. */
moe_status moe_comm_batch_begin(moe_comm *c);
moe_status moe_comm_batch_end(moe_comm *c);
/* Waits for reqs[0 .. count) in that order (NULL entries are skipped) and sets each to NULL; stops at the first
 * failure, leaving the rest posted (abandoned: the job ends). */
moe_status moe_comm_wait_all(moe_comm *c, moe_comm_request **reqs, int count);

/* moe_comm_allgather_bytes on payload memory, on every transport (send: nbytes; recv: size x nbytes, rank p's at
 * p x nbytes; no arithmetic, so the same bytes everywhere): this rank's bytes copied into place (copy_payload), then
 * sent to every other rank and theirs received, in one batch of the posts above (tag MOE_COMM_ALLGATHER_TAG; on nccl,
 * with nothing else of the communicator's posted), each peer's send and receive one exchange, waited for under the
 * watchdog. Host syncs: the waits'. What a tensor-parallel group gathers each layer (models/model.c). */
moe_status moe_comm_allgather_payload(moe_comm *c, const void *send, size_t nbytes, void *recv);

/* For work that each rank does on its own and that must succeed everywhere (loading files, writing a
 * checkpoint on rank 0): returns `mine` if this rank failed, MOE_ERR_PEER if only others did (recording
 * "another rank failed"), else MOE_OK (or the transport's error). Collective. */
moe_status moe_comm_agree(moe_comm *c, moe_status mine);

/* A communicator of size 1 (rank 0) where every exchange is a copy. */
moe_status moe_comm_create_self(const char *label, moe_comm **out);
void moe_comm_destroy(moe_comm *c);

#endif
