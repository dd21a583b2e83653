/* batch_reader.h — a step's tokens out of a data set (train/dataloader.h), now or on a thread of its own while the
 * step before computes (issue 52: the next micro-batches' windows read in the background). Deterministic: the
 * thread calls the same read with the same arguments, so only when the I/O happens moves, never which tokens. The
 * thread makes no MPI call and touches nothing but the data set (pread only) and its own buffer. */
#ifndef MOE_TRAIN_BATCH_READER_H
#define MOE_TRAIN_BATCH_READER_H

#include <pthread.h>

#include "train/dataloader.h"

/* Reads `reads` runs of num_seqs sequences, run i from global sequence firsts[i]: its inputs to
 * tokens + i * num_seqs * S, its targets to tokens + (reads + i) * num_seqs * S (tokens: [2][reads][num_seqs * S]).
 * Before reading, advises the kernel to read in the windows of the runs from advise_firsts (NULL: none), the step
 * after, so that a cold page cache is read ahead one more step. */
moe_status moe_batch_read(moe_token_data *d, moe_data_order order, const int64_t *firsts, const int64_t *advise_firsts,
                          int reads, int num_seqs, int *tokens);

/* One read in flight. */
typedef struct {
    pthread_t thread;
    int running;
    moe_token_data *data;
    moe_data_order order;
    int64_t *firsts;   /* [2 * reads]: the runs' first sequences, then the advised ones' */
    int reads, num_seqs, advise;
    int *tokens;
    moe_status status; /* the read's, with its message (the thread's own failure message copied here) */
    char message[1024];
} moe_batch_prefetch;

/* Starts moe_batch_read on a thread (firsts and advise_firsts copied). MOE_ERR_OUT_OF_MEMORY, or an error when no
 * thread can be made: the caller then reads when it needs the tokens. */
moe_status moe_batch_prefetch_start(moe_batch_prefetch *p, moe_token_data *d, moe_data_order order,
                                    const int64_t *firsts, const int64_t *advise_firsts, int reads, int num_seqs,
                                    int *tokens);
/* Waits for the read (none running: MOE_OK) and returns its status, its message restored (moe_failure_message). */
moe_status moe_batch_prefetch_wait(moe_batch_prefetch *p);

#endif
