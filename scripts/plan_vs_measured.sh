#!/bin/bash
# plan_vs_measured.sh [BUILD_DIR] [REPEATS] — moe-plan's predicted step time of moe-train's default model (4 layers,
# d 128, 8 experts top-2, batch 16 x 128 tokens, fp32, ep = ranks) at 1, 2 and 4 ranks against the measured one, on
# this machine; and of the same model with one expert (no MoE layer: the dense path and the optimizer alone) at 1
# rank, which checks bench_model_dense by itself. The planner gets only rates that bench/ measures here and the
# routing of another run, never the predicted run's own times:
#   dense path and optimizer: bench_model_dense at the model's shape and sequences per rank, with each rank's
#     threads and moe-train's virtual shards (--world-invariant is on by default: 16 shards of the batch, 16 / W per
#     rank): --dense-us-per-token (forward + backward of all but the MoE layers) and --optimizer-ns-per-param;
#   MoE layers: bench_moe_layer at the model's expert shape, tokens and shards per rank: its GEMM floor's GFLOP/s
#     (--gpu-flops, --gemm-efficiency 1) and its layer time over that floor, minus 1 (--non-gemm-overhead);
#   routing: the 1-rank run's metrics.jsonl (--routing-from): under world-invariant training the routing is the same
#     bits at every world size, so it gives the busiest EP rank's rows at 2 and 4 ranks (the skew column);
#   W ranks on C < W cores take turns: each gets C/W of the GEMM rate, and W/C of the measured times; the busiest
#     EP rank shares the cores with the others until they are done, then runs alone on one, which gives the skew
#     the planner gets there (--routing-skew; scripts/plan_inputs.py skew);
#   latency and bandwidth of an exchange: bench_alltoall on W ranks, rows of d floats, 4 KiB to 4 MiB: Hockney's
#     t = latency + bytes to peers / bandwidth fitted to every size (least squares of the relative error).
# The shared VM's cores make every input move between runs, so each configuration runs its benches just before
# and just after its moe-train run and the planner gets the mean of the two (the drift column: how far apart they
# were, the largest over the dense time and the GEMM rate). Two predictions per row: from the benches' medians
# against moe-train's median step (steps 4-10), and from their minima against its fastest step (what each would
# take on a quiet machine). The whole comparison runs REPEATS times (default 3), one table each, then the errors per
# configuration and their median. Also the all-to-all alone: the planner's time for one exchange of the model's
# size against bench_alltoall's (balanced rows, as the bench sends). ~12 s per repetition on 2 idle cores; results:
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
source scripts/plan_benches.sh # the model's shape and bench_pair

# measure RUN W EXPERTS: benches, moe-train, benches again; prints one table row
measure() {
    local run=$1 W=$2 experts=$3
    local threads=$(( cores / W > 0 ? cores / W : 1 )) tokens=$(( batch * seq / W ))
    local top=$(( experts > 1 ? k : 1 )) lat_us=1 bw=1 a2a_bytes=$(( tokens * k * d * 4 )) a2a_meas=0
    bench_pair "$W" "$threads" "$experts" before
    if [ "$W" -gt 1 ]; then
        mpirun -np "$W" "$build/bench/bench_alltoall" --min-bytes 4K --max-bytes 4M --row-bytes $((d * 4)) \
            --pattern uniform --warmup 3 --iters 10 | sed -n 's/^json: //p' > "$tmp/a2a"
        read -r lat_us bw a2a_meas < <("$py" scripts/plan_inputs.py alltoall "$tmp/a2a" "$W" $a2a_bytes)
    fi
    mpirun --bind-to none -np "$W" "$build/moe-train" --ep "$W" --experts "$experts" --top-k $top --steps 10 --warmup 0 \
        --shards $shards --threads "$threads" --sample-tokens 0 --eval-interval 0 --eval-batches 1 \
        --log-file "$tmp/train.jsonl" >/dev/null
    # the routing the later ranks' predictions get: this 1-rank run's
    [ "$W" -eq 1 ] && [ "$experts" -gt 1 ] && cp "$tmp/train.jsonl" "$tmp/routing.jsonl"
    bench_pair "$W" "$threads" "$experts" after
    # the planner's inputs (scripts/plan_inputs.py): the mean of before and after, with the turn-taking of W ranks on
    # fewer cores; from the benches' medians, and (the "quiet" prediction) from their minima
    local inputs
    inputs=$("$py" scripts/plan_inputs.py rates "$tmp" "$W" "$cores")
    local gflops overhead us ns gflops_min overhead_min us_min ns_min drift
    read -r gflops overhead us ns gflops_min overhead_min us_min ns_min drift <<<"$inputs"
    # plan GFLOPS OVERHEAD US NS [ROUTING...]: moe-plan's JSON for these rates (and the routing flags given)
    plan() {
        "$build/moe-plan" --precision fp32 --experts "$experts" --top-k $top --gpus-per-node "$W" --nodes 1 \
            --ep "$W" --micro-batch $((batch / W)) --global-batch $batch --seq-len $seq \
            --gpu-flops "$("$py" -c "print($1 / 1000)")" --gemm-efficiency 1 --non-gemm-overhead "$2" \
            --dense-us-per-token "$3" --optimizer-ns-per-param "$4" --gpu-memory 20 --intra-bw "$bw" \
            --intra-latency "$lat_us" --workspace-gib 0 --json "${@:5}"
    }
    local routing=()
    if [ "$W" -gt 1 ]; then
        routing=(--routing-from "$tmp/routing.jsonl")
        if [ "$W" -gt "$cores" ]; then # turn-taking on shared cores (scripts/plan_inputs.py skew)
            local busiest
            busiest=$(plan 1 0 1 1 "${routing[@]}" | "$py" -c "import json, sys
print(json.load(sys.stdin)['prediction']['routing_skew'])")
            routing=(--routing-skew "$("$py" scripts/plan_inputs.py skew "$busiest" "$W" "$cores")")
        fi
    fi
    "$py" - "$(plan "$gflops" "$overhead" "$us" "$ns" "${routing[@]}")" \
        "$(plan "$gflops_min" "$overhead_min" "$us_min" "$ns_min" "${routing[@]}")" \
        "$tmp/train.jsonl" "$run" "$W" "$experts" "$threads" "$gflops" "$overhead" "$us" "$ns" "$lat_us" "$bw" \
        "$drift" $a2a_bytes "$a2a_meas" <<'PY'
import json, statistics, sys
skew = json.loads(sys.argv[1])["prediction"]["routing_skew"]  # what the planner was given (1: balanced)
plan, quiet = (json.loads(a)["prediction"]["seconds"] for a in sys.argv[1:3])
records = [r for r in map(json.loads, open(sys.argv[3])) if "step" in r][3:]  # steps 4-10
steps = [r["ms"] for r in records]
run, W, E, threads = (int(x) for x in sys.argv[4:8])
gf, ov, us, ns, lat, bw, drift, size, a2a_meas = (float(x) for x in sys.argv[8:])
pred, ms = plan["step_serial"] * 1e3, statistics.median(steps)
pred_min, ms_min = quiet["step_serial"] * 1e3, min(steps)
comm = (plan["alltoall"] + plan["control"] + plan["allreduce"]) * 1e3
a2a_pred = lat + size * (W - 1) / W / (bw * 1e9) * 1e6 if W > 1 else 0
label = "%d" % W if E > 1 else "1 E1"
print("%3d %5s %3d | %7.1f %5.2f %7.2f %5.2f %6.1f %6.2f %5.0f%% | %7.2f %7.2f %6.2f %6.2f %7.2f | %7.2f %+6.1f%% |"
      " %7.2f %7.2f %+6.1f%% | %5.0f %5.0f | %4.2f"
      % (run, label, threads, gf if E > 1 else 0, ov, us, ns, lat if W > 1 else 0, bw if W > 1 else 0, 100 * drift,
         plan["compute_dense"] * 1e3, plan["compute_moe"] * 1e3, plan["optimizer"] * 1e3, comm, pred, ms,
         100 * (pred / ms - 1), pred_min, ms_min, 100 * (pred_min / ms_min - 1), a2a_pred, a2a_meas, skew))
PY
}

printf "machine: %s, %d CPUs; %s; %d repetitions\n" "$(lscpu | sed -n 's/^Model name: *//p')" "$cores" "$(date -u +%F)" \
    "$repeats"
header=$(printf "%3s %5s %3s | %7s %5s %7s %5s %6s %6s %6s | " run ranks thr "GEMM GF" ovh "us/tok" "ns/p" "lat us" \
    "GB/s" drift; printf "%7s %7s %6s %6s %7s | %7s %7s | %7s %7s %7s | %5s %5s | %4s" dense MoE opt comm pred \
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
errors = {}, {}, {}
for line in open(sys.argv[1]):
    f = line.split("|")
    config = " ".join(f[0].split()[1:-1])
    for i, column in enumerate((f[3].split()[1], f[4].split()[2])):
        errors[i].setdefault(config, []).append(float(column.rstrip("%")))
    a2a_pred, a2a_meas = (float(x) for x in f[5].split())
    if a2a_meas > 0:
        errors[2].setdefault(config, []).append(100 * (a2a_pred / a2a_meas - 1))
for i, what in enumerate(("the step predicted from medians (the benches' medians against the median step)",
                          "the step predicted from minima (the benches' fastest iterations against the fastest step)",
                          "one all-to-all of the model's size (the planner against bench_alltoall)")):
    print("error of %s, per configuration (ranks; E1: one expert, no MoE layer), each run and the median:" % what)
    for config, e in errors[i].items():
        print("  %-5s %s   median %+5.1f%%   within 25%%: %d of %d" % (config, "  ".join("%+5.1f%%" % x for x in e),
              statistics.median(e), sum(abs(x) <= 25 for x in e), len(e)))
PY
