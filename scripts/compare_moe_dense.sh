#!/usr/bin/env bash
# compare_moe_dense.sh [STEPS] [extra moe-train flags] — trains the default MoE (8 experts, top-2,
# d_ff 256 each) and a dense baseline with the same active parameters (d_ff 512) on the same data and
# schedule on 2 ranks, and prints their validation losses and speed side by side.
set -euo pipefail
export LC_ALL=C.UTF-8 # a decimal point in awk and printf whatever the user's locale (de_DE's comma broke them)
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${MOE_BUILD_DIR:-$root/build}"
steps="${1:-800}"
shift || true
[[ $steps =~ ^[1-9][0-9]*$ ]] || { echo "compare_moe_dense.sh: STEPS must be a positive whole number, not '$steps'" >&2; exit 2; }
source "$root/scripts/mpi_env.sh"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
common=(--train-data "$root/data/kjv_train.bin" --val-data "$root/data/kjv_val.bin" --steps "$steps"
        --warmup $((steps / 8 < 100 ? steps / 8 : 100)) --eval-interval $(((steps + 3) / 4)) --eval-batches 16 \
        --sample-tokens 0 "$@")
mpirun -np 2 "$build/moe-train" "${common[@]}" --experts 8 --top-k 2 --d-ff 256 --log-file "$out/moe.jsonl" > "$out/moe.txt"
mpirun -np 2 "$build/moe-train" "${common[@]}" --experts 1 --top-k 1 --d-ff 512 --log-file "$out/dense.jsonl" > "$out/dense.txt"
echo "| step | val loss, dense (d_ff 512) | val loss, MoE (8 x 256, top-2) |"
echo "|---:|---:|---:|"
paste <(grep -o '"step":[0-9]*,.*"val_loss":[0-9.]*' "$out/dense.jsonl" | sed -E 's/"step":([0-9]+),.*"val_loss":([0-9.]+)/\1 \2/') \
      <(grep -o '"val_loss":[0-9.]*' "$out/moe.jsonl" | sed 's/"val_loss"://') | awk '{printf "| %d | %.4f | %.4f |\n", $1, $2, $3}'
for run in dense moe; do
    awk -v run="$run" -F'"tokens_per_s":' 'NF > 1 { split($2, a, ","); s += a[1]; n++ } END { printf "%s: mean %.0f tokens/s over %d steps\n", run, s / n, n }' "$out/$run.jsonl"
done
