#!/bin/bash
# fault_two_jobs.sh MPIRUN MOE_TRAIN TEXT_TO_TOKENS EXPECT_FAILURE — two jobs on one --checkpoint-dir (issue 25, R1):
#   a job submitted twice: while the first trains, the second is refused before training, naming the first's run
#   id and pid (the directory's lock); once the first is killed (kill -9: the kernel drops its lock), a job starts;
#   near-simultaneous starts (0.5 s apart, seeds 1 and 2, saves at 10 and 20, --keep-last 0): exactly one trains
#   and every checkpoint in the directory is its own (on main @ 203d493 step directories held one run's weights
#   with the other's optimizer state, or all of one run's checkpoints were the other's).
#   A .lock that is a symbolic link or a FIFO is refused, its target untouched (issue 49).
. "$(dirname "$0")/faults_common.sh"

lock_holder() { cat "$1/.lock" 2>/dev/null; }

# a job submitted twice
ck="$dir/twice"
launch --steps 100000 --checkpoint-dir "$ck" --eval-interval 0
for ((start = SECONDS; SECONDS - start < 120; )); do [ -n "$(lock_holder "$ck")" ] && break; sleep 0.1; done
holder=$(lock_holder "$ck")
[ -n "$holder" ] || fail_with_output "the first job never took the directory's lock"
first_run=$(echo "$holder" | sed -n 's/^run \([0-9a-f]*\),.*/\1/p')
refuses "is in use by another job: run $first_run, host .*, pid [0-9]+, since .*Wait for it or stop it" --steps 4 \
    --checkpoint-dir "$ck" --seed 2
kill -9 -- -"$job" 2>/dev/null
wait_job 30 || fail_with_output "the first job did not die"
leftovers > /dev/null || fail_with_output "processes of the killed job left"
trains "a job after the holder was killed" "^step     4" --steps 4 --checkpoint-dir "$ck" --seed 2
clean=0

# a .lock planted as a symbolic link to another file (issue 49, 1): refused, and the link's target untouched (it
# was truncated and rewritten with the holder's name); a FIFO there refused too, without hanging the open
ck="$dir/planted"
mkdir -p "$ck"
echo precious > "$dir/victim"
ln -s "$dir/victim" "$ck/.lock"
refuses "$ck/.lock is a symbolic link: the directory's lock file must be a regular file" --checkpoint-dir "$ck"
[ "$(cat "$dir/victim")" = precious ] || fail_with_output "the .lock link's target was changed: $(cat "$dir/victim")"
rm "$ck/.lock" && mkfifo "$ck/.lock"
refuses "$ck/.lock is not a regular file" --checkpoint-dir "$ck"

# another run's checkpoint appearing mid-run where this run saves next (copied in by hand while it trains): the save
# refuses to replace it, naming its run; it stays as it was, and the job ends with the failure said. The ranks are
# stopped while it is copied in (at 0.3 ms a step a CI run had saved its own step 300 before the copy came)
trains "another run's checkpoint" "^step     4" --steps 4 --checkpoint-dir "$dir/other" --seed 2
ck="$dir/planted_step"
launch --steps 100000 --checkpoint-dir "$ck" --checkpoint-interval 3000 --eval-interval 0
planted=0
if wait_for_step 1 120; then
    pkill -STOP -s "$job" -x "$(basename "$train")"
    other_run=$(grep -o '"run_id": "[0-9a-f]*"' "$dir/other/step-00000004/manifest.json" | grep -o '[0-9a-f]*"$' |
        tr -d '"')
    [ ! -e "$ck/step-00003000" ] || echo "(the job had saved step 3000 before it was stopped)" >> "$dir/job.txt"
    cp -r "$dir/other/step-00000004" "$ck/.planting" && mv -T "$ck/.planting" "$ck/step-00003000"
    pkill -CONT -s "$job" -x "$(basename "$train")"
    if ! wait_job 300; then
        fail_job "the job did not end after the planted checkpoint"
    elif [ "$job_rc" -eq 0 ] || ! grep -q "step-00003000 exists and belongs to run $other_run: a save never replaces \
another run's checkpoint" "$dir/job.txt"; then
        fail_job "a planted checkpoint: exit $job_rc, not the refusal naming run $other_run"
    elif ! diff -r "$dir/other/step-00000004" "$ck/step-00003000" > /dev/null; then
        fail_job "the planted checkpoint was changed"
    else
        planted=1
        echo "ok: another run's checkpoint planted mid-run: the save refused it, exit $job_rc"
    fi
else
    fail_job "the job never trained"
    kill -9 -- -"$job" 2>/dev/null
fi

# near-simultaneous starts, 4 trials
trials=4
for ((t = 0; t < trials; t++)); do
    ck="$dir/race$t"
    merge --steps 20 --checkpoint-dir "$ck" --checkpoint-interval 10 --keep-last 0 --seed 1
    "$mpirun" -np 2 "$train" "${merged[@]}" > "$dir/a.txt" 2>&1 &
    a=$!
    sleep 0.5
    merge --steps 20 --checkpoint-dir "$ck" --checkpoint-interval 10 --keep-last 0 --seed 2
    timeout 120 "$mpirun" -np 2 "$train" "${merged[@]}" > "$dir/b.txt" 2>&1
    b_rc=$?
    wait $a
    a_rc=$?
    runs=$(cat "$ck"/step-*/manifest.json 2>/dev/null | grep -o '"run_id": "[0-9a-f]*"' | sort -u | wc -l)
    if [ $((a_rc == 0)) -ne $((b_rc != 0)) ] || [ "$runs" -ne 1 ] || [ "$(ls -d "$ck"/step-* | wc -l)" -ne 2 ]; then
        echo "FAIL: trial $t: exit statuses $a_rc and $b_rc, $runs run(s) in $(ls "$ck")"
        cat "$dir/a.txt" "$dir/b.txt" | grep moe-train
        failures=$((failures + 1))
    else
        refused_out=$([ $a_rc -eq 0 ] && echo b.txt || echo a.txt)
        clean=$((clean + 1))
        echo "ok: trial $t: one job trained, the other: $(grep -m 1 -o 'is in use by another job\|already holds another run.s checkpoints' "$dir/$refused_out")"
    fi
done
report "two jobs on one checkpoint directory" $((trials + 2)) $((clean + planted + (failures == 0))) 0 0 0
finish fault_two_jobs
