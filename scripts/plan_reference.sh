#!/bin/bash
# plan_reference.sh [BUILD_DIR] — moe-plan --search's best layout for the four reference models
# (tests/plan_configs/: Mixtral 8x7B and 8x22B, Qwen3-30B-A3B and 235B-A22B) on 8, 64, 512 and 1024 H100-class GPUs
# (8 per node, the planner's default cluster), global batch 1024 sequences of 4096 and of 1024 tokens, bf16; attention
# materialized (the S x S probabilities kept) and fused (moe-train's default); the search tries every --recompute and
# --zero 0, 1 and 2 (2 where moe-train's world-invariant sums are on: up to 64 GPUs of a stage with its default
# shards) and every pipeline (--pp dividing the GPUs and layers, --virtual-stages with pp V dividing the layers). One
# line per case: the best layout, its memory, predicted step, tokens/s, MFU (serial and overlapped) and what limits
# it, or the memory the smallest layout needs. Then the pipelines (issue 27): Megatron-Core's published Mixtral 8x7B
# layout predicted, and the best layouts of Mixtral 8x7B and 8x22B on 64-512 GPUs. Then tensor parallelism (issue 28):
# NeMo's Mixtral 8x22B layout predicted, and the best layouts of Mixtral 8x22B and Qwen3-235B-A22B on 64-1024 GPUs.
# The search tries every --tp (a power of two within a node) too. Output: docs/SCALING.md.
set -euo pipefail
cd "$(dirname "$0")/.."
plan=${1:-build}/moe-plan
row='%-16s %-17s %5s | %3s %3s %3s %4s %4s %4s %9s %5s %5s %8s %10s %10s %6s %6s  %s\n'
printf "$row" model attention GPUs pp V tp ep dp zero recompute micro accum \
    "mem GiB" "step s" "tokens/s" MFU "MFU ov" "limited by"
for model in mixtral-8x7b mixtral-8x22b qwen3-30b-a3b qwen3-235b-a22b; do
    for case in "materialized 4096" "fused 4096" "materialized 1024" "fused 1024"; do
        read -r attention seq <<< "$case"
        for gpus in 8 64 512 1024; do
            json=$("$plan" --hf-config tests/plan_configs/$model.json --nodes $((gpus / 8)) --seq-len $seq \
                --global-batch 1024 --attention $attention --search --top 1 --json)
            echo "$json" | /usr/bin/python3 scripts/plan_row.py $model "$attention $seq" $gpus
        done
    done
done

# Pipelines: Megatron-Core's Mixtral 8x7B recipe (64 H100s, pp 4, 8 virtual stages, ep 8, micro-batch 1, global batch
# 256, S 4096; its distributed optimizer is ZeRO-1), at each --recompute, beside its published ~468 TFLOP/s per GPU;
# then the search's best for Mixtral 8x7B and 8x22B on 64-512 GPUs, global batch 256 and 1024 sequences of 4096.
echo
echo "Megatron-Core's Mixtral 8x7B layout (published: ~468 TFLOP/s per GPU = 47.3% of 989.4):"
# recipe_rows MODEL GPUS "ZEROS" "RECOMPUTES" FLAGS...: a published layout's rows at each --zero and --recompute
recipe_rows() {
    local model=$1 gpus=$2 zeros=$3 recomputes=$4 zero recompute
    shift 4
    printf "$row" model attention GPUs pp V tp ep dp zero recompute micro accum "mem GiB" "step s" "tokens/s" MFU \
        "MFU ov" "limited by"
    for zero in $zeros; do
        for recompute in $recomputes; do
            "$plan" --hf-config tests/plan_configs/$model.json --nodes $((gpus / 8)) "$@" --micro-batch 1 \
                --zero $zero --recompute $recompute --json |
                /usr/bin/python3 scripts/plan_row.py $model "fused 4096" $gpus --tflops
        done
    done
}
recipe_rows mixtral-8x7b 64 "0 1 2" "none attention moe full" --pp 4 --virtual-stages 8 --ep 8 --global-batch 256
echo
echo "The search's best layouts with pipelines (fused attention, S 4096):"
printf "$row" model "global batch" GPUs pp V tp ep dp zero recompute micro accum "mem GiB" "step s" "tokens/s" MFU \
    "MFU ov" "limited by"
for model in mixtral-8x7b mixtral-8x22b; do
    for batch in 256 1024; do
        for gpus in 64 128 256 512; do
            # a pipeline needs at least pp micro-batches: a global batch of at least one sequence per GPU
            [ "$batch" -ge "$gpus" ] || continue
            "$plan" --hf-config tests/plan_configs/$model.json --nodes $((gpus / 8)) --seq-len 4096 \
                --global-batch $batch --search --top 1 --json | /usr/bin/python3 scripts/plan_row.py $model "$batch" $gpus
        done
    done
done

# Tensor parallelism (issue 28; moe-train's --tp is not there yet): NeMo's Mixtral 8x22B pretraining recipe (128 GPUs,
# tp 2 with sequence parallelism, pp 4, 14 virtual stages, ep 8, micro-batch 1, global batch 512, S 4096; its context
# parallelism of 2 is not modelled), at ZeRO-1 (its distributed optimizer) and 2 and each --recompute; then the
# search's best for Mixtral 8x22B and Qwen3-235B-A22B on 64-1024 GPUs, global batch 1024 sequences of 4096.
echo
echo "NeMo's Mixtral 8x22B layout (tp 2, pp 4, V 14, ep 8; without its context parallelism of 2):"
recipe_rows mixtral-8x22b 128 "1 2" "none full" --tp 2 --pp 4 --virtual-stages 14 --ep 8 --global-batch 512
echo
echo "The search's best layouts with tensor parallelism (fused attention, S 4096, global batch 1024):"
printf "$row" model "global batch" GPUs pp V tp ep dp zero recompute micro accum "mem GiB" "step s" "tokens/s" MFU \
    "MFU ov" "limited by"
for model in mixtral-8x22b qwen3-235b-a22b; do
    for gpus in 64 128 256 512 1024; do
        "$plan" --hf-config tests/plan_configs/$model.json --nodes $((gpus / 8)) --seq-len 4096 --global-batch 1024 \
            --search --top 1 --json | /usr/bin/python3 scripts/plan_row.py $model 1024 $gpus
    done
done
