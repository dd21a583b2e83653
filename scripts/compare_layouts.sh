#!/usr/bin/env bash
# compare_layouts.sh [STEPS] [extra moe-train flags] — trains the same model on the same global batches
# twice on 2 ranks, with ep = 1 (experts replicated, data parallel) and ep = 2 (experts sharded), and
# prints both loss curves side by side: how many steps are bitwise identical (the metrics file keeps 17
# significant digits) and the largest relative difference.
set -euo pipefail
export LC_ALL=C.UTF-8 # a decimal point in awk and printf whatever the user's locale (de_DE's comma broke them)
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${MOE_BUILD_DIR:-$root/build}"
steps="${1:-100}"
shift || true
source "$root/scripts/mpi_env.sh"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
for ep in 1 2; do
    mpirun -np 2 "$build/moe-train" --train-data "$root/data/kjv_train.bin" --val-data "$root/data/kjv_val.bin" \
        --steps "$steps" --eval-interval 0 --sample-tokens 0 --ep "$ep" --log-file "$out/ep$ep.jsonl" "$@" > "$out/ep$ep.txt"
done
# the step records (the files open with a run record)
paste -d' ' <(grep '^{"step"' "$out/ep1.jsonl" | sed -E 's/.*"step":([0-9]+),"loss":([0-9.]+).*/\1 \2/') \
            <(grep '^{"step"' "$out/ep2.jsonl" | sed -E 's/.*"loss":([0-9.]+).*/\1/') |
    awk '{ same += ($2 == $3); d = $2 - $3; if (d < 0) d = -d; r = d / $2; if (r > max) { max = r; at = $1 }
           if ($1 <= 5 || $1 % 10 == 0) printf "step %4d  ep=1 %s  ep=2 %s  rel diff %.1e\n", $1, $2, $3, r }
         END { printf "%d of %d steps bitwise identical; largest relative difference %.2e", same, NR, max
               if (max > 0) printf " (step %d)", at; printf "\n" }'
