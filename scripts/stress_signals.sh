#!/bin/bash
# stress_signals.sh [BUILD] [N] [TARGET] — the stop-signal path N times (default 25): the default model on 2 ranks
# under mpirun with --checkpoint-dir, SIGTERM to TARGET (mpirun, the default; session: mpirun and every rank, as a
# scheduler sends it) 5 steps plus 0-0.5 s in; reports every run whose output shows a crash (glibc's heap checks, a
# signal, a sanitizer). Issue 49 found "corrupted size vs. prev_size" this way (3 runs in 25 before the fix, 0 in 50
# after: docs/RELIABILITY.md); BUILD may be build-sanitize. Minutes: not part of the test command
# (tests/test_signals_gemm.c checks the cause in a fraction of a second).
set -u
export LC_ALL=C.UTF-8 # a decimal point in awk and printf whatever the user's locale (de_DE's comma broke them)
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/mpi_env.sh"
B=${1:-$root/build}/moe-train N=${2:-25} target=${3:-mpirun}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$root"
crash='corrupted|double free|free\(\)|Segmentation|Aborted|signal (6|11)|malloc|ERROR: .*Sanitizer|runtime error'
flags=(--train-data data/kjv_train.bin --val-data data/kjv_val.bin --steps 100000 --eval-interval 0 --sample-tokens 0
       --checkpoint-dir "$work/ck")
bad=0
for ((i = 0; i < N; i++)); do
    rm -rf "$work/ck"
    : > "$work/out.txt"
    timeout 120 setsid mpirun -np 2 "$B" "${flags[@]}" > "$work/out.txt" 2>&1 &
    job=$!
    for ((w = 0; w < 600; w++)); do grep -q "^step     5 " "$work/out.txt" && break; sleep 0.1; done
    sleep "$(awk -v s=$RANDOM 'BEGIN { srand(s); printf "%.2f", rand() * 0.5 }')"
    mpirun_pid=$(pgrep -P "$job" -x mpirun)
    if [ "$target" = session ]; then pkill -TERM -s "$mpirun_pid"; else kill -TERM "$mpirun_pid"; fi
    rc=0
    wait "$job" || rc=$?
    if grep -aEq "$crash" "$work/out.txt"; then
        bad=$((bad + 1))
        cp "$work/out.txt" "$root/build/stress_signals_$i.txt"
        echo "run $i: exit $rc: $(grep -aE "$crash" "$work/out.txt" | head -n 2 | tr '\n' ' ')"
    fi
done
echo "stress_signals: $N runs, $bad with a crash (their output: build/stress_signals_N.txt)"
