#!/usr/bin/env bash
# gpu_layouts.sh [--device cuda|cpu] — is training bitwise the same across layouts? Pairs of 3-step runs of a small
# model (test_gpu_train's: 2 layers, d 16, 2 heads, 4 experts of d_ff 16, top-2, 2 sequences of 16 tokens a step,
# bf16), 1 rank against 2 ranks sharing the device: tp 2 against tp 1 at --tp-shards 2 (one or two kv heads, fused or
# materialized attention, capacity 1.25 or dropless, 1 or 2 micro-batches), 2 ranks at ep 1 and ep 2 against 1 rank
# (also with the materialized attention, and at head_dim 32, where a GPU runs the flash kernels; tp 2 too), and one
# run of each kind twice. For each pair and step: whether the losses are the same digits, and which tensors of
# the step's checkpoint differ (scripts/compare_checkpoints.py). docs/BENCHMARKS.md, "The third GPU run", has its
# table of 2026-11-28 (before the CUDA layer's fixed row blocks); on the CPU every pair is the same.
# Runs after scripts/gpu_check.sh on a GPU machine (its build folder, MOE_BUILD_DIR, default build-gpu, and the
# bundle's libraries when it was used), or with --device cpu against build/ anywhere. Exit 1 if any pair differs.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
device=cuda
while [ $# -gt 0 ]; do
    case $1 in
    --device) device=${2:?--device needs cuda or cpu}; shift 2 ;;
    -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_layouts: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
case $device in
cuda) build="${MOE_BUILD_DIR:-$root/build-gpu}" ;;
cpu) build="${MOE_BUILD_DIR:-$root/build}" ;;
*) echo "gpu_layouts: --device is cuda or cpu, not '$device'" >&2; exit 2 ;;
esac
[ -x "$build/moe-train" ] || { echo "gpu_layouts: no $build/moe-train (build first: scripts/gpu_check.sh)" >&2; exit 2; }
if [ -d "$build/bundle-prefix" ] && [ -d "$root/.gpu-bundle" ]; then # gpu_check.sh built against the bundle
    source "$root/scripts/bundle_env.sh"
    moe_bundle_activate "$root/.gpu-bundle" "$build/bundle-prefix" > /dev/null || exit 2
fi
source "$root/scripts/mpi_env.sh"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for i in $(seq 1 60); do echo "line $i of a small corpus for the refusal tests."; done > "$dir/text.txt"
"$build/moe-text-to-tokens" "$dir/text.txt" "$dir/train.bin" "$dir/val.bin" 0.2 > /dev/null || exit 2
base=(--layers 2 --d-model 16 --heads 2 --d-ff 16 --seq-len 16 --experts 4 --top-k 2 --batch 2 --warmup 1
      --eval-batches 1 --eval-interval 0 --sample-tokens 0 --exchange-timeout 20 --steps 3 --checkpoint-interval 1
      --keep-last 0 --precision bf16 --device "$device" --train-data "$dir/train.bin" --val-data "$dir/val.bin")
differ=0

run() { # NAME RANKS FLAGS...: base's flags, each dropped where FLAGS give it (moe-train refuses a flag twice)
    local name=$1 np=$2 i a
    shift 2
    local -A given=()
    for a in "$@"; do [[ $a == --* ]] && given[$a]=1; done
    local flags=()
    for ((i = 0; i < ${#base[@]}; i += 2)); do
        [ -n "${given[${base[i]}]:-}" ] || flags+=("${base[i]}" "${base[i + 1]}")
    done
    timeout 120 mpirun -np "$np" "$build/moe-train" "${flags[@]}" --checkpoint-dir "$dir/$name" \
        --log-file "$dir/$name.jsonl" "$@" > "$dir/$name.txt" 2>&1 ||
        { echo "gpu_layouts: $name failed:"; tail -5 "$dir/$name.txt"; differ=1; }
}
losses() { grep -o '"loss":[-0-9.e+]*' "$1" | tr '\n' ' '; }
compare() { # LABEL A B
    echo "== $1"
    if [ "$(losses "$dir/$2.jsonl")" = "$(losses "$dir/$3.jsonl")" ]; then echo "  losses: the same"
    else echo "  losses: DIFFER"; differ=1; fi
    local step
    for step in 1 2 3; do
        local f="step-0000000$step/model.safetensors"
        echo "  step $step: $(python3 "$root/scripts/compare_checkpoints.py" "$dir/$2/$f" "$dir/$3/$f")"
        cmp -s "$dir/$2/$f" "$dir/$3/$f" || differ=1
    done
}
pair() { # LABEL RANKS-FLAGS -- FLAGS...: 1 rank with FLAGS against 2 ranks with RANKS-FLAGS and FLAGS
    local label=$1 two=()
    shift
    while [ "$1" != -- ]; do two+=("$1"); shift; done
    shift
    run "a_$label" 1 "$@"
    run "b_$label" 2 "${two[@]}" "$@"
    compare "$label: 2 ranks (${two[*]}) against 1" "a_$label" "b_$label"
}
mqa=(--kv-heads 1 --tp-shards 2)
pair tp2_mqa_fused_capacity_mb2 --tp 2 -- "${mqa[@]}" --capacity-factor 1.25 --micro-batches 2
pair tp2_mqa_materialized --tp 2 -- "${mqa[@]}" --capacity-factor 1.25 --micro-batches 2 --attention materialized
pair tp2_gqa2_capacity_mb2 --tp 2 -- --kv-heads 2 --tp-shards 2 --capacity-factor 1.25 --micro-batches 2
pair tp2_mqa_dropless_mb2 --tp 2 -- "${mqa[@]}" --micro-batches 2
pair tp2_mqa_capacity_mb1 --tp 2 -- "${mqa[@]}" --capacity-factor 1.25
pair tp2_gqa2_dropless_mb1 --tp 2 -- --kv-heads 2 --tp-shards 2
pair dp2_ep1 --ep 1 -- --kv-heads 2
pair dp2_ep2 --ep 2 -- --kv-heads 2
# a rank's sequences halve: the materialized attention's cuBLAS calls must not see it (issue 50, item 7)
pair dp2_ep2_materialized --ep 2 -- --kv-heads 2 --attention materialized
# head_dim 32: under bf16 the tensor-core flash attention on a GPU (kernels/attention_flash.cu)
pair dp2_ep2_hd32 --ep 2 -- --d-model 64 --kv-heads 2
pair tp2_hd32 --tp 2 -- --d-model 64 --kv-heads 2 --tp-shards 2
run twice_a 1 "${mqa[@]}" --capacity-factor 1.25 --micro-batches 2
run twice_b 1 "${mqa[@]}" --capacity-factor 1.25 --micro-batches 2
compare "1 rank, the same run twice" twice_a twice_b
run twice_c 2 --tp 2 "${mqa[@]}" --capacity-factor 1.25 --micro-batches 2
run twice_d 2 --tp 2 "${mqa[@]}" --capacity-factor 1.25 --micro-batches 2
compare "tp 2, the same run twice" twice_c twice_d
echo "gpu_layouts: $([ $differ = 0 ] && echo "every pair the same bits" || echo "some pairs differ") ($device)"
exit $differ
