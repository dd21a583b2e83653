/* rank_agreement.h — what every rank of a job must agree on before it starts, and how a failure they agreed on is
 * told. An MPMD launch (`mpirun A : B`) or a --config file that differs from node to node gave ranks different
 * layouts, which ended in MPI's own error or a start-up watchdog that blamed an unreachable rank (a probe,
 * 2026-12-07); now the job stops at once, naming the option. And a failure every rank met alike (a missing data file on
 * 8 ranks) was 8 lines of the same message. */
#ifndef MOE_TRAIN_RANK_AGREEMENT_H
#define MOE_TRAIN_RANK_AGREEMENT_H

#include <mpi.h>
#include <stdio.h>

#include "train/options.h"

/* Collective over world, right after each rank parsed its command line (parsed: moe_train_options_load's return).
 * Returns parsed where every rank's equals it and, where all parsed, their options are the same (each option's value
 * as moe_train_option_format writes it, hashed and compared by MPI_Allreduce; --threads, a machine's own, and the
 * flag-only --config and --print-* left out); else -1, with the first differing option, or the ranks whose command
 * line was refused, named by rank 0 on err (NULL: quiet). */
int moe_train_options_agree(int parsed, const moe_train_options *o, MPI_Comm world, FILE *err);

/* Every rank's status, agreed over world with MPI directly (before any layout exists): this rank's own failure, else
 * MOE_ERR_PEER where another rank failed, else MOE_OK. */
moe_status moe_train_agree(MPI_Comm world, moe_status mine);

/* Collective over world, after a failure every rank agreed on (st: this rank's own, or MOE_ERR_PEER where it only
 * learned of another's): each distinct message on stderr once, by the lowest rank that has it, with how many ranks
 * met it ("moe-train: rank 0 (and 7 others alike): WHAT: MESSAGE"). */
void moe_train_report_agreed_failure(moe_status st, const char *what, MPI_Comm world);

#endif
