#!/usr/bin/env bash
# bench_tp.sh [ROUNDS [STEPS]] [-- moe-train flags...] — moe-train's step time under tensor parallelism on the CPU
# (issue 28, docs/BENCHMARKS.md "Tensor parallelism (--tp)"): the default model (4 layers, d 128, 4 heads, E 8) on
#   2 ranks: --tp 1 (2 data-parallel ranks), --tp 1 --tp-shards 2, --tp 2 (one tensor group)
#   4 ranks: --tp 1, --tp 2, --tp 4 (oversubscribed on a 2-core machine: time-sharing, not a scaling measurement)
# each ROUNDS times (default 2), interleaved so that a drift of the machine shows between rounds, STEPS steps
# (default 20) of --batch 8, one thread per rank. One line per run: ranks, flags, the median and the minimum of the
# metrics log's "ms" over steps 3..STEPS (the first steps hold allocations), and the last step's loss (the same for
# every run of one --tp-shards: --tp is bitwise --tp 1).
# Needs the build (MOE_BUILD_DIR, default the checkout's build/) and data/kjv_*.bin (scripts/prepare_data.sh).
set -euo pipefail
case "${1:-}" in -h | --help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${MOE_BUILD_DIR:-$root/build}"
rounds=2 steps=20 extra=()
[ $# -gt 0 ] && [ "$1" != -- ] && { rounds=$1; shift; }
[ $# -gt 0 ] && [ "$1" != -- ] && { steps=$1; shift; }
[ "${1:-}" = -- ] && { shift; extra=("$@"); }
[[ $rounds =~ ^[1-9][0-9]*$ && $steps =~ ^[0-9]+$ && $steps -ge 4 ]] ||
    { echo "bench_tp.sh: ROUNDS >= 1 and STEPS >= 4, got '$rounds' '$steps'" >&2; exit 2; }
[ -x "$build/moe-train" ] || { echo "bench_tp.sh: no $build/moe-train (build first)" >&2; exit 1; }
source "$root/scripts/mpi_env.sh"
source "$root/scripts/bounded.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

runs=("2 --tp 1" "2 --tp 1 --tp-shards 2" "2 --tp 2" "4 --tp 1" "4 --tp 2" "4 --tp 4")
for ((r = 1; r <= rounds; r++)); do
    for run in "${runs[@]}"; do
        read -r ranks flags <<<"$run"
        rm -f "$work/m.jsonl"
        # shellcheck disable=SC2086
        if ! moe_bounded 900 mpirun -np "$ranks" "$build/moe-train" $flags --threads 1 --batch 8 --steps "$steps" \
                --eval-interval 0 --eval-batches 1 --sample-tokens 0 --log-file "$work/m.jsonl" \
                --train-data "$root/data/kjv_train.bin" --val-data "$root/data/kjv_val.bin" "${extra[@]}" \
                >"$work/out" 2>&1 </dev/null; then
            tail -n 20 "$work/out" >&2
            echo "bench_tp.sh: moe-train failed: -np $ranks $flags" >&2
            exit 1
        fi
        python3 - "$work/m.jsonl" "$r" "$ranks" "$flags" <<'PY'
import json, statistics, sys
log, rnd, ranks, flags = sys.argv[1:]
rows = [json.loads(l) for l in open(log) if l.startswith('{"step"')]
ms = [x["ms"] for x in rows if x["step"] >= 3]
print(f"round {rnd}: {ranks} ranks {flags:<22} step ms median {statistics.median(ms):7.1f} min {min(ms):7.1f}"
      f"  loss@{rows[-1]['step']} {rows[-1]['loss']:.17g}")
PY
    done
done
