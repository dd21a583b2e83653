#!/bin/bash
# plan_reference.sh [BUILD_DIR] — moe-plan --search's best layout for the four reference models
# (tests/plan_configs/: Mixtral 8x7B and 8x22B, Qwen3-30B-A3B and 235B-A22B) on 8, 64, 512 and 1024 H100-class GPUs
# (8 per node, the planner's default cluster), global batch 1024 sequences of 4096 and of 1024 tokens, bf16; attention
# materialized (the S x S probabilities kept) and fused (moe-train's default); the search tries every --recompute and
# --zero 0, 1 and 2 (2 where moe-train's world-invariant sums are on: up to 64 GPUs with its default shards). One
# line per case: the best layout, its memory, predicted step, tokens/s, MFU (serial and overlapped) and what limits
# it, or the memory the smallest layout needs. Output: docs/SCALING.md.
set -euo pipefail
cd "$(dirname "$0")/.."
plan=${1:-build}/moe-plan
printf "%-16s %-17s %5s | %4s %4s %4s %9s %5s %5s %8s %10s %10s %6s %6s  %s\n" model attention GPUs ep dp zero recompute micro accum \
    "mem GiB" "step s" "tokens/s" MFU "MFU ov" "limited by"
for model in mixtral-8x7b mixtral-8x22b qwen3-30b-a3b qwen3-235b-a22b; do
    for case in "materialized 4096" "fused 4096" "materialized 1024" "fused 1024"; do
        read -r attention seq <<< "$case"
        for gpus in 8 64 512 1024; do
            json=$("$plan" --hf-config tests/plan_configs/$model.json --nodes $((gpus / 8)) --seq-len $seq \
                --global-batch 1024 --attention $attention --search --top 1 --json)
            /usr/bin/python3 - "$json" $model "$attention $seq" $gpus <<'PY'
import json, sys
d = json.loads(sys.argv[1]); model, attention, gpus = sys.argv[2:]
if not d["layouts"]:
    m = d["least_memory"]
    print("%-16s %-17s %5s | none of %d fits: the least needs %.0f GiB (ep %d, ZeRO-%d, recompute full, 1 sequence: "
          "activations %.0f, all-to-all buffers %.0f, AdamW %.0f, gradients %.0f)" % (model, attention, gpus,
          d["layouts_tried"], m["total"] / 2**30, m["ep"], m["zero"], m["activations"] / 2**30, m["exchange"] / 2**30,
          m["optimizer"] / 2**30, m["gradients"] / 2**30))
else:
    l = d["layouts"][0]; s = l["seconds"]
    print("%-16s %-17s %5s | %4d %4d %4d %9s %5d %5d %8.1f %10.3f %10.4g %5.1f%% %5.1f%%  %s" % (model, attention, gpus,
          l["ep"], l["dp"], l["zero"], l["recompute"], l["micro_batch"], l["accum_steps"], l["memory_bytes"]["total"] / 2**30,
          s["step_serial"], l["tokens_per_s_serial"], 100 * l["mfu_serial"], 100 * l["mfu_overlap"], l["limited_by"]))
PY
        done
    done
done
