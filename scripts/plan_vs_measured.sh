#!/bin/bash
# plan_vs_measured.sh [BUILD_DIR] [REPEATS] — moe-plan's predicted step time of moe-train's default model (4 layers,
# d 128, 8 experts top-2, batch 16 x 128 tokens, fp32, ep = ranks) at 1, 2 and 4 ranks against the measured one, on
# this machine; and of the same model with one expert (no MoE layer: the dense path and the optimizer alone) at 1
# rank, which checks bench_model_dense by itself. The planner gets only rates that bench/ measures here, never
# moe-train's own times:
#   dense path and optimizer: bench_model_dense at the model's shape and sequences per rank, with each rank's
#     threads: --dense-us-per-token (forward + backward of all but the MoE layers) and --optimizer-ns-per-param;
#   MoE layers: bench_moe_layer at the model's expert shape and tokens per rank: its GEMM floor's GFLOP/s
#     (--gpu-flops, --gemm-efficiency 1) and its layer time over that floor, minus 1 (--non-gemm-overhead);
#   W ranks on C < W cores take turns: each gets C/W of the GEMM rate, and W/C of the measured times;
#   latency and bandwidth of an exchange: bench_alltoall on W ranks, rows of d floats: the latency is the time
#     at 4 KiB, the bandwidth the bytes sent to peers at 4 MiB over the time above that latency.
# The shared VM's cores make every input move between runs, so each configuration runs its benches just before
# and just after its moe-train run and the planner gets the mean of the two (the drift column: how far apart they
# were, the largest over the dense time and the GEMM rate). Two predictions per row: from the benches' medians
# against moe-train's median step (steps 4-10), and from their minima against its fastest step (what each would
# take on a quiet machine). The whole comparison runs REPEATS times (default 3), one table each, then the errors per
# configuration and their median. Also the all-to-all alone: the planner's time for one exchange of the model's
# size against bench_alltoall's; and a diagnostic that feeds nothing: the routing skew of the moe-train run (the
# busiest EP rank's rows over the mean; the planner assumes 1). ~30 s per repetition on 2 idle cores; results:
# docs/SCALING.md.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
repeats=${2:-3}
source scripts/mpi_env.sh
cores=$(getconf _NPROCESSORS_ONLN) # not nproc: it answers OMP_NUM_THREADS, which mpi_env.sh sets to 1
py=/usr/bin/python3
[ -f data/kjv_train.bin ] || scripts/prepare_data.sh >/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
batch=16 seq=128 d=128 k=2

# bench_pair W THREADS EXPERTS TAG: one measurement of the dense path (and, with experts > 1, the MoE layer) into
# $tmp/TAG.dense and $tmp/TAG.layer
bench_pair() {
    local W=$1 threads=$2 experts=$3 tag=$4
    "$build/bench/bench_model_dense" --batch $((batch / W)) --seq-len $seq --experts "$experts" --threads "$threads" \
        --warmup 2 --iters 7 | sed -n 's/^json: //p' > "$tmp/$tag.dense"
    if [ "$experts" -gt 1 ]; then
        "$build/bench/bench_moe_layer" --tokens $((batch * seq / W)) --d-model $d --d-ff 256 --experts "$experts" \
            --top-k $k --threads "$threads" --warmup 1 --iters 5 | sed -n 's/^json: //p' > "$tmp/$tag.layer"
    else
        echo '{}' > "$tmp/$tag.layer"
    fi
}

# measure RUN W EXPERTS: benches, moe-train, benches again; prints one table row
measure() {
    local run=$1 W=$2 experts=$3
    local threads=$(( cores / W > 0 ? cores / W : 1 )) tokens=$(( batch * seq / W ))
    local top=$(( experts > 1 ? k : 1 )) lat_us=1 bw=1 a2a_bytes=$(( tokens * k * d * 4 )) a2a_meas=0
    bench_pair "$W" "$threads" "$experts" before
    if [ "$W" -gt 1 ]; then
        mpirun -np "$W" "$build/bench/bench_alltoall" --min-bytes 4K --max-bytes 4M --row-bytes $((d * 4)) \
            --pattern uniform --warmup 3 --iters 10 | sed -n 's/^json: //p' > "$tmp/a2a"
        read -r lat_us bw a2a_meas < <("$py" - "$tmp/a2a" "$W" $a2a_bytes <<'PY'
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
    mpirun --bind-to none -np "$W" "$build/moe-train" --ep "$W" --experts "$experts" --top-k $top --steps 10 --warmup 0 \
        --threads "$threads" --sample-tokens 0 --eval-interval 0 --eval-batches 1 --log-file "$tmp/train.jsonl" >/dev/null
    bench_pair "$W" "$threads" "$experts" after
    # the planner's inputs: the mean of before and after, with the turn-taking of W ranks on fewer cores; from the
    # benches' medians, and (the "quiet" prediction) from their minima
    local inputs
    inputs=$("$py" - "$tmp" "$W" "$cores" <<'PY'
import json, sys
tmp, W, cores = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
share = min(1.0, cores / W)  # each rank's share of the cores
load = lambda tag, kind: json.load(open(f"{tmp}/{tag}.{kind}"))
db, da, lb, la = load("before", "dense"), load("after", "dense"), load("before", "layer"), load("after", "layer")
mean = lambda a, b: (a + b) / 2
drift = lambda a, b: abs(a - b) / mean(a, b)
moved = drift(db["dense_us_per_token"], da["dense_us_per_token"])
for stat in "median", "min":
    per_token = lambda j: j["dense_ms"][stat] * 1e3 / j["tokens"]
    per_param = lambda j: j["optimizer_ms"][stat] * 1e6 / j["params"]
    us, ns = mean(per_token(db), per_token(da)) / share, mean(per_param(db), per_param(da)) / share
    if lb:  # the layer's time over its GEMM floor, minus 1
        over = lambda j: max(0, j["total_ms"][stat] / j["floor_ms"]["total"] - 1)
        gf, ov = mean(lb["gemm_gflops"], la["gemm_gflops"]) * share, mean(over(lb), over(la))
        moved = max(moved, drift(lb["gemm_gflops"], la["gemm_gflops"]))
    else:  # no MoE layer: the GEMM rate prices nothing; any positive value will do
        gf, ov = 1.0, 0.0
    print(gf, ov, us, ns, end=" ")
print(moved)
PY
)
    local gflops overhead us ns gflops_min overhead_min us_min ns_min drift
    read -r gflops overhead us ns gflops_min overhead_min us_min ns_min drift <<<"$inputs"
    # plan GFLOPS OVERHEAD US NS: moe-plan's JSON for these rates
    plan() {
        "$build/moe-plan" --precision fp32 --experts "$experts" --top-k $top --gpus-per-node "$W" --nodes 1 \
            --ep "$W" --micro-batch $((batch / W)) --global-batch $batch --seq-len $seq \
            --gpu-flops "$("$py" -c "print($1 / 1000)")" --gemm-efficiency 1 --non-gemm-overhead "$2" \
            --dense-us-per-token "$3" --optimizer-ns-per-param "$4" --gpu-memory 20 --intra-bw "$bw" \
            --intra-latency "$lat_us" --workspace-gib 0 --json
    }
    "$py" - "$(plan "$gflops" "$overhead" "$us" "$ns")" "$(plan "$gflops_min" "$overhead_min" "$us_min" "$ns_min")" \
        "$tmp/train.jsonl" "$run" "$W" "$experts" "$threads" "$gflops" "$overhead" "$us" "$ns" "$lat_us" "$bw" \
        "$drift" $a2a_bytes "$a2a_meas" <<'PY'
import json, statistics, sys
plan, quiet = (json.loads(a)["prediction"]["seconds"] for a in sys.argv[1:3])
records = [r for r in map(json.loads, open(sys.argv[3])) if "step" in r][3:]  # steps 4-10
steps = [r["ms"] for r in records]
run, W, E, threads = (int(x) for x in sys.argv[4:8])
gf, ov, us, ns, lat, bw, drift, size, a2a_meas = (float(x) for x in sys.argv[8:])
pred, ms = plan["step_serial"] * 1e3, statistics.median(steps)
pred_min, ms_min = quiet["step_serial"] * 1e3, min(steps)
comm = (plan["alltoall"] + plan["control"] + plan["allreduce"]) * 1e3
a2a_pred = lat + size * (W - 1) / W / (bw * 1e9) * 1e6 if W > 1 else 0
# routing skew, a diagnostic only (the planner assumes balanced routing): the rows of the EP rank whose experts got
# the most, over the mean, per MoE layer and step of moe-train's log, averaged
skews = [max(sum(l["tokens"][p * E // W:(p + 1) * E // W]) for p in range(W)) / (sum(l["tokens"]) / W)
         for r in records for l in r["expert_tokens"]]
skew = statistics.mean(skews) if skews else 1
label = "%d" % W if E > 1 else "1 E1"
print("%3d %5s %3d | %7.1f %5.2f %7.2f %5.2f %6.1f %6.2f %5.0f%% | %7.2f %7.2f %6.2f %6.2f %7.2f | %7.2f %+5.0f%% |"
      " %7.2f %7.2f %+5.0f%% | %5.0f %5.0f | %4.2f"
      % (run, label, threads, gf if E > 1 else 0, ov, us, ns, lat if W > 1 else 0, bw if W > 1 else 0, 100 * drift,
         plan["compute_dense"] * 1e3, plan["compute_moe"] * 1e3, plan["optimizer"] * 1e3, comm, pred, ms,
         100 * (pred / ms - 1), pred_min, ms_min, 100 * (pred_min / ms_min - 1), a2a_pred, a2a_meas, skew))
PY
}

printf "machine: %s, %d CPUs; %s; %d repetitions\n" "$(lscpu | sed -n 's/^Model name: *//p')" "$cores" "$(date -u +%F)" \
    "$repeats"
header=$(printf "%3s %5s %3s | %7s %5s %7s %5s %6s %6s %6s | " run ranks thr "GEMM GF" ovh "us/tok" "ns/p" "lat us" \
    "GB/s" drift; printf "%7s %7s %6s %6s %7s | %7s %6s | %7s %7s %6s | %5s %5s | %4s" dense MoE opt comm pred \
    measured error "pr min" "ms min" error a2a_p a2a_m skew)
for run in $(seq 1 "$repeats"); do
    echo
    echo "$header"
    for W in 1 2 4; do measure "$run" $W 8 | tee -a "$tmp/rows"; done
    measure "$run" 1 1 | tee -a "$tmp/rows"
done
echo
"$py" - "$tmp/rows" <<'PY'
import statistics, sys
errors = {}, {}
for line in open(sys.argv[1]):
    f = line.split("|")
    config = " ".join(f[0].split()[1:-1])
    for i, column in enumerate((f[3].split()[1], f[4].split()[2])):
        errors[i].setdefault(config, []).append(float(column.rstrip("%")))
for i, what in enumerate(("medians (the benches' medians against the median step)",
                          "minima (the benches' fastest iterations against the fastest step)")):
    print("error of the prediction from %s, per configuration (ranks; E1: one expert, no MoE layer), each run and the "
          "median:" % what)
    for config, e in errors[i].items():
        print("  %-5s %s   median %+4.0f%%   within 25%%: %d of %d" % (config, "  ".join("%+4.0f%%" % x for x in e),
              statistics.median(e), sum(abs(x) <= 25 for x in e), len(e)))
PY
