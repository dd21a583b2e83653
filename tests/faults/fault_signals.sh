#!/bin/bash
# fault_signals.sh MPIRUN MOE_TRAIN TEXT_TO_TOKENS EXPECT_FAILURE — a job told to stop (issue 25, R9): Slurm's
# preemption and scancel send SIGTERM to every task and SIGKILL ~30 s later; Ctrl-C sends SIGINT; Slurm's --signal
# and `kill -USR1 <mpirun>` (mpirun forwards it) send SIGUSR1. Each stops the run at the next step boundary on
# every rank, saves a checkpoint of that step, says so, and exits with 128 + the signal's number; the checkpoint
# resumes. A second signal ends the job at once, with no new checkpoint. --stop-signals none leaves the default
# (the process ends at once, nothing saved). On main @ 203d493 every such job ended within a second, silently,
# losing everything since the last interval.
. "$(dirname "$0")/faults_common.sh"

# stopped SIGNAL TARGET STATUS: a long run, SIGNAL sent to TARGET (ranks: every rank, as Slurm does; mpirun) once it
# has trained 20 steps; the job must exit STATUS having saved its last step, which resumes. It has 150 s to end: alone
# it ends 2-4 s after the signal, but under scripts/test.sh's four lanes two runs in a row each had one stop that did
# not end within 60 s (which stop varied; not reproduced alone; the save's fsyncs stalling behind the other lanes'
# build writes is the suspect). fail_job then shows what the processes were doing.
clean=0
stopped() {
    local sig=$1 target=$2 status=$3 ck="$dir/ck-$1-$2"
    launch --steps 100000 --checkpoint-dir "$ck" --eval-interval 0
    wait_for_step 20 120 || { fail_job "SIG$sig to $target: the job did not reach step 20 in 120 s"; return; }
    local t0=$SECONDS
    if [ "$target" = ranks ]; then pkill "-$sig" -s "$job" -x "$(basename "$train")"; else kill "-$sig" "$job"; fi
    wait_job 150 || { fail_job "SIG$sig to $target: the job did not end within 150 s"; return; }
    local line last
    line=$(grep -m 1 "^moe-train: SIG$sig: stopped after step" "$dir/job.txt")
    last=$(echo "$line" | sed -n 's/.*stopped after step \([0-9]*\) .*/\1/p')
    if [ "$job_rc" -ne "$status" ] || [ -z "$last" ] || ! grep -q "checkpoint saved; exit status $status" <<< "$line" ||
        [ ! -d "$(printf '%s/step-%08d' "$ck" "$last")" ]; then
        echo "FAIL: SIG$sig to $target: exit $job_rc (want $status), '$line', saved: $(ls "$ck" 2>/dev/null)"
        grep moe-train "$dir/job.txt" | head -5
        failures=$((failures + 1))
        return
    fi
    leftovers > /dev/null || fail_job "SIG$sig to $target: processes left"
    echo "ok: SIG$sig to $target: $line (ended $((SECONDS - t0)) s after the signal)"
    trains "SIG$sig's checkpoint resumes" "resumed from .*step-0*$last after step $last" --steps $((last + 2)) \
        --resume --checkpoint-dir "$ck"
    clean=$((clean + 1))
}
stopped TERM ranks 143
stopped INT ranks 130
stopped USR1 ranks 138
stopped USR1 mpirun 138

# under --save-dtype bf16 the stop's save is an export, which --resume refuses: the line says so, not "checkpoint
# saved" (it did before)
launch --steps 100000 --checkpoint-dir "$dir/export" --eval-interval 0 --save-dtype bf16
wait_for_step 5 120 || fail_job "SIGTERM under --save-dtype bf16: the job did not reach step 5 in 120 s"
pkill -TERM -s "$job" -x "$(basename "$train")"
wait_job 150 || fail_job "SIGTERM under --save-dtype bf16: the job did not end within 150 s"
line=$(grep -m 1 "^moe-train: SIGTERM: stopped after step" "$dir/job.txt")
if [ "$job_rc" -eq 143 ] && grep -q "bf16 export saved (--save-dtype bf16: --init-from takes it, --resume does not)" \
    <<< "$line" && [ -n "$(ls "$dir/export" | grep step-)" ]; then
    echo "ok: SIGTERM under --save-dtype bf16: $line"
    clean=$((clean + 1))
else
    fail_job "SIGTERM under --save-dtype bf16: exit $job_rc, '$line', saved: $(ls "$dir/export")"
fi
leftovers > /dev/null || fail_job "SIGTERM under --save-dtype bf16: processes left"

# a second signal: at once, nothing new saved — sent while the save the first one asked for is under way (every fsync
# made 2 s slower by the shim, so the save lasts seconds; the first signal has surely been handled by then). Sent
# back to back instead, two signals can reach a rank as one (a pending signal is not queued twice): under the test
# lanes' load that happened, and the job stopped after its step as for one signal.
ck="$dir/twice"
LD_PRELOAD="$5${LD_PRELOAD:+ $LD_PRELOAD}" MOE_TEST_FSYNC_DELAY_S=2 launch --steps 100000 --checkpoint-dir "$ck" --eval-interval 0
wait_for_step 2 120 || fail_job "two SIGTERMs: the job did not reach step 2 in 120 s"
pkill -TERM -s "$job" -x "$(basename "$train")"
for ((i = 0; i < 600; i++)); do ls -a "$ck" 2>/dev/null | grep -q '^\.tmp-step-' && break; sleep 0.1; done
ls -a "$ck" 2>/dev/null | grep -q '^\.tmp-step-' || fail_job "two SIGTERMs: no save began within 60 s"
pkill -TERM -s "$job" -x "$(basename "$train")"
wait_job 60 || fail_job "two SIGTERMs: the job did not end within 60 s"
if [ "$job_rc" -ne 0 ] && ! grep -q "stopped after step" "$dir/job.txt" && [ -z "$(ls "$ck" | grep step-)" ]; then
    echo "ok: two SIGTERMs: ended at once (exit $job_rc), nothing saved"
    clean=$((clean + 1))
else
    fail_job "two SIGTERMs: exit $job_rc, saved: $(ls "$ck")"
fi
leftovers > /dev/null || fail_job "two SIGTERMs: processes left"

# Under mpirun's own ending of a job (issue 49, 5 and 6): mpirun given SIGTERM sends the ranks SIGCONT, SIGTERM
# odls_base_sigkill_timeout seconds later and SIGKILL as long again after, exiting then (rc 1), and stops reading
# their output. ended_by_mpirun WHAT TARGET FLAGS...: SIGTERM to TARGET (mpirun; session: mpirun and every rank, as
# a scheduler sends it) once the job has trained 5 steps; when mpirun has exited, a whole checkpoint of a step after
# the 5th is there and resumes. Before: at ~1 ms a step nothing was saved (rank 0 blocked writing its step lines to
# an mpirun that no longer read them), and mpirun's own SIGTERM, the second, ended a save that SIGTERM had begun.
ended_by_mpirun() {
    local what=$1 target=$2 ck="$dir/ck-$3"
    shift 3
    launch --steps 1000000 --checkpoint-dir "$ck" --checkpoint-interval 1000000 --eval-interval 0 "$@"
    wait_for_step 5 120 || { fail_job "$what: the job did not reach step 5 in 120 s"; return; }
    if [ "$target" = session ]; then pkill -TERM -s "$job"; else kill -TERM "$job"; fi
    wait_job 60 || { fail_job "$what: the job did not end within 60 s"; return; }
    local saved
    saved=$(ls "$ck" 2>/dev/null | grep '^step-' | tail -n 1)
    leftovers > /dev/null || fail_job "$what: processes left"
    if [ -z "$saved" ] || [ "${saved#step-}" -le 5 ] || [ ! -f "$ck/$saved/manifest.json" ]; then
        fail_job "$what: mpirun exited $job_rc and left no whole checkpoint after step 5 (saved: $(ls -a "$ck" 2>/dev/null | tr '\n' ' '))"
        return
    fi
    echo "ok: $what: mpirun exited $job_rc after ${job_s}s, $saved saved"
    trains "$what: its checkpoint resumes" "resumed from .*$saved after step" --steps $((10#${saved#step-} + 1)) \
        --resume --checkpoint-dir "$ck"
    clean=$((clean + 1))
}
# In the main build only (the test command's time): these test how mpirun ends a job; the ranks' side of it, the
# signal path, runs sanitized in the cases above and in tests/test_signals_gemm.c.
skipped=0
if [ -z "${ASAN_OPTIONS:-}" ]; then
    ended_by_mpirun "1 ms steps, SIGTERM to mpirun" mpirun fast-mpirun
    ended_by_mpirun "1 ms steps, SIGTERM to mpirun and the ranks" session fast-session
    # a save of ~3 s (each fsync 0.4 s slower) outlasts mpirun's default 2 s; with odls_base_sigkill_timeout 4 (the
    # setting docs/RELIABILITY.md gives: half the scheduler's grace) it finishes before mpirun exits
    launch_env=(LD_PRELOAD="$5${LD_PRELOAD:+ $LD_PRELOAD}" MOE_TEST_FSYNC_DELAY_S=0.4 OMPI_MCA_odls_base_sigkill_timeout=4)
    ended_by_mpirun "a 3 s save, SIGTERM to mpirun and the ranks, sigkill timeout 4 s" session slow-session
    launch_env=()
else
    echo "skipped under the sanitizers: mpirun ending the job (3 cases)"
    skipped=3
fi

# coreutils' timeout (a job script's wall-clock limit) sends its signal to moe-train and again to its process group
# (and ignores any further one itself, so a second request cannot pass through it):
# the copy continues the stop (2026-12-08: at ~1 ms a step, 4 stops in 10 ended unsaved; a CI run's flake). 3 trials
timed_out=0
for trial in 1 2 3; do
    ck="$dir/timeout$trial"
    merge --steps 100000 --checkpoint-dir "$ck" --eval-interval 0
    : > "$dir/t.txt"
    timeout 300 "$train" "${merged[@]}" > "$dir/t.txt" 2>&1 &
    tjob=$!
    for ((i = 0; i < 1200; i++)); do grep -q "^step    20 " "$dir/t.txt" && break; sleep 0.1; done
    kill -TERM "$tjob"
    rc=0
    wait "$tjob" || rc=$?
    if [ "$rc" -eq 143 ] && grep -q "^moe-train: SIGTERM: stopped after step .*checkpoint saved" "$dir/t.txt" &&
        [ -n "$(ls "$ck" | grep step-)" ]; then
        timed_out=$((timed_out + 1))
    else
        echo "FAIL: SIGTERM to timeout (trial $trial): exit $rc, saved: $(ls "$ck" 2>/dev/null)"
        grep moe-train "$dir/t.txt" | head -5
        failures=$((failures + 1))
    fi
done
[ "$timed_out" -eq 3 ] && echo "ok: SIGTERM to timeout, which repeats it to the process group: saved, 3 trials of 3"
clean=$((clean + (timed_out == 3)))

# --stop-signals none: the default action
launch --steps 100000 --checkpoint-dir "$dir/none" --eval-interval 0 --stop-signals none
wait_for_step 20 120 || fail_job "--stop-signals none: the job did not reach step 20 in 120 s"
pkill -TERM -s "$job" -x "$(basename "$train")"
wait_job 60 || fail_job "--stop-signals none: the job did not end within 60 s"
if [ "$job_rc" -ne 0 ] && [ -z "$(ls "$dir/none" | grep step-)" ]; then
    echo "ok: --stop-signals none: SIGTERM ended it at once (exit $job_rc)"
    clean=$((clean + 1))
else
    fail_job "--stop-signals none: exit $job_rc, saved: $(ls "$dir/none")"
fi
leftovers > /dev/null || fail_job "--stop-signals none: processes left"
refuses "--stop-signals: 'KILL' is not one of TERM, INT, USR1, USR2, HUP" --stop-signals TERM,KILL
# an empty list (an unset variable in a job script) turned the stop off without a word (a probe, 2026-12-07)
refuses "--stop-signals: an empty list: name the signals" --stop-signals ''

# while the end's sample is drawn (a probe, 2026-12-07: the ranks sampled on and the job exited 0): it stops after the
# token in flight, prints what it has and exits 128 + the signal
launch --steps 1 --eval-interval 0 --sample-tokens 65536 --sample-temperature 0
wait_for_step 1 120 || fail_job "SIGTERM while sampling: the job did not reach step 1 in 120 s"
sleep 1
pkill -TERM -s "$job" -x "$(basename "$train")"
wait_job 60 || fail_job "SIGTERM while sampling: the job did not end within 60 s"
line=$(grep -m 1 "^moe-train: SIGTERM: sampling stopped after" "$dir/job.txt")
if [ "$job_rc" -eq 143 ] && [ -n "$line" ]; then
    echo "ok: SIGTERM while sampling: $line"
    clean=$((clean + 1))
else
    fail_job "SIGTERM while sampling: exit $job_rc, '$line'"
fi
leftovers > /dev/null || fail_job "SIGTERM while sampling: processes left"

report "stop signals" $((12 - skipped)) $clean 0 0 0
finish fault_signals
