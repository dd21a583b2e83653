/* train/signals.h — moe-train's stop requests by signal. A scheduler that preempts or cancels a job sends SIGTERM
 * and kills it some seconds later (Slurm's KillWait, 30 s by default; Kubernetes' grace period, 30 s); Ctrl-C
 * sends SIGINT; Slurm's --signal and mpirun (which forwards it at once) SIGUSR1. The first watched signal only
 * records itself: moe-train finishes the step it is in, every rank agrees at the step boundary, a checkpoint is
 * saved (with --checkpoint-dir) and the job exits with 128 + the signal's number. A second watched signal ends the
 * process at once, as if nothing were watched (its default action). */
#ifndef MOE_TRAIN_SIGNALS_H
#define MOE_TRAIN_SIGNALS_H

#include <stddef.h>

/* Watches the signals named in `list` ("TERM,INT,USR1": names without SIG, comma-separated, of TERM, INT, USR1,
 * USR2, HUP; "none": none). 0, or -1 with a message in why (an unknown name). _check only reads the list. */
int moe_train_signals_watch(const char *list, char *why, size_t why_nbytes);
int moe_train_signals_check(const char *list, char *why, size_t why_nbytes);

/* The first watched signal received so far, or 0. */
int moe_train_signal_received(void);

/* "SIGTERM" for 15, for messages; "signal N" for one it does not name. */
const char *moe_train_signal_name(int signo);

#endif
