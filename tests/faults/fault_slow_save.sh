#!/bin/bash
# fault_slow_save.sh MPIRUN MOE_TRAIN TEXT_TO_TOKENS EXPECT_FAILURE SLOW_DISK_SHIM — a checkpoint save slower
# than --exchange-timeout (every fsync 0.5 s slower: about 4 s a save) does not trip the exchange watchdog:
# the ranks wait for each other's part of the save under --checkpoint-timeout, also while rank 0 alone makes the
# save's directory (every mkdir 3 s slower: until 2026-12-07 the others gave up on it after --exchange-timeout and
# the job hung for an hour); a save slower than --checkpoint-timeout ends the job with that message; the newest
# checkpoint loads (the earlier one, or the slow one when rank 0 finished it after the others left).
# Before them, an MPI_Init of 6 s under --exchange-timeout 5: the start-up alarm was as long as --exchange-timeout until
# 2026-12-07, and a CI run's MPI_Init on 2 loaded cores outlasted 2 s; it is --startup-timeout now, by default at least
# 60 s; given 1 s, that start-up ends the job saying so. (5 s, not 2: the steps after it run under the same limit, and
# one exchange of a run beside two other tests on 2 cores once stalled past 2 s, 2026-12-07.)
. "$(dirname "$0")/faults_common.sh"
preloaded=${LD_PRELOAD:-} # scripts/sanitize.sh's shim, kept beside the slow disk's
export LD_PRELOAD="$5${preloaded:+ $preloaded}" MOE_TEST_MPI_INIT_DELAY_S=6
trains "an MPI_Init of 6 s under --exchange-timeout 5" "^step     2" --exchange-timeout 5
refuses "start-up \\(MPI_Init and the parallel layout\\) did not finish within 1 s \\(--startup-timeout\\)" \
    --exchange-timeout 2 --startup-timeout 1
unset MOE_TEST_MPI_INIT_DELAY_S
export MOE_TEST_MKDIR_DELAY_S=3
trains "a save directory made in 3 s under --exchange-timeout 2" "step-00000002 saved" --exchange-timeout 2 \
    --checkpoint-dir "$dir/ck-mkdir" --checkpoint-interval 1
unset MOE_TEST_MKDIR_DELAY_S
export MOE_TEST_FSYNC_DELAY_S=0.5
ck="$dir/ck"
trains "saves of ~4 s under --exchange-timeout 2" "^step     2" --exchange-timeout 2 --checkpoint-dir "$ck" \
    --checkpoint-interval 1
refuses "checkpoint save failed.*did not finish within --checkpoint-timeout 1 s" --exchange-timeout 2 --steps 3 \
    --checkpoint-dir "$ck" --checkpoint-interval 1 --resume --checkpoint-timeout 1
export LD_PRELOAD=$preloaded
trains "the newest checkpoint loads" "resumed from .*step-0000000[23] after step [23]" --steps 4 --resume \
    --checkpoint-dir "$ck"
report "a slow MPI_Init; a save slower than --exchange-timeout, then than --checkpoint-timeout" 5 $((5 - failures)) 0 0 0
finish fault_slow_save
