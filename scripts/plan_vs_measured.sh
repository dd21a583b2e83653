#!/bin/bash
# plan_vs_measured.sh [BUILD_DIR] — moe-plan's predicted step time of moe-train's default model (4 layers, d 128,
# 8 experts top-2, batch 16 x 128 tokens, fp32, ep = ranks) at 1, 2 and 4 ranks against the measured one, on this
# machine. The planner gets only rates measured here, never moe-train's own times:
#   GEMM rate and non-GEMM overhead: bench_moe_layer at the model's expert shape and tokens per rank, with each
#     rank's threads (its GEMM floor's GFLOP/s; its layer time over that floor, minus 1); W ranks on C < W cores
#     get C/W of that rate each (they take turns on the cores);
#   latency and bandwidth of an exchange: bench_alltoall on W ranks, rows of d floats: the latency is the time
#     at 4 KiB, the bandwidth the bytes sent to peers at 4 MiB over the time above that latency;
#   memory bandwidth (the optimizer step): numpy copying 64 MiB (read + write), best of 5.
# Then the all-to-all alone: the planner's time for one exchange of the model's size against bench_alltoall's.
# Prints one table. Runs ~1 minute on 2 cores; results: docs/SCALING.md.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
source scripts/mpi_env.sh
cores=$(getconf _NPROCESSORS_ONLN) # not nproc: it answers OMP_NUM_THREADS, which mpi_env.sh sets to 1
py=/usr/bin/python3
[ -f data/kjv_train.bin ] || scripts/prepare_data.sh >/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
jsonval() { "$py" -c 'import json,sys; d=json.loads(sys.argv[1])
for k in sys.argv[2].split("."): d=d[k]
print(d)' "$1" "$2"; }

mem_bw=$("$py" -c 'import numpy as np, time
a = np.ones(16 << 20, dtype=np.float32); b = np.empty_like(a); best = 1e9
for _ in range(5):
    t = time.perf_counter(); np.copyto(b, a); best = min(best, time.perf_counter() - t)
print(2 * a.nbytes / best / 1e9)')

batch=16 seq=128 d=128 k=2
printf "machine: %s, %d CPUs; %s\n" "$(lscpu | sed -n 's/^Model name: *//p')" "$cores" "$(date -u +%F)"
printf "memory bandwidth (numpy copy): %.1f GB/s\n" "$mem_bw"
printf "%5s %7s %10s %9s %9s %9s | %11s %11s %11s %11s | %11s %7s | %11s %11s\n" ranks threads "GEMM GF/s" \
    overhead "lat us" "bw GB/s" "compute ms" "a2a ms" "allred ms" "pred ms" "measured ms" "error" "a2a pred us" \
    "a2a meas us"
for W in 1 2 4; do
    threads=$(( cores / W > 0 ? cores / W : 1 ))
    tokens=$(( batch * seq / W ))
    layer=$("$build/bench/bench_moe_layer" --tokens $tokens --d-model $d --d-ff 256 --experts 8 --top-k $k \
        --threads $threads --warmup 1 --iters 5 | sed -n 's/^json: //p')
    gflops=$("$py" -c "import json,sys; d=json.loads(sys.argv[1]); print(d['gemm_gflops'] * min(1, $cores / $W))" "$layer")
    overhead=$("$py" -c "import json,sys; print(max(0, json.loads(sys.argv[1])['ratio']['total'] - 1))" "$layer")
    lat_us=1 bw=1 a2a_bytes=$(( tokens * k * d * 4 )) a2a_meas=0
    if [ $W -gt 1 ]; then
        mpirun -np $W "$build/bench/bench_alltoall" --min-bytes 4K --max-bytes 4M --row-bytes $((d * 4)) \
            --pattern uniform --warmup 3 --iters 10 | sed -n 's/^json: //p' > "$tmp/a2a$W"
        read -r lat_us bw a2a_meas < <("$py" - "$tmp/a2a$W" $W $a2a_bytes <<'PY'
import json, sys
rows = {r["size_bytes"]: r for r in map(json.loads, open(sys.argv[1]))}
W, size = int(sys.argv[2]), int(sys.argv[3])
lat = rows[min(rows)]["moe_us"]
big = rows[max(rows)]
bw = big["size_bytes"] * (W - 1) / W / ((big["moe_us"] - lat) * 1e-6) / 1e9
near = min(rows, key=lambda s: abs(s - size))  # the bench's size nearest the model's exchange
print(lat, bw, rows[near]["moe_us"] * size / near)
PY
)
    fi
    plan=$("$build/moe-plan" --precision fp32 --gpus-per-node $W --nodes 1 --ep $W --micro-batch $((batch / W)) \
        --global-batch $batch --seq-len $seq --gpu-flops "$(echo "$gflops / 1000" | bc -l)" --gemm-efficiency 1 \
        --non-gemm-overhead "$overhead" --gpu-memory 20 --mem-bw "$mem_bw" --intra-bw "$bw" --intra-latency "$lat_us" \
        --workspace-gib 0 --json)
    mpirun --bind-to none -np $W "$build/moe-train" --ep $W --steps 10 --warmup 0 --threads $threads \
        --sample-tokens 0 --eval-interval 0 --eval-batches 1 --log-file "$tmp/train$W.jsonl" >/dev/null
    "$py" - "$plan" "$tmp/train$W.jsonl" $W $threads "$gflops" "$overhead" "$lat_us" "$bw" $a2a_bytes "$a2a_meas" <<'PY'
import json, statistics, sys
plan = json.loads(sys.argv[1])["prediction"]["seconds"]
ms = statistics.median([r["ms"] for r in map(json.loads, open(sys.argv[2])) if "step" in r][3:])  # steps 4-10
W, threads, gf, ov, lat, bw, size, a2a_meas = sys.argv[3:]
pred = plan["step_serial"] * 1e3
a2a_pred = (float(lat) + float(size) * (int(W) - 1) / int(W) / (float(bw) * 1e9) * 1e6) if int(W) > 1 else 0
print("%5s %7s %10.1f %9.3f %9.1f %9.2f | %11.2f %11.2f %11.2f %11.2f | %11.2f %+6.0f%% | %11.0f %11.0f" % (
    W, threads, float(gf), float(ov), float(lat) if int(W) > 1 else 0, float(bw) if int(W) > 1 else 0,
    plan["compute"] * 1e3, plan["alltoall"] * 1e3, plan["allreduce"] * 1e3, pred, ms, 100 * (pred / ms - 1),
    a2a_pred, float(a2a_meas)))
PY
done
