/* train/signals.h — moe-train's stop requests by signal. A scheduler that preempts or cancels a job sends SIGTERM
 * and kills it some seconds later (Slurm's KillWait, 30 s by default; Kubernetes' grace period, 30 s); Ctrl-C
 * sends SIGINT; Slurm's --signal and mpirun (which forwards it at once) SIGUSR1. The first watched signal only
 * records itself: moe-train finishes the step it is in, every rank agrees at the step boundary, a checkpoint is
 * saved (with --checkpoint-dir) and the job exits with 128 + the signal's number. A second watched signal ends the
 * process at once, as if nothing were watched (its default action) — except the SIGTERM with which the launcher (the
 * parent, when it is Open MPI's mpirun or orted) follows up the job's end, and the one copy of its signal that
 * coreutils' timeout sends again to the process group: they continue the first request. Until the save,
 * standard output and error, when mpirun reads them, are non-blocking: an mpirun ending the job stops reading. */
#ifndef MOE_TRAIN_SIGNALS_H
#define MOE_TRAIN_SIGNALS_H

#include <stddef.h>

/* Watches the signals named in `list` ("TERM,INT,USR1": names without SIG, comma-separated, of TERM, INT, USR1,
 * USR2, HUP; "none": none). 0, or -1 with a message in why (an unknown name). _check only reads the list. */
int moe_train_signals_watch(const char *list, char *why, size_t why_nbytes);
int moe_train_signals_check(const char *list, char *why, size_t why_nbytes);

/* Where the watched signals may arrive. A handler's frame written onto a thread inside a GEMM library call corrupts
 * the heap (oneDNN 2.6's JIT sgemm, gemm:jit, points rsp into a heap workspace, fixed upstream in 2026 by oneDNN PR 4855: issue 49 saw
 * "corrupted size vs. prev_size" after a SIGTERM, 3 runs in 25), so after moe_train_signals_watch the pool's threads
 * never take them and this (the main) thread only between moe_train_signals_boundary(1) and (0), around what a step
 * does after its computation: logging, the stop's agreement, the save. Meanwhile they wait, pending, or reach a
 * thread that never computes (MPI's). */
void moe_train_signals_boundary(int open);

/* After a stop's checkpoint: standard output and error blocking again (their error flags cleared) for the messages
 * that end the run, which with MPI_Finalize get 10 s: past that nobody reads them, and the process exits with
 * 128 + the signal's number. Without a stop received: only the first part. */
void moe_train_signals_block_output(void);

/* The first watched signal received so far, or 0. */
int moe_train_signal_received(void);

/* "SIGTERM" for 15, for messages; "signal N" for one it does not name. */
const char *moe_train_signal_name(int signo);

#endif
