/* comm_timing.h — exchange timing for benchmarks: a communicator told to time its exchanges adds the wall
 * time of each one (host clock, from call to return; for a GPU transport that includes waiting for the
 * device where the transport waits) to a table by kind. Nothing else changes: the same transport runs. */
#ifndef MOE_ALLTOALL_COMM_TIMING_H
#define MOE_ALLTOALL_COMM_TIMING_H

#include "alltoall/comm.h"

typedef enum {
    MOE_EXCHANGE_PAYLOAD,   /* alltoallv of rows: dispatch and combine                           */
    MOE_EXCHANGE_COUNTS,    /* alltoall of ints: the dispatch plan's counts                       */
    MOE_EXCHANGE_ROUTING,   /* scans and gathers: capacity, global counts, routing traces, norms  */
    MOE_EXCHANGE_ALLREDUCE, /* all-reduce: losses, gradients                                      */
    MOE_EXCHANGE_BARRIER,
    MOE_EXCHANGE_P2P,       /* waits for point-to-point sends and receives: a pipeline's activations */
    MOE_EXCHANGE_KINDS
} moe_exchange_kind;

typedef struct {
    double seconds[MOE_EXCHANGE_KINDS];
    long calls[MOE_EXCHANGE_KINDS];
} moe_exchange_times;

/* From now on every exchange of c adds to *times (several communicators may share one table); NULL stops. */
void moe_comm_time_exchanges(moe_comm *c, moe_exchange_times *times);
const char *moe_exchange_kind_name(moe_exchange_kind kind); /* "payload", "counts", ... */

#endif
