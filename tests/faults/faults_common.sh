# faults_common.sh — sourced by the faults suite's scripts (arguments MPIRUN MOE_TRAIN TEXT_TO_TOKENS
# EXPECT_FAILURE): the small 2-rank run of the command-line tests, plus jobs started in the background in a
# session of their own, so that a test can hurt them (kill, stop) and then account for every process.
. "$(dirname "$0")/../train_cli_common.sh"

# launch FLAGS...: starts mpirun -np $ranks (default 2) moe-train (the small run's flags, FLAGS replacing theirs)
# in a new session, under the variables of the array launch_env (VAR=VALUE words; none by default) if set; $job is
# the session id, the output goes to $dir/job.txt.
launch() {
    merge "$@"
    # emptied here, not only by the background job's own redirection: that runs when the forked shell gets the CPU,
    # and under load a test that looked at once found the previous job's lines in it (a "step 20" of the last job:
    # the signal then reached ranks still starting, SIGINT ignored as in every background job, and the job trained on)
    : > "$dir/job.txt"
    env ${launch_env[@]+"${launch_env[@]}"} setsid "$mpirun" -np "${ranks:-2}" "$train" "${merged[@]}" \
        > "$dir/job.txt" 2>&1 &
    job=$!
}

# The rank processes of the job (world rank order is not known: sorted by pid).
job_ranks() { pgrep -s "$job" -x "$(basename "$train")" | sort -n; }

# wait_for_ranks N LIMIT_S: until the job has N rank processes (0: none started within the limit).
wait_for_ranks() {
    local n=$1 limit=$2 i
    for ((i = 0; i < limit * 10; i++)); do
        [ "$(job_ranks | wc -l)" -ge "$n" ] && return 0
        sleep 0.1
    done
    return 1
}

# wait_for_step N LIMIT_S: until the job's output has step N's line (1: not within LIMIT_S seconds of wall time).
# Limits are generous: under scripts/test.sh these jobs share 2 cores with three other lanes of tests, and a
# sanitized job then took over 30 s to start and train 20 steps.
wait_for_step() {
    local step start=$SECONDS
    step=$(printf 'step %5d ' "$1")
    until grep -q "^$step" "$dir/job.txt" 2>/dev/null; do
        [ $((SECONDS - start)) -lt "$2" ] || return 1
        sleep 0.1
    done
}

# wait_job LIMIT_S: waits for mpirun to end; $job_rc is its status, $job_s the seconds it took. Past the limit
# the session is killed and it returns 1 (a hang).
wait_job() {
    local limit=$1 start=$SECONDS
    while kill -0 "$job" 2>/dev/null; do
        if [ $((SECONDS - start)) -ge "$limit" ]; then
            # what each process was doing, for fail_job, before they go
            ps -o pid,stat,wchan:24,etime,args -s "$job" > "$dir/hang.txt" 2>&1
            kill -9 -- -"$job" 2>/dev/null
            wait "$job" 2>/dev/null
            job_rc=124 job_s=$((SECONDS - start))
            return 1
        fi
        sleep 0.1
    done
    wait "$job"
    job_rc=$? job_s=$((SECONDS - start))
    # under scripts/sanitize.sh: a report in the job's output is a failure, whatever else the test checks
    if grep -Eq '(ERROR|SUMMARY): (Address|Leak|UndefinedBehavior)Sanitizer|: runtime error: ' "$dir/job.txt"; then
        cat "$dir/job.txt"
        echo "FAIL: a sanitizer report in the job's output (above)"
        failures=$((failures + 1))
    fi
    return 0
}

# fail_job WHAT: counts a failure and shows the background job's output (its last lines) and, after a hang, what its
# processes were doing when wait_job gave up (fail_with_output shows the last foreground run's instead)
fail_job() {
    echo "FAIL: $1; the job's output ends:"
    tail -n 15 "$dir/job.txt" 2>/dev/null
    if [ -s "$dir/hang.txt" ]; then
        echo "its processes when it was stopped:"
        cat "$dir/hang.txt"
        rm -f "$dir/hang.txt"
    fi
    failures=$((failures + 1))
}

# leftovers: the processes of the job's session still alive after a few seconds' grace (ranks that mpirun
# killed take a moment to go; zombies, ended and waiting for init to reap them, do not count).
leftovers() {
    local i left
    for ((i = 0; i < 30; i++)); do
        left=$(ps -o pid=,stat= -s "$job" | awk '$2 !~ /^Z/ { print $1 }')
        [ -z "$left" ] && return 0
        sleep 0.2
    done
    echo "$left" | tr '\n' ' '
    kill -9 -- -"$job" 2>/dev/null
    return 1
}

# report NAME TRIED CLEAN CRASHES HANGS LOST: the line docs/RELIABILITY.md's table takes its numbers from.
report() {
    echo "faults: $1: tried $2, clean errors $3, crashes $4, hangs $5, checkpoints lost $6"
}
