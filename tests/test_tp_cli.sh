#!/usr/bin/env bash
# test_tp_cli.sh MPIRUN MOE_TRAIN TEXT_TO_TOKENS EXPECT_FAILURE — moe-train --tp (issue 28: tensor parallelism with
# sequence parallelism, models/model.h) as a user meets it: a tiny model with capacity drops, grouped-query attention (4
# heads, 4 then 2 kv heads) and 2 micro-batches trained 8 steps with --tp-shards 4 on 1 rank (tp 1), on 2 ranks (tp 2),
# on 4 ranks (tp 2 x ep 2 with ZeRO-1 and with ZeRO-2; tp 4), 4 ranks tp 2 and tp 4 with 2 kv heads, 2 ranks tp 2 with 1
# kv head (the kv heads fewer than tp: replicated, also loaded so from a 1-rank checkpoint), an OLMoE (q/k norms over
# the whole projections, models/attention.c; 2 kv heads) at tp 2 and at tp 4 with --recompute full, a Qwen3-MoE (each
# head's q/k norms) with fewer kv heads than tp (2 at tp 4 with --recompute full, 1 at tp 2 x ep 2 with ZeRO-2), a
# DeepSeek-V3 (multi-head latent attention, models/mla.c) at tp 2 x ep 2 with ZeRO-2, its step 4 resumed at tp 4, and
# with a dense first layer in 2 uneven stages x tp 2: every
# step's loss and the validation loss (printed with %.17g in metrics.jsonl) are bitwise the 1-rank run's (of the same
# model), so are the step-8 checkpoint's files (whole Hugging Face tensors, byte for byte: a tp 2 checkpoint is a tp 1
# one, which test_hf_interop loads in transformers) and the text sampled after training, and the grid line names the
# tensor groups; so is a pipeline of 2 stages of tp 2, and a model with a dense FFN layer at tp 2 (with --recompute full
# too) its 1-rank run's. The tp 2 run's step-4 checkpoint resumed at tp 1 and at tp 4 continues the 1-rank run's curve
# to its step-8 files. The check can fail: --tp 2 --tp-shards 2 (Megatron's plain split) gives other losses; a bf16 run
# at tp 2 passes --verify-steps. What --tp does not combine with yet, and shapes it cannot split, are refused up front
# with the reason. Every run reads its data shuffled (--shuffle 1, issue 52: a permutation of the global window index).
source "$(dirname "$0")/train_cli_common.sh"

small=(--layers 2 --d-model 32 --heads 4 --kv-heads 4 --d-ff 16 --seq-len 16 --experts 4 --top-k 2 --batch 8
       --micro-batches 2 --capacity-factor 1.0 --tp-shards 4 --steps 8 --warmup 1 --eval-batches 1 --eval-interval 4
       --sample-tokens 12 --exchange-timeout 60 --train-data "$dir/train.bin" --val-data "$dir/val.bin" --shuffle 1)

run() { # NAME RANKS FLAGS...: trains, metrics into $dir/NAME.jsonl, output into $dir/NAME.txt, checkpoints of steps
    local name=$1 np=$2 # 4 and 8 into $dir/NAME
    shift 2
    merge --log-file "$dir/$name.jsonl" --checkpoint-dir "$dir/$name" --checkpoint-interval 4 --keep-last 0 "$@"
    if ! timeout 300 "$mpirun" -np "$np" "$train" "${merged[@]}" > "$dir/$name.txt" 2>&1; then
        cp "$dir/$name.txt" "$dir/out.txt"
        fail_with_output "$name: moe-train on $np ranks failed"
    fi
}

# every step's loss and every validation loss, as printed (%.17g)
losses() { grep -o '"\(step\|loss\|val_loss\)":[-0-9.e+]*' "$1" | tr '\n' ' '; }

from_step() { sed "s/.*\(\"step\":$1 \)/\1/"; } # the losses from step N on

same_as() { # WHAT NAME REFERENCE [FROM]: the losses (the reference's from step FROM on), the step-8 checkpoint's files
    local f
    for f in model.safetensors train_state.safetensors; do
        if ! cmp -s "$dir/$2/step-00000008/$f" "$dir/$3/step-00000008/$f"; then
            echo "FAIL: $1: step 8's $f differs from $3's"
            failures=$((failures + 1))
            return
        fi
    done
    if [ -n "$(losses "$dir/$2.jsonl")" ] &&
        [ "$(losses "$dir/$2.jsonl")" = "$(losses "$dir/$3.jsonl" | from_step "${4:-1}")" ]; then
        echo "ok: $1: $(grep -c '"step"' "$dir/$2.jsonl") steps' losses, the validation losses and the step-8" \
             "checkpoint (whole tensors, byte for byte) bitwise $3's"
    else
        echo "FAIL: $1: losses differ from $3's"
        diff <(losses "$dir/$2.jsonl" | tr ' ' '\n') <(losses "$dir/$3.jsonl" | tr ' ' '\n') | head -n 6
        failures=$((failures + 1))
    fi
}

run one 1 --routing-trace-out "$dir/one.trace"
run tp2 2 --tp 2 --routing-trace-out "$dir/tp2.trace"
run tp2ep2 4 --tp 2 --ep 2 --zero 1
run tp4 4 --tp 4
run pp2tp2 4 --pp 2 --tp 2
same_as "tp 2 on 2 ranks" tp2 one
same_as "tp 2 x ep 2 with ZeRO-1 on 4 ranks (the dense state sharded over the data-parallel group)" tp2ep2 one
same_as "tp 4 on 4 ranks" tp4 one
run tp2zero2 4 --tp 2 --ep 2 --zero 2
same_as "tp 2 x ep 2 with ZeRO-2 on 4 ranks (each layer's gradients reduce-scattered over the data-parallel group)" \
    tp2zero2 one
same_as "pp 2 x tp 2 on 4 ranks (the stages pass each rank's slice)" pp2tp2 one
sample() { grep -A 2 '^sample' "$dir/$1.txt" | tail -n 1; } # the text sampled after training
if [ -n "$(sample one)" ] && [ "$(sample tp2)" = "$(sample one)" ] && [ "$(sample tp4)" = "$(sample one)" ] &&
    [ "$(sample pp2tp2)" = "$(sample one)" ]; then
    echo "ok: tp 2, tp 4 and pp 2 x tp 2 sample the 1-rank run's text (each rank's vocabulary block of the logits" \
         "gathered)"
else
    echo "FAIL: samples differ: '$(sample one)', tp 2 '$(sample tp2)', tp 4 '$(sample tp4)', pp 2 x tp 2" \
         "'$(sample pp2tp2)'"
    failures=$((failures + 1))
fi
if grep -q "^grid: 4 ranks = pp 1 x (tp 2 x dp 2 | ep 2 x edp 2)" "$dir/tp2ep2.txt"; then
    echo "ok: the grid line: $(grep '^grid:' "$dir/tp2ep2.txt")"
else
    cp "$dir/tp2ep2.txt" "$dir/out.txt"
    fail_with_output "tp 2 x ep 2: no grid line naming the tensor groups"
fi
# a tp 2 checkpoint resumed at tp 1 and at tp 4: the rest of the one-rank run (its steps from 5 on)
run resumed1 1 --tp 1 --resume "$dir/tp2/step-00000004"
same_as "step 4 of tp 2 resumed on 1 rank" resumed1 one 5
run resumed4 4 --tp 4 --resume "$dir/tp2/step-00000004"
same_as "step 4 of tp 2 resumed at tp 4" resumed4 one 5
run dense1 1 --moe-every 2
run dense2 2 --moe-every 2 --tp 2
same_as "a dense FFN layer (gate/up column-, down row-parallel), tp 2" dense2 dense1
run dense2full 2 --moe-every 2 --tp 2 --recompute full
same_as "the same with --recompute full (each layer run again from its slice)" dense2full dense1
run gqa1 1 --kv-heads 2
run gqa2 4 --kv-heads 2 --tp 2
same_as "2 kv heads, tp 2 on 4 ranks" gqa2 gqa1
run gqa4 4 --kv-heads 2 --tp 4
same_as "2 kv heads, tp 4 (each kv head on 2 ranks)" gqa4 gqa1
run mqa1 1 --kv-heads 1
run mqa2 2 --kv-heads 1 --tp 2
same_as "1 kv head, tp 2 (on both ranks)" mqa2 mqa1
run mqa2_resumed 2 --kv-heads 1 --tp 2 --resume "$dir/mqa1/step-00000004"
same_as "1 kv head: step 4 of 1 rank resumed at tp 2" mqa2_resumed mqa1 5
olmoe=(--family olmoe --renormalize 0 --kv-heads 2)
run olmoe1 1 "${olmoe[@]}"
run olmoe2 2 "${olmoe[@]}" --tp 2
same_as "OLMoE (q/k norms over the whole projections: each rank norms its slice's rows of every head), tp 2" olmoe2 \
    olmoe1
run olmoe4 4 "${olmoe[@]}" --tp 4 --recompute full
same_as "the same at tp 4 (each kv head's k on 2 ranks) with --recompute full" olmoe4 olmoe1
qwen3=(--family qwen3_moe --head-dim 12 --renormalize 1)
run qwen1 1 "${qwen3[@]}" --kv-heads 2
run qwen4 4 "${qwen3[@]}" --kv-heads 2 --tp 4 --recompute full
same_as "Qwen3-MoE (each head's q/k norms) at tp 4: each kv head's k normed on the 2 ranks holding it, its weight \
gradient from the slice's rows of each kv head once, with --recompute full" qwen4 qwen1
run mqa_qwen1 1 "${qwen3[@]}" --kv-heads 1
run mqa_qwen4 4 "${qwen3[@]}" --kv-heads 1 --tp 2 --ep 2 --zero 2
same_as "the same with 1 kv head at tp 2 x ep 2 with ZeRO-2" mqa_qwen4 mqa_qwen1
deepseek=(--family deepseek_v3 --head-dim 12 --qk-rope-dim 4 --v-head-dim 6 --kv-lora-rank 16 --q-lora-rank 12
          --score sigmoid --bias-update-rate 0.01 --expert-groups 2 --topk-groups 1 --routed-scaling 2.5)
run ds1 1 "${deepseek[@]}"
run ds4 4 "${deepseek[@]}" --tp 2 --ep 2 --zero 2 --recompute attention
same_as "DeepSeek-V3 (multi-head latent attention: the latents replicated and gathered, q_b and kv_b by heads, the \
shared RoPE key's gradient summed over the heads piece by piece) at tp 2 x ep 2 with ZeRO-2 and --recompute attention" \
    ds4 ds1
run ds4_resumed 4 "${deepseek[@]}" --tp 4 --resume "$dir/ds4/step-00000004"
same_as "its step 4 resumed at tp 4 (one head a rank)" ds4_resumed ds1 5
# DeepSeek-V2 (softmax greedy routing, q_proj, V2-Lite's YaRN): its files keep RoPE's rows interleaved, written so and
# read back (checkpoint/write.c); at tp 2 x ep 2, and resumed from step 4 at tp 1, bitwise the 1-rank run
deepseek_v2=(--family deepseek_v2 --head-dim 12 --qk-rope-dim 4 --v-head-dim 6 --kv-lora-rank 16 --renormalize 0
             --routed-scaling 1.5 --shared-d-ff 16 --yarn-factor 40 --yarn-original-positions 4096 --yarn-mscale 0.707
             --yarn-mscale-all-dim 0.707 --norm-eps 1e-6 --capacity-factor 0) # dropless: what transformers computes
run dsv2_one 1 "${deepseek_v2[@]}"
grep -q '"DeepseekV2ForCausalLM"' "$dir/dsv2_one/step-00000004/config.json" ||
    { echo "FAIL: the DeepSeek-V2 run's checkpoint is not labelled DeepseekV2ForCausalLM"; failures=$((failures + 1)); }
run dsv2_tp2 4 "${deepseek_v2[@]}" --tp 2 --ep 2
same_as "DeepSeek-V2 (interleaved RoPE rows in its files) at tp 2 x ep 2" dsv2_tp2 dsv2_one
run dsv2_resumed 1 "${deepseek_v2[@]}" --resume "$dir/dsv2_tp2/step-00000004"
same_as "its step 4 (RoPE's rows interleaved on save, back on load) resumed on 1 rank" dsv2_resumed dsv2_one 5
yarn=(--yarn-factor 40 --yarn-original-positions 4096 --yarn-mscale 1 --yarn-mscale-all-dim 0.8)
run ds3_one 1 "${deepseek[@]}" --layers 3 --first-dense-layers 1 "${yarn[@]}"
run ds3_pp2tp2 4 "${deepseek[@]}" --layers 3 --first-dense-layers 1 --pp 2 --first-stage-layers 1 --tp 2 "${yarn[@]}"
same_as "a 3-layer DeepSeek-V3 (a dense first layer) with YaRN (its RoPE and MLA's softmax factor) in 2 stages of 1 \
and 2 layers (--first-stage-layers) x tp 2" ds3_pp2tp2 ds3_one

# routing traces: recorded at tp 2 (each rank's slice of the tokens, gathered in stage order), the 1-rank run's file
# byte for byte; replayed at tp 2 (each rank forcing its slice's choices), another run's trace changes the training
if cmp -s "$dir/one.trace" "$dir/tp2.trace"; then
    echo "ok: the routing trace recorded at tp 2 is the 1-rank run's, byte for byte"
else
    echo "FAIL: the routing trace recorded at tp 2 differs from the 1-rank run's"
    failures=$((failures + 1))
fi
run seed2 1 --seed 2 --routing-trace-out "$dir/seed2.trace"
run tp2_replay_seed2 2 --tp 2 --routing-trace-in "$dir/seed2.trace"
run one_replay_seed2 1 --routing-trace-in "$dir/seed2.trace"
same_as "tp 2 replaying another run's trace (each rank its slice's choices)" tp2_replay_seed2 one_replay_seed2
if [ "$(losses "$dir/one_replay_seed2.jsonl")" != "$(losses "$dir/one.jsonl")" ]; then
    echo "ok: replaying another run's trace trains differently (the replay is used)"
else
    echo "FAIL: replaying seed 2's trace gave the 1-rank run's losses: the replay is not used"
    failures=$((failures + 1))
fi

# --verify-steps: a bf16 run at tp 2 against the fp32 reference at tp 2 in the same processes (what a GPU run does)
merge --tp 2 --precision bf16 --verify-steps 2 --steps 2
if timeout 300 "$mpirun" -np 2 "$train" "${merged[@]}" > "$dir/verify.txt" 2>&1 &&
    grep -q "^verify step 2: " "$dir/verify.txt"; then
    echo "ok: bf16 at tp 2 verified against the fp32 reference: $(grep '^verify step 2: ' "$dir/verify.txt")"
else
    cp "$dir/verify.txt" "$dir/out.txt"
    fail_with_output "--tp 2 --verify-steps 2: no 'verify step 2' line"
fi

# the check can fail: each rank's block one piece adds the sums in another order
run plain 2 --tp 2 --tp-shards 2
if [ -n "$(losses "$dir/plain.jsonl")" ] && [ "$(losses "$dir/plain.jsonl")" != "$(losses "$dir/one.jsonl")" ]; then
    echo "ok: --tp-shards 2 (the plain split) gives other losses than --tp-shards 4"
else
    echo "FAIL: the plain split gave the same losses: the comparison cannot fail"
    failures=$((failures + 1))
fi

refuses "--tp 3 must divide the ranks of a stage" --tp 3
refuses "tp and the number of kv heads: one must divide the other" --tp 2 --heads 6 --d-model 24 --kv-heads 3
refuses "--tp 2 must divide --seq-len 15" --tp 2 --seq-len 15
refuses "tp_shards must divide d_ff" --tp 2 --moe-every 2 --d-ff 18
refuses "tp_shards must divide the vocabulary size \(pad the vocabulary" --tp 2 --vocab 257
refuses "tp_shards must be a power of two that tp divides" --tp 2 --tp-shards 1
finish test_tp_cli
