#!/usr/bin/env bash
# profile_train_gpu.sh [--steps N] [--out DIR] [--data DIR] [moe-train flags...] — where a training step's GPU time
# goes, for docs/BENCHMARKS.md: every kernel of step N (default 3; the steps before it warm up) of
# bench_train_gpu.sh's model (2 layers unless --layers is given) timed by Nsight Compute (ncu, gpu__time_duration
# of each launch; clocks and caches left alone), summed by kernel. ncu runs the launches one at a time, so the sum
# is the kernels' own time, without the gaps between them. First, for comparison, 6 steps without ncu with each
# --attention.
# Writes DIR/kernels.csv (ncu's rows) and DIR/profile.txt (the tables); prints the tables. Exit 77 without a GPU
# or without ncu.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/flag_value.sh"
build="${MOE_BUILD_DIR:-$root/build}"
steps=3 out="" data="$root/data"
while [ $# -gt 0 ]; do
    case $1 in
    --steps) moe_flag_value profile_train_gpu "$@"; steps=$2; shift 2 ;;
    --out) moe_flag_value profile_train_gpu "$@"; out=$2; shift 2 ;;
    --data) moe_flag_value profile_train_gpu "$@"; data=$2; shift 2 ;;
    *) break ;;
    esac
done
nvidia-smi -L > /dev/null 2>&1 || { echo "profile_train_gpu: no GPU (nvidia-smi finds none)"; exit 77; }
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2> /dev/null | head -n 1 || true)
[ -n "$ncu" ] || { echo "profile_train_gpu: no Nsight Compute (ncu) on PATH"; exit 77; }
out=${out:-$build/profile_train_gpu}
mkdir -p "$out" && out=$(cd "$out" && pwd)
data=$(cd "$data" && pwd)
# ncu adds milliseconds to each launch: 2 layers unless given
source "$root/bench/train_gpu_model.sh"
train_gpu_model_flags 1.2b 2 "$data/kjv_train.bin" "$data/kjv_val.bin" --eval-interval 0 --sample-tokens 0 --warmup 2 "$@"

source "$root/scripts/mpi_env.sh"
run=(mpirun -np 1 --bind-to none)
for attention in fused materialized; do
    echo "== without ncu: 6 steps, --attention $attention"
    "${run[@]}" "$build/moe-train" --device cuda --steps 6 --attention $attention "${flags[@]}" < /dev/null 2>&1 |
        grep -E "^(world|step|GPU memory)" || true
done
# step 1 allocates and warms cuBLAS up: the profiled step is the last (MOE_PROFILE_STEPS, train/device.h)
echo "== ncu: step $steps's kernels"
MOE_PROFILE_STEPS=$steps "${run[@]}" -x MOE_PROFILE_STEPS "$ncu" --profile-from-start off --clock-control none \
    --cache-control none --metrics gpu__time_duration.sum --csv --print-units base --print-kernel-base function \
    --log-file "$out/kernels.csv" "$build/moe-train" --device cuda --steps "$steps" "${flags[@]}" < /dev/null \
    > "$out/run.log" 2>&1 || { tail -n 30 "$out/run.log"; echo "profile_train_gpu: the profiled run failed" >&2; exit 1; }
python3 - "$out/kernels.csv" "$steps" <<'PY' | tee "$out/profile.txt"
import csv, collections, sys
rows = [r for r in csv.DictReader(l for l in open(sys.argv[1]) if l.startswith('"'))
        if r.get("Metric Name") == "gpu__time_duration.sum"]
steps = int(sys.argv[2])
by_kernel = collections.defaultdict(lambda: [0, 0.0])
for r in rows:
    k = by_kernel[r["Kernel Name"]]
    k[0] += 1
    k[1] += float(r["Metric Value"].replace(",", "")) * 1e-6  # ns -> ms
total = sum(v[1] for v in by_kernel.values())
print("step %d: %d launches, %.1f ms of kernels (ncu runs them one at a time: the gaps between them are not counted)"
      % (steps, len(rows), total))
print("%-60s %7s %10s %6s" % ("kernel", "calls", "ms", "share"))
for name, (calls, ms) in sorted(by_kernel.items(), key=lambda kv: -kv[1][1])[:40]:
    print("%-60s %7d %10.2f %5.1f%%" % (name[:60], calls, ms, 100 * ms / total))
PY
