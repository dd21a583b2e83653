#!/bin/bash
# fault_kill_during_save.sh MPIRUN MOE_TRAIN TEXT_TO_TOKENS EXPECT_FAILURE SLOW_DISK_SHIM — kill -9 of the
# whole job (every process of it at once, as a node failure or a scheduler would) at random moments of a run
# that saves a checkpoint after every step, MOE_FAULT_TRIALS times (default 12). Every fsync is made 30 ms
# slower (the shim), as on a busy disk, so that most kills land inside a save. After each kill: no process is
# left, every step directory is whole (every file its manifest lists, at its size: a save or a prune cut short
# leaves none half there), and the next run resumes from exactly the newest; a last run continues to its end.
# A checkpoint is lost when one is not whole, a resume fails, or a resume starts from an older step than the
# newest one published.
. "$(dirname "$0")/faults_common.sh"
trials=${MOE_FAULT_TRIALS:-12}
export LD_PRELOAD=$5 MOE_TEST_FSYNC_DELAY_S=0.03
ck="$dir/ck"
flags=(--steps 1000000 --eval-interval 0 --checkpoint-dir "$ck" --checkpoint-interval 1 --keep-last 2)

newest_step() { # the largest step-NNNNNNNN in $ck (one run: the newest saved), or 0
    local last
    last=$(ls "$ck" 2>/dev/null | grep -E '^step-[0-9]{8}$' | sort | tail -n 1)
    [ -n "$last" ] && echo $((10#${last#step-})) || echo 0
}

whole() { # DIR: every file the manifest lists exists with its size
    local d=$1 name size
    [ -f "$d/manifest.json" ] || return 1
    while read -r name size; do
        [ "$(stat -c %s "$d/$name" 2>/dev/null)" = "$size" ] || return 1
    done < <(sed -n 's/^ *"\([a-z_]*\.\(json\|safetensors\)\)": \([0-9]*\),\{0,1\}$/\1 \3/p' "$d/manifest.json")
}

clean=0 crashes=0 hangs=0 lost=0 inside_save=0 expect=0
for ((trial = 1; trial <= trials; trial++)); do
    resume=()
    [ "$expect" -gt 0 ] && resume=(--resume)
    launch "${flags[@]}" "${resume[@]}"
    wait_for_ranks 2 60 || { hangs=$((hangs + 1)); fail_with_output "trial $trial: the ranks did not start"; }
    # a resume is killed once it has loaded (a kill before that tests nothing new, and under the test lanes' load the
    # load itself can outlast the random wait below)
    if [ "$expect" -gt 0 ]; then
        for ((i = 0; i < 1200; i++)); do
            grep -q "resumed from\|cannot load" "$dir/job.txt" 2>/dev/null || ! kill -0 "$job" 2>/dev/null && break
            sleep 0.1
        done
    fi
    sleep "$(awk -v s="$RANDOM" 'BEGIN { srand(s); printf "%.2f", 0.8 + rand() * 1.5 }')"
    if ! kill -0 "$job" 2>/dev/null; then # the job ended by itself: a crash or a failed resume
        wait "$job"
        grep -q "cannot load the checkpoint" "$dir/job.txt" && lost=$((lost + 1)) || crashes=$((crashes + 1))
        cp "$dir/job.txt" "$dir/out.txt"
        fail_with_output "trial $trial: the job ended before the kill"
        continue
    fi
    kill -9 -- -"$job"
    wait "$job" 2>/dev/null
    left=$(leftovers) || { hangs=$((hangs + 1)); echo "FAIL: trial $trial: processes left after kill -9: $left"; }
    in_save=$(ls -a "$ck" 2>/dev/null | grep -qE '^\.(tmp-step|old-|trash-)' && echo ', inside a save')
    [ -n "$in_save" ] && inside_save=$((inside_save + 1))
    resumed=$(grep -o "resumed from .* after step [0-9]*" "$dir/job.txt" | grep -o '[0-9]*$')
    if [ "$expect" -gt 0 ] && [ "${resumed:-0}" != "$expect" ]; then
        lost=$((lost + 1))
        cp "$dir/job.txt" "$dir/out.txt"
        fail_with_output "trial $trial: resumed after step ${resumed:-none}, the newest checkpoint was step $expect"
        continue
    fi
    expect=$(newest_step)
    broken=$(for d in "$ck"/step-*; do [ ! -d "$d" ] || whole "$d" || echo "${d##*/}"; done)
    if [ -n "$broken" ]; then # a save or a prune cut short must never leave a step directory half there
        lost=$((lost + 1))
        echo "FAIL: trial $trial: not whole after the kill: $broken"
        continue
    fi
    echo "trial $trial: killed after step $expect was saved$in_save"
    clean=$((clean + 1))
done
# the last checkpoint continues to the end
unset LD_PRELOAD
trains "the run continues from step $expect to its end" "^step +$((expect + 2)) " --steps $((expect + 2)) \
    --checkpoint-dir "$ck" --resume --eval-interval 0
report "kill -9 during saves ($inside_save of $trials inside a save)" "$trials" "$clean" "$crashes" "$hangs" "$lost"
[ $((crashes + hangs + lost)) -eq 0 ] || failures=$((failures + 1))
finish fault_kill_during_save
