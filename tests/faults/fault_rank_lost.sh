#!/bin/bash
# fault_rank_lost.sh MPIRUN MOE_TRAIN TEXT_TO_TOKENS EXPECT_FAILURE — one rank of a training job lost mid-step:
#   killed (kill -9): the job ends, non-zero, within 30 s, saying which process died, and no process is left;
#   stopped (SIGSTOP, a hung node): the other rank's exchange watchdog (--exchange-timeout 3) fires, names the
#   stopped rank as the missing peer, and the job ends, non-zero, with no process left (the stopped one too);
#   stopped as soon as it exists (inside MPI_Init, outside any exchange): the start-up alarm (--startup-timeout 3)
#   ends the job.
# Each MOE_FAULT_TRIALS times (default 2), at a random moment of the run; killed and stopped also in a pipeline of two
# stages (--pp 2: the stopped stage is missed by the other's point-to-point wait or a collective), and stopped in
# 4 ranks at --pp 2 --tp 2 --virtual-stages 2 (one of the 4 at random), where a rank waiting on the pipeline asks
# peers that all wait on their own tensor group: the first watchdog message names the stopped rank, and no other
# (issue 49: 3 of 4 named only running ranks, or none).
. "$(dirname "$0")/faults_common.sh"
trials=${MOE_FAULT_TRIALS:-2}
flags=(--steps 1000000 --eval-interval 0 --exchange-timeout 3)

world_rank_of() { tr '\0' '\n' < "/proc/$1/environ" | sed -n 's/^OMPI_COMM_WORLD_RANK=//p'; }

tried=0 clean=0 crashes=0 hangs=0
for case in "KILL 1" "STOP 1" "START 1" "KILL 2" "STOP 2" "STOP 2x2"; do
    read -r signal pp <<< "$case"
    ranks=2 layout=(--pp "$pp" --layers "$pp")
    # the start-up alarm, 60 s by default, shortened where it is the case (elsewhere a loaded MPI_Init must not trip it)
    [ "$signal" = START ] && layout+=(--startup-timeout 3)
    case_trials=$trials
    # 4 ranks on the test command's 2 cores: once by default (a random one of the 4)
    [ "$pp" = 2x2 ] && ranks=4 case_trials=$(((trials + 1) / 2)) \
        layout=(--pp 2 --tp 2 --virtual-stages 2 --layers 4 --micro-batches 2 --batch 4)
    for ((trial = 1; trial <= case_trials; trial++)); do
        tried=$((tried + 1))
        launch "${flags[@]}" "${layout[@]}"
        victim= rank=
        if [ "$signal" = START ]; then # the first rank process, stopped the moment it exists
            wait_for_ranks 1 30 && victim=$(job_ranks | head -n 1) && kill -STOP "$victim"
        else
            # training, then a random moment (a start-up slowed by other jobs is not "mid-step")
            wait_for_step 1 120 && sleep "$(awk -v s="$RANDOM" 'BEGIN { srand(s); printf "%.2f", 0.5 + rand() }')"
            victim=$(job_ranks | sed -n "$((RANDOM % ranks + 1))p")
            [ -n "$victim" ] && rank=$(world_rank_of "$victim") && kill -"$signal" "$victim"
        fi
        [ -n "${victim:-}" ] || { hangs=$((hangs + 1)); cp "$dir/job.txt" "$dir/out.txt"; fail_with_output "no ranks"; continue; }
        [ "$signal" = START ] && rank=$(world_rank_of "$victim")
        case $signal in
        KILL) expect="exited on signal 9|killed" ;;
        STOP) expect="watchdog: .* still incomplete after 3.0 s.*missing: world rank $rank\\b" ;;
        START) expect="start-up \\(MPI_Init and the parallel layout\\) did not finish within 3 s|missing: world rank $rank" ;;
        esac
        cp "$dir/job.txt" "$dir/out.txt"
        if ! wait_job 30; then
            hangs=$((hangs + 1))
            fail_with_output "$signal of world rank $rank (pp $pp): the job did not end within 30 s"
            continue
        fi
        cp "$dir/job.txt" "$dir/out.txt"
        if ! left=$(leftovers); then
            # mpirun itself may die of SIGSEGV while it ends a job with a stopped rank (Open MPI 4.1's own crash: once
            # in ~6 fresh-clone runs of the test command, the 4-rank case, 2026-12-07), leaving that rank: the trial
            # once more, said so; a second time is a failure
            if [ "$job_rc" -eq 139 ] && [ "${mpirun_crashed:-0}" -eq 0 ]; then
                mpirun_crashed=1 tried=$((tried - 1)) trial=$((trial - 1))
                echo "note: mpirun itself died of SIGSEGV ending the job (Open MPI's; ranks killed): the trial again"
                continue
            fi
            hangs=$((hangs + 1))
            echo "FAIL: $signal: processes left: $left"
            continue
        fi
        # the first watchdog to fire must name the stopped rank and no other; the later ones fire while the job is
        # ending (mpirun's abort resumes the stopped rank, and ranks that have already failed no longer answer)
        named_others=$(grep -m 1 "watchdog:" "$dir/out.txt" | grep -oE 'missing: world rank [0-9]+(, [0-9]+)*' |
            grep -Ev "missing: world rank $rank\$")
        if [ "$job_rc" -ne 0 ] && grep -Eq -e "$expect" "$dir/out.txt" && [ -z "$named_others" ]; then
            clean=$((clean + 1))
            echo "ok: $signal of world rank $rank (pp $pp): ended in ${job_s}s with: $(grep -E -e "$expect" "$dir/out.txt" | head -n 1 | cut -c1-300)"
        else
            crashes=$((crashes + 1))
            fail_with_output "$signal of world rank $rank (pp $pp): exit $job_rc without /$expect/, or naming a running rank missing (${named_others:-none})"
        fi
    done
done
report "a rank killed or stopped mid-step, or stopped at start-up" "$tried" "$clean" "$crashes" "$hangs" 0
[ "$clean" -eq "$tried" ] || failures=$((failures + 1))
finish fault_rank_lost
