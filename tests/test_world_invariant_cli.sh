#!/usr/bin/env bash
# test_world_invariant_cli.sh MPIRUN MOE_TRAIN TEXT_TO_TOKENS EXPECT_FAILURE — moe-train bitwise the same on any
# power-of-two world (issue 15, docs/DETERMINISM.md), as a user meets it: a tiny model with capacity drops, 2
# micro-batches and ZeRO-1, 10 steps on 1 rank, on 2 ranks (ep 2) and on 4 ranks (ep 2, saving at step 5): every
# step's loss (printed with %.17g in metrics.jsonl) and the step-10 model.safetensors and train_state.safetensors
# are byte for byte the same. The 4-rank checkpoint of step 5 resumed on 2 ranks (ep 1) and on 1 rank continues
# the same curve to the same files. The check can fail: with --world-invariant 0 the 4-rank weights differ from the
# 1-rank ones. The 1-rank run with --threads 2 and 3 gives the same bits too (issue 48: the GEMM engine owns the
# threads). Every --recompute level (with dense FFN layers and bf16 too) gives the 1-rank run's bits, and so does
# --zero 0 and 2, resumed across zero levels. Bad --shards and zero combinations are refused.
# MOE_TEST_LAYOUTS_ONLY=1: world sizes, resumes and threads only (tests/meson.build's runs as other CPUs run it).
source "$(dirname "$0")/train_cli_common.sh"

small=(--layers 2 --d-model 16 --heads 2 --kv-heads 2 --d-ff 16 --seq-len 16 --experts 4 --top-k 2 --batch 8
       --micro-batches 2 --zero 1 --capacity-factor 1.0 --steps 10 --warmup 1 --eval-batches 1 --eval-interval 100
       --sample-tokens 0 --exchange-timeout 60 --train-data "$dir/train.bin" --val-data "$dir/val.bin")

source "$(dirname "$0")/layout_runs.sh" # run, losses, same_run

run one 1
if grep -q "note: --zero 1 on 1 rank shards nothing" "$dir/out.txt"; then
    echo "ok: --zero 1 on 1 rank runs, with a note that it shards nothing"
else
    fail_with_output "no note that --zero 1 on 1 rank shards nothing"
fi
run two 2 --ep 2
run four 4 --ep 2 --checkpoint-interval 5 --keep-last 0
same_run "2 ranks, ep 2" two one
same_run "4 ranks, ep 2" four one
run resumed2 2 --ep 1 --resume "$dir/four/step-00000005"
same_run "step 5 of 4 ranks resumed on 2 ranks, ep 1" resumed2 one
run resumed1 1 --ep 1 --resume "$dir/four/step-00000005"
same_run "step 5 of 4 ranks resumed on 1 rank" resumed1 one

run threads2 1 --threads 2
same_run "1 rank, 2 threads" threads2 one
run threads3 1 --threads 3
same_run "1 rank, 3 threads" threads3 one
[ "${MOE_TEST_LAYOUTS_ONLY:-0}" = 1 ] && finish test_world_invariant_cli

run plain1 1 --world-invariant 0
run plain4 4 --ep 2 --world-invariant 0
if cmp -s "$dir/plain1/step-00000010/model.safetensors" "$dir/plain4/step-00000010/model.safetensors"; then
    echo "FAIL: with --world-invariant 0 the 4-rank weights equal the 1-rank ones: the check above is blind"
    failures=$((failures + 1))
else
    echo "ok: with --world-invariant 0 the 4-rank weights differ from the 1-rank ones"
fi

# --recompute (issue 26): what backward rebuilds is bitwise what forward kept, routing reused, drops included
run full4 4 --ep 2 --recompute full
same_run "4 ranks, ep 2, recompute full" full4 one
run moe2 2 --ep 2 --recompute moe
same_run "2 ranks, ep 2, recompute moe" moe2 one
run attention1 1 --recompute attention
same_run "1 rank, recompute attention" attention1 one
run dense1 1 --moe-every 2 --precision bf16
run dense_full2 2 --ep 2 --moe-every 2 --precision bf16 --recompute full
same_run "2 ranks, dense FFN layers, bf16, recompute full" dense_full2 dense1
run dense_moe1 1 --moe-every 2 --precision bf16 --recompute moe
same_run "1 rank, dense FFN layers, bf16, recompute moe" dense_moe1 dense1

# --zero 2 (issue 26): each layer's gradients reduce-scattered as its backward ends, never held whole; the bits of
# --zero 0 and 1, and its checkpoints resume at other zero levels and layouts
run zero0 1 --zero 0
same_run "1 rank, ZeRO-0" zero0 one
run zero2_4 4 --ep 2 --zero 2 --recompute full --checkpoint-interval 5 --keep-last 0
same_run "4 ranks, ep 2, ZeRO-2, recompute full" zero2_4 one
run zero2_2 2 --ep 1 --zero 2
same_run "2 ranks, ep 1, ZeRO-2" zero2_2 one
run zero2_to0 2 --ep 2 --zero 0 --resume "$dir/zero2_4/step-00000005"
same_run "ZeRO-2's step 5 (4 ranks) resumed at ZeRO-0 on 2 ranks" zero2_to0 one
run zero1_to2 4 --ep 1 --zero 2 --resume "$dir/four/step-00000005"
same_run "ZeRO-1's step 5 (4 ranks, ep 2) resumed at ZeRO-2 on 4 ranks, ep 1" zero1_to2 one

small=("${small[@]:0:16}" --steps 1 --warmup 1 --train-data "$dir/train.bin" --val-data "$dir/val.bin")
refuses "--shards 3 must be a power of two dividing --batch 16" --shards 3
refuses "--zero 2 reduce-scatters the gradients in the fixed tree .* needs --world-invariant 1" --zero 2 \
    --world-invariant 0
refuses "--verify-steps compares whole gradients, which --zero 2 never holds" --zero 2 --verify-steps 1
refuses "needs a power-of-two number of ranks that divides --shards 1" --shards 1 --world-invariant 1
trains "by default the tree is off where the layout does not allow it, and moe-train says so" \
    "note: --world-invariant is 0 here \(2 ranks do not divide --shards 1\)" --shards 1
# ... and only so: "--shards 1 has no effect with --world-invariant 0" was said of the --shards that turned it off
grep -q "shards 1 has no effect" "$dir/out.txt" && fail_with_output "--shards 1 (auto tree): told it has no effect"
# --layout-invariant 0: the rows' products depend on each call's size, so the tree holds no layout's bits (a probe:
# taken with --world-invariant 1, silently; the runs differed from step 1)
refuses "--world-invariant 1 needs --layout-invariant 1" --layout-invariant 0 --world-invariant 1
trains "--layout-invariant 0 turns the default tree off, said" \
    "note: --world-invariant is 0 here \(--layout-invariant 0\)" --layout-invariant 0
finish test_world_invariant_cli
