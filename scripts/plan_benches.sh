# plan_benches.sh — sourced by scripts/plan_vs_measured.sh and scripts/two_node_experiment.sh: moe-train's default
# model as the benches see it, and one measurement of its compute for one rank's share (docs/SCALING.md). Needs
# $build (the build directory) and $tmp (where the json goes).
batch=16 seq=128 d=128 d_ff=256 k=2
shards=16 # moe-train's default --shards for --batch 16: world-invariant sums over 16 virtual shards

# bench_pair W THREADS EXPERTS TAG: the dense path and optimizer (bench_model_dense) and, with experts > 1, one MoE
# layer (bench_moe_layer) of one rank's share of the batch and of the shards among W ranks, into $tmp/TAG.dense and
# $tmp/TAG.layer ({} without MoE layers); scripts/plan_inputs.py rates reads them
bench_pair() {
    local W=$1 threads=$2 experts=$3 tag=$4
    "$build/bench/bench_model_dense" --batch $((batch / W)) --seq-len $seq --experts "$experts" --threads "$threads" \
        --shards $((shards / W)) --warmup 2 --iters 7 | sed -n 's/^json: //p' > "$tmp/$tag.dense"
    if [ "$experts" -gt 1 ]; then
        "$build/bench/bench_moe_layer" --tokens $((batch * seq / W)) --d-model $d --d-ff $d_ff --experts "$experts" \
            --top-k $k --threads "$threads" --shards $((shards / W)) --warmup 1 --iters 5 | sed -n 's/^json: //p' \
            > "$tmp/$tag.layer"
    else
        echo '{}' > "$tmp/$tag.layer"
    fi
}
