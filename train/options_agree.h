/* options_agree.h — every rank of a job trains with the same options. An MPMD launch (`mpirun A : B`) or a --config
 * file that differs from node to node gave ranks different layouts, which ended in MPI's own error or a start-up
 * watchdog that blamed an unreachable rank (a probe, 2026-12-07); now the job stops at once, naming the option. */
#ifndef MOE_TRAIN_OPTIONS_AGREE_H
#define MOE_TRAIN_OPTIONS_AGREE_H

#include <mpi.h>
#include <stdio.h>

#include "train/options.h"

/* Collective over world, right after each rank parsed its command line (parsed: moe_train_options_load's return).
 * Returns parsed where every rank's equals it and, where all parsed, their options are the same (each option's value
 * as moe_train_option_format writes it, hashed and compared by MPI_Allreduce; --threads, a machine's own, and the
 * flag-only --config and --print-* left out); else -1, with the first differing option, or the ranks whose command
 * line was refused, named by rank 0 on err (NULL: quiet). */
int moe_train_options_agree(int parsed, const moe_train_options *o, MPI_Comm world, FILE *err);

#endif
