#!/bin/bash
# two_node_experiment.sh [BUILD_DIR] — two "nodes" on one machine, as root: network namespaces moe_a and moe_b
# (each with its own host name) joined by a veth pair, 10.77.0.1 and 10.77.0.2, shaped to $RATE (tbf; default
# 10gbit) and, where the kernel has netem, $DELAY one way (default 50us). Open MPI starts one rank in each
# (its rsh agent is `ip netns exec`), over its TCP transport on that link only. Measured across the link and,
# for comparison, within one namespace: bench_alltoall (4 KiB to 16 MiB, Hockney's latency and bandwidth fitted to
# every size) and moe-train's default model (2 ranks, ep 2: the expert all-to-all and the gradient all-reduce cross
# the link); beside them moe-plan's prediction for 2 nodes of 1 rank (and 1 node of 2), fed the link's fitted
# latency and bandwidth and what scripts/plan_vs_measured.sh feeds it for 2 ranks: the compute rates of
# bench_model_dense and bench_moe_layer (before and after the runs) and the routing of a 1-rank run. Addresses only
# inside the namespaces; they are removed at exit. Results: docs/SCALING.md.
set -euo pipefail
export LC_ALL=C.UTF-8 # a decimal point in awk and printf whatever the user's locale (de_DE's comma broke them)
cd "$(dirname "$0")/.."
case "${1:-}" in
-h | --help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
-*) echo "two_node_experiment: unknown option '$1' (its one argument is a build folder)" >&2; exit 2 ;;
esac
[ $# -le 1 ] || { echo "two_node_experiment: one argument at most, a build folder; got $#" >&2; exit 2; }
build=$(realpath "${1:-build}")
[ -x "$build/moe-train" ] || { echo "two_node_experiment: $build has no moe-train: give a build folder" >&2; exit 2; }
RATE=${RATE:-10gbit} DELAY=${DELAY:-50us}
[ "$(id -u)" -eq 0 ] || { echo "two_node_experiment: needs root (network namespaces)" >&2; exit 1; }
source scripts/mpi_env.sh
py=/usr/bin/python3
[ -f data/kjv_train.bin ] || scripts/prepare_data.sh >/dev/null
tmp=$(mktemp -d)
cleanup() { ip netns del moe_a 2>/dev/null || true; ip netns del moe_b 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
cleanup && tmp=$(mktemp -d)

ip netns add moe_a
ip netns add moe_b
ip link add veth_a type veth peer name veth_b
delay_note="not shaped (this kernel has no netem qdisc)"
for n in a b; do
    ip link set "veth_$n" netns "moe_$n"
    ip -n "moe_$n" addr add "10.77.0.$([ $n = a ] && echo 1 || echo 2)/24" dev "veth_$n"
    ip -n "moe_$n" link set lo up
    ip -n "moe_$n" link set "veth_$n" up
    if ip netns exec "moe_$n" tc qdisc add dev "veth_$n" root netem delay "$DELAY" rate "$RATE" 2>/dev/null; then
        delay_note="$DELAY each way (netem)"
    else
        ip netns exec "moe_$n" tc qdisc add dev "veth_$n" root tbf rate "$RATE" burst 1mb latency 50ms
    fi
done
cat > "$tmp/agent" <<'EOF'
#!/bin/bash
# Open MPI's rsh agent here: "agent [options] HOST COMMAND..." runs COMMAND in HOST's namespace
while [[ $1 == -* ]]; do shift; done
case $1 in 10.77.0.1) n=a ;; 10.77.0.2) n=b ;; *) echo "agent: unknown host $1" >&2; exit 1 ;; esac
shift
exec ip netns exec "moe_$n" unshare --uts bash -c "hostname node-$n; $*"
EOF
chmod +x "$tmp/agent"

across() { # CMD...: one rank on each node, TCP over the shaped link
    ip netns exec moe_a unshare --uts bash -c 'hostname node-a; exec "$@"' _ mpirun --host 10.77.0.1:1,10.77.0.2:1 \
        -np 2 --mca plm_rsh_agent "$tmp/agent" --mca pml ob1 --mca btl self,tcp --mca btl_tcp_if_include 10.77.0.0/24 \
        --mca oob_tcp_if_include 10.77.0.0/24 --bind-to none "$@"
}
within() { mpirun -np 2 --bind-to none "$@"; } # both ranks in one namespace, shared memory

source scripts/plan_benches.sh # the model's shape and bench_pair
a2a() { # WHERE: "latency_us bandwidth_GBps" of bench_alltoall's row exchange (d floats per row)
    "$1" "$build/bench/bench_alltoall" --min-bytes 4K --max-bytes 16M --row-bytes $((d * 4)) --pattern uniform \
        --warmup 3 --iters 10 | sed -n 's/^json: //p' > "$tmp/a2a"
    "$py" scripts/plan_inputs.py alltoall "$tmp/a2a" 2
}
train_ms() { # WHERE: median step ms of moe-train's default model, 2 ranks, ep 2, steps 4-12
    "$1" "$build/moe-train" --ep 2 --steps 12 --warmup 0 --threads 1 --shards $shards --sample-tokens 0 \
        --eval-interval 0 --eval-batches 1 --log-file "$tmp/train.jsonl" > /dev/null
    "$py" -c 'import json, statistics, sys
print(statistics.median([r["ms"] for r in map(json.loads, open(sys.argv[1])) if "step" in r][3:]))' "$tmp/train.jsonl"
}

cores=$(getconf _NPROCESSORS_ONLN)
bench_pair 2 1 8 before
# the routing the predictions get: a 1-rank run's (world-invariant: the same bits as the 2-rank runs')
"$build/moe-train" --steps 12 --warmup 0 --shards $shards --sample-tokens 0 --eval-interval 0 --eval-batches 1 \
    --log-file "$tmp/routing.jsonl" > /dev/null
read -r lat_x bw_x < <(a2a across)
read -r lat_w bw_w < <(a2a within)
ms_x=$(train_ms across)
ms_w=$(train_ms within)
bench_pair 2 1 8 after
read -r gflops overhead us ns _ < <("$py" scripts/plan_inputs.py rates "$tmp" 2 "$cores")
plan() { # NODES LATENCY_US GBPS: predicted step ms for 2 ranks on NODES nodes, the link(s) between them given
    local nodes=$1 link
    [ "$nodes" -eq 2 ] && link=(--inter-latency "$2" --inter-bw "$3") || link=(--intra-latency "$2" --intra-bw "$3")
    "$build/moe-plan" --precision fp32 --gpus-per-node $((2 / nodes)) --nodes "$nodes" --ep 2 --micro-batch 8 \
        --global-batch $batch --seq-len $seq --gpu-flops "$("$py" -c "print($gflops / 1000)")" --gemm-efficiency 1 \
        --non-gemm-overhead "$overhead" --dense-us-per-token "$us" --optimizer-ns-per-param "$ns" \
        --routing-from "$tmp/routing.jsonl" --gpu-memory 20 "${link[@]}" --workspace-gib 0 \
        --json | "$py" -c 'import json, sys; print(json.load(sys.stdin)["prediction"]["seconds"]["step_serial"] * 1e3)'
}
pred_x=$(plan 2 "$lat_x" "$bw_x")
pred_w=$(plan 1 "$lat_w" "$bw_w")

echo "two nodes in network namespaces, $(date -u +%F), $(lscpu | sed -n 's/^Model name: *//p'), $cores CPUs"
echo "link: veth, rate $RATE (tbf or netem), delay $delay_note; Open MPI TCP (pml ob1, btl tcp)"
printf "| %-38s | %12s | %12s |\n" "" "across nodes" "within a node"
printf "| %-38s | %12s | %12s |\n" "---" "---:" "---:"
printf "| %-38s | %12.1f | %12.1f |\n" "all-to-all latency, fitted (us)" "$lat_x" "$lat_w"
printf "| %-38s | %12.3f | %12.3f |\n" "all-to-all bandwidth, fitted (GB/s)" "$bw_x" "$bw_w"
printf "| %-38s | %12.1f | %12.1f |\n" "moe-train step, median (ms)" "$ms_x" "$ms_w"
printf "| %-38s | %12.1f | %12.1f |\n" "moe-plan's predicted step (ms)" "$pred_x" "$pred_w"
"$py" -c "print('prediction error: across nodes %+.0f%%, within a node %+.0f%%; the link costs %.1f ms per step '
               'measured, %.1f ms predicted' % (100 * ($pred_x / $ms_x - 1), 100 * ($pred_w / $ms_w - 1),
                                                $ms_x - $ms_w, $pred_x - $pred_w))"
