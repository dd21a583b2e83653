#!/usr/bin/env bash
# bench_pipeline.sh [flags] [-- moe-train flags...] — the pipeline's bubble on the CPU (issue 27, docs/BENCHMARKS.md
# "Pipeline parallelism (--pp)"): moe-train's step time at --pp 1 on one rank against --pp P on P ranks, and per
# stage the time it waits against the time it works, beside the 1F1B bubble (P - 1) / m.
#
# For each round, each m of --micro-batches and each configuration (--pp 1 on one rank at each --baseline-threads,
# then --pp P on P ranks for each P of --pp, their threads moe-train's default: the rank's core), one run of
#   mpirun [--bind-to none] -np R moe-train --pp P --micro-batches m --batch B --steps N --eval-interval 0 --eval-batches 1
#                          --sample-tokens 0 --log-file LOG [--threads T] [moe-train flags...]
# (--bind-to none and --threads T for a baseline of T > 1 threads: Open MPI binds a lone rank to one core)
# (moe-train's default model, 4 layers, unless the flags after `--` change it) and one JSON line:
#   step_ms      {"median", "min"} over steps 2..N of the metrics log's "ms" (the whole step: the schedule, the
#                gradient sums and the optimizer; the first step, with its allocations, left out)
#   stages       per stage, from moe-train's "pipeline:" line (steps 2..N, the schedule alone):
#                step_ms, wait_ms (blocked in a receive or a send), work_ms = step_ms - wait_ms,
#                wait_of_work = wait_ms / work_ms; [] at --pp 1
#   bubble       (P - 1) / m, what 1F1B's idle time over work would be with equal stages and free messages
#   loss_last    step N's loss (the same for every P and thread count of one m: --pp is bitwise --pp 1)
#   load1, start /proc/loadavg's one-minute load before the run (others' work shows here), and the start (UTC)
# Rounds run every configuration once before the next round starts (interleaved), so that a drift of the machine
# shows as a difference between rounds rather than between configurations.
#
# Needs the build (MOE_BUILD_DIR, default the checkout's build/) and the token files (data/, scripts/prepare_data.sh;
# passed by absolute path unless --train-data/--val-data follow `--`). Runs under scripts/mpi_env.sh; more ranks than
# cores are oversubscribed (then the waits mix the bubble with time-sharing).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${MOE_BUILD_DIR:-$root/build}"
me=bench_pipeline

# The flag table: name, value kind, default, help. --help prints it, --dry-run resolves it (bench/test_bench_flags.sh).
flag_table=(
    "pp|LIST|2,4|pipeline stages of the pipelined runs, each on as many ranks, comma-separated [2, 64]"
    "micro-batches|LIST|4,8,16|micro-batches per step, comma-separated [1, 1024]"
    "batch|N|8|sequences per micro-batch (moe-train's --batch) [1, 4096]"
    "steps|N|15|optimizer steps per run; steps 2..N are timed [3, 100000]"
    "baseline-threads|LIST|1,2|--threads of the one-rank --pp 1 runs (above 1: not bound to a core), comma-separated [1, 1024]"
    "rounds|N|1|interleaved rounds of every configuration [1, 100]"
    "timeout|N|900|seconds before one run is killed [1, 86400]"
)
declare -A value=() kind=() lo=() hi=()
for row in "${flag_table[@]}"; do
    IFS='|' read -r name k default help <<<"$row"
    value[$name]=$default kind[$name]=$k
    range=${help##*[}; range=${range%]}
    lo[$name]=${range%%, *} hi[$name]=${range##*, }
done

usage() {
    echo "usage: $me [flags] [-- moe-train flags...]"
    echo "  moe-train's step time at --pp 1 (one rank) and --pp P (P ranks), and each stage's waiting against working"
    echo "flags (--name value or --name=value):"
    for row in "${flag_table[@]}"; do
        IFS='|' read -r name k default help <<<"$row"
        printf '  %-22s  %s (default %s)\n' "--$name $k" "$help" "$default"
    done
    printf '  %-22s  %s\n' "--dry-run" "parse and check every flag, print them resolved, exit 0 before any work"
    printf '  %-22s  %s\n' "--help, -h" "print this text and exit 0"
    echo "one JSON line per run on stdout; MOE_BUILD_DIR chooses the build (default: the checkout's build/)"
}
bad() { # a usage error: exit 2
    echo "$me: $*" >&2
    usage >&2
    exit 2
}
# check NAME VALUE: VALUE an integer in the flag's range, or (LIST) a comma-separated list of them
check() {
    local name=$1 v=$2 item
    local pattern='^[0-9]+$'
    [ "${kind[$name]}" = LIST ] && pattern='^[0-9]+(,[0-9]+)*$'
    [[ $v =~ $pattern ]] || bad "--$name $v: want ${kind[$name]} in [${lo[$name]}, ${hi[$name]}]"
    for item in ${v//,/ }; do
        if [ $((10#$item)) -lt "${lo[$name]}" ] || [ $((10#$item)) -gt "${hi[$name]}" ]; then
            bad "--$name $v: $item is outside [${lo[$name]}, ${hi[$name]}]"
        fi
    done
}

dry_run=0 extra=()
while [ $# -gt 0 ]; do
    arg=$1
    shift
    case $arg in
    --help | -h) usage; exit 0 ;;
    --dry-run) dry_run=1 ;;
    --) extra=("$@"); break ;;
    --*=*) name=${arg%%=*} name=${name#--} v=${arg#*=} ;;
    --*) name=${arg#--}
         [ -n "${kind[$name]:-}" ] || bad "unknown flag: --$name"
         [ $# -gt 0 ] || bad "--$name needs a value"
         v=$1; shift ;;
    *) bad "unexpected argument: $arg" ;;
    esac
    case $arg in --help | -h | --dry-run) continue ;; esac
    [ -n "${kind[$name]:-}" ] || bad "unknown flag: --$name"
    check "$name" "$v"
    value[$name]=$v
done
resolved=""
for row in "${flag_table[@]}"; do
    name=${row%%|*}
    resolved+=" --$name ${value[$name]}"
done
if [ "$dry_run" -eq 1 ]; then
    echo "$me: dry run: every flag parsed and checked, nothing measured"
    echo "resolved:$resolved${extra[*]:+ -- ${extra[*]}}"
    exit 0
fi

[ -x "$build/moe-train" ] || { echo "$me: no $build/moe-train (build first, or set MOE_BUILD_DIR)" >&2; exit 1; }
data=()
[[ " ${extra[*]:-} " == *" --train-data "* ]] || data+=(--train-data "$root/data/kjv_train.bin")
[[ " ${extra[*]:-} " == *" --val-data "* ]] || data+=(--val-data "$root/data/kjv_val.bin")
# shellcheck source=../scripts/mpi_env.sh
source "$root/scripts/mpi_env.sh"
source "$root/scripts/bounded.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# run_one ROUND RANKS PP M THREADS: one moe-train run, its JSON line on stdout
run_one() {
    local round=$1 ranks=$2 pp=$3 m=$4 threads=$5 load1 start bind=()
    local flags=(--pp "$pp" --micro-batches "$m" --batch "${value[batch]}" --steps "${value[steps]}"
                 --eval-interval 0 --eval-batches 1 --sample-tokens 0 --log-file "$work/metrics.jsonl" "${data[@]}")
    # mpirun binds each rank to a core (-np <= 2): a rank of several threads is let loose on the machine instead
    [ "$threads" -eq 0 ] || flags+=(--threads "$threads")
    [ "$threads" -le 1 ] || bind=(--bind-to none)
    read -r load1 _ </proc/loadavg
    start=$(date -u +%H:%M:%S)
    rm -f "$work/metrics.jsonl"
    if ! moe_bounded "${value[timeout]}" mpirun "${bind[@]}" -np "$ranks" "$build/moe-train" "${flags[@]}" "${extra[@]}" \
            >"$work/out" 2>&1 </dev/null; then
        tail -n 20 "$work/out" >&2
        echo "$me: moe-train failed: mpirun -np $ranks moe-train ${flags[*]} ${extra[*]:-}" >&2
        exit 1
    fi
    python3 - "$work/out" "$work/metrics.jsonl" "$round" "$ranks" "$pp" "$m" "$threads" "$load1" "$start" <<'PY'
import json, re, statistics, sys
out, log, round_, ranks, pp, m, threads, load1, start = sys.argv[1:]
ranks, pp, m = int(ranks), int(pp), int(m)
text = open(out).read()
steps = [r for r in map(json.loads, open(log)) if "step" in r and r.get("record") is None]
timed = [r["ms"] for r in steps[1:]]
used = re.search(r"^world \d+ ranks x (\d+) threads", text, re.M)
stages = []
line = re.search(r"^pipeline: .*$", text, re.M)
if pp > 1:
    if not line:
        sys.exit("bench_pipeline: no \"pipeline:\" line in moe-train's output")
    for s, step, wait, work in re.findall(
            r"stage (\d+) ([\d.]+) ms, waiting ([\d.]+) ms \([\d.]+% of its ([\d.-]+) ms of work\)", line.group(0)):
        stages.append({"stage": int(s), "step_ms": float(step), "wait_ms": float(wait), "work_ms": float(work),
                       "wait_of_work": round(float(wait) / float(work), 4) if float(work) > 0 else None})
    if len(stages) != pp:
        sys.exit("bench_pipeline: %d stages in the \"pipeline:\" line, want %d" % (len(stages), pp))
print(json.dumps({
    "round": int(round_), "ranks": ranks, "pp": pp, "micro_batches": m,
    "threads_per_rank": int(used.group(1)) if used else None, "steps": len(steps),
    "step_ms": {"median": round(statistics.median(timed), 2), "min": round(min(timed), 2)},
    "stages": stages, "bubble": round((pp - 1) / m, 4),
    "loss_last": steps[-1]["loss"], "load1": float(load1), "start": start}))
PY
}

for ((round = 1; round <= value[rounds]; round++)); do
    for m in ${value[micro-batches]//,/ }; do
        for threads in ${value[baseline-threads]//,/ }; do
            run_one "$round" 1 1 "$m" "$threads"
        done
        for pp in ${value[pp]//,/ }; do
            run_one "$round" "$pp" "$pp" "$m" 0
        done
    done
done
