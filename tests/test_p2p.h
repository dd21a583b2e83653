/* test_p2p.h — the point-to-point checks of alltoall/comm.h, one driver for every transport (nccl-tests' pattern):
 * the transport's test passes where its payload memory lives as a small table.
 *
 * What the driver checks on communicator c (every rank calls it; W = 1 sends to itself):
 *   ring      every rank sends MESSAGES messages to its right neighbour and as many to its left, all in flight at
 *             once, sizes 0 (a NULL buffer too) to 300 KiB (past MPI's eager limit), tags shared by several messages
 *             (which must then arrive in posting order); payload bytes encode (source, destination, message, byte);
 *             waits in another order than the posts; guard bytes after each receive stay poisoned; one exchange
 *             completed per wait. Posted as one batch (what nccl needs), and on transports that carry tags also
 *             unbatched, sends before receives.
 *   tags      (transports that carry tags) TAG_COUNT messages to the right, tags 0 .. MOE_COMM_MAX_TAG, received in
 *             the reverse order of their tags: each gets its own tag's bytes.
 *   allgather moe_comm_allgather_payload of 0 B to 300 KiB per rank: every rank's bytes in rank order, nothing
 *             written past them, one exchange per peer and direction.
 *   refusals  a peer outside c, tags outside 0 .. MOE_COMM_MAX_TAG, a NULL request pointer or buffer, a wait for no
 *             request or inside a batch, unpaired batches: MOE_ERR_INVALID_ARG, before any communication. */
#ifndef MOE_TESTS_TEST_P2P_H
#define MOE_TESTS_TEST_P2P_H

#include <stddef.h>

#include "alltoall/comm.h"

/* Payload memory of the transport under test; alloc'ed buffers are filled with 0xFF bytes (poison). */
typedef struct {
    void *(*alloc)(void *ctx, size_t nbytes);
    void (*write)(void *ctx, void *buf, const void *host, size_t nbytes); /* host -> payload memory */
    void (*read)(void *ctx, void *host, const void *buf, size_t nbytes);  /* payload memory -> host */
    void (*release)(void *ctx, void *buf);
    void *ctx;
} test_p2p_memory;

extern const test_p2p_memory test_p2p_host; /* malloc'ed host memory: self and mpi */

/* The checks above on c; name is printed in failures. tags_carried: 0 for nccl (messages match in posting order). */
void test_p2p_check(moe_comm *c, const test_p2p_memory *mem, const char *name, int tags_carried);

/* The exchanges of the pipeline's schedules (pipeline/schedule.h) on host memory, the ranks of c its stages: for
 * V = 1 with m = 1 .. 8 micro-batches and V = 2 with m = p and 2p, every rank walks its steps with no compute,
 * sending 64 KiB (past MPI's eager limit, so a send completes only once received) whose bytes name the message
 * (activation or gradient, micro-batch, the virtual stage it goes to), waiting for the sends at the end. Receives
 * are posted at their step, or all at the start (early_receives: the runtime's other choice), each waited for at
 * its step. Tags: 0 for activations, 1 for gradients, or 0 for both (one_tag: nccl's matching, every message
 * between a pair in posting order). Each received message must be the one its step expects. */
void test_p2p_check_pipeline(moe_comm *c, const char *name, int early_receives, int one_tag);

#endif
