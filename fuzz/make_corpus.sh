#!/usr/bin/env bash
# make_corpus.sh — regenerates the seed corpus under fuzz/corpus/ from real files: token files made by
# moe-text-to-tokens, then a few steps of moe-train on a tiny model that saves a checkpoint (model and train
# state safetensors, config.json, manifest.json) and writes routing traces; flag lines from the README and docs.
#   bash fuzz/make_corpus.sh [BUILD_DIR]     (default build/; needs moe-train and moe-text-to-tokens built there)
# Replaces only the seed files (seed-*); the inputs that found defects (crash-*: found by the fuzzer,
# regression-*: written by hand, docs/FUZZING.md) stay.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$(cd "${1:-$root/build}" && pwd)"
corpus="$root/fuzz/corpus"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$root/scripts/mpi_env.sh"
cd "$work"

# text whose bytes are all below 64 (digits, punctuation, space, newline), so --vocab 64 holds every token
for i in $(seq 1 40); do echo "$((i * i)), $((i * 7919 % 1000)); $((i + 3))-$((i * 2))."; done > text.txt
"$build/moe-text-to-tokens" text.txt train.bin val.bin 0.25 > /dev/null

# the tiny runs of fuzz/fuzz_util.c (kTinyFlags, which must match): every file below stays a few KB
tiny=(--layers 1 --d-model 8 --heads 2 --kv-heads 2 --d-ff 8 --experts 2 --top-k 1 --seq-len 8 --batch 2 --vocab 64)
run=(--steps 3 --warmup 1 --eval-batches 1 --sample-tokens 0 --train-data train.bin --val-data val.bin)
mpirun -np 1 "$build/moe-train" "${tiny[@]}" "${run[@]}" --checkpoint-dir ckpt --checkpoint-interval 2 \
    --routing-trace-out trace_k1.bin > train_k1.log
# the same model saved in shards of at most 1 KB: its model.safetensors.index.json
mpirun -np 1 "$build/moe-train" "${tiny[@]}" "${run[@]}" --checkpoint-dir ckpt_shards --save-shard-size 1KB \
    > train_shards.log
# a second run with top-2 of 4 experts, sigmoid scores, tied embeddings and two layers (the second one MoE)
k2=(--layers 2 --d-model 4 --heads 2 --kv-heads 2 --d-ff 4 --experts 4 --top-k 2 --seq-len 8 --batch 2 --vocab 64
    --score sigmoid --moe-every 2 --tie-embeddings 1)
mpirun -np 1 "$build/moe-train" "${k2[@]}" "${run[@]}" --checkpoint-dir ckpt_k2 --routing-trace-out trace_k2.bin \
    > train_k2.log

for t in safetensors safetensors_index train_state step config manifest token_file routing_trace train_options; do
    mkdir -p "$corpus/$t"
    rm -f "$corpus/$t"/seed-*
done
cp ckpt/step-00000003/model.safetensors "$corpus/safetensors/seed-model-k1.safetensors"
cp ckpt_k2/step-00000003/model.safetensors "$corpus/safetensors/seed-model-k2.safetensors"
cp ckpt_shards/step-00000003/model.safetensors.index.json "$corpus/safetensors_index/seed-index-k1.json"
cp ckpt/step-00000003/train_state.safetensors "$corpus/train_state/seed-train-state-k1.safetensors"
cp ckpt_k2/step-00000003/train_state.safetensors "$corpus/train_state/seed-train-state-k2.safetensors"
# the step texts of the train states' metadata, as the loader hands them to moe__checkpoint_parse_step
step_text() { # FILE KEY: the string value of KEY in the safetensors header's __metadata__
    python3 -c 'import json, struct, sys; b = open(sys.argv[1], "rb").read(); n = struct.unpack("<Q", b[:8])[0]
sys.stdout.write(json.loads(b[8:8 + n])["__metadata__"][sys.argv[2]])' "$1" "$2"
}
step_text ckpt/step-00000002/train_state.safetensors step > "$corpus/step/seed-step-2.txt"
step_text ckpt/step-00000003/train_state.safetensors step > "$corpus/step/seed-step-3.txt"
step_text ckpt_k2/step-00000003/train_state.safetensors micro_batches_done > "$corpus/step/seed-micro-batches-done.txt"
cp ckpt/step-00000003/config.json "$corpus/config/seed-config-k1.json"
cp ckpt_k2/step-00000003/config.json "$corpus/config/seed-config-k2.json"
cp ckpt/step-00000002/manifest.json "$corpus/manifest/seed-manifest-step2.json"
cp ckpt_k2/step-00000003/manifest.json "$corpus/manifest/seed-manifest-k2.json"
cp train.bin "$corpus/token_file/seed-train.bin"
cp val.bin "$corpus/token_file/seed-val.bin"
cp trace_k1.bin "$corpus/routing_trace/seed-trace-k1.bin"
cp trace_k2.bin "$corpus/routing_trace/seed-trace-k2.bin"

# flag lines: moe-train's flags from the README, docs/TRAINING.md and tests/test_train_cli.sh, one per file
n=0
flag_line() { n=$((n + 1)); printf '%s\n' "$*" > "$corpus/train_options/seed-flags-$(printf %02d $n).txt"; }
flag_line --train-data data/kjv_train.bin --val-data data/kjv_val.bin --experts 8 --top-k 2 --ep 2 --steps 300 \
    --log-file metrics.jsonl
flag_line --checkpoint-dir ckpt --checkpoint-interval 100 --keep-last 3
flag_line --checkpoint-dir ckpt --resume --ep 2
flag_line --init-from ckpt/step-00000400 --eval-only 1
flag_line "${tiny[@]}" "${run[@]}" --checkpoint-dir ckpt --checkpoint-interval 2 --routing-trace-out trace_k1.bin
flag_line "${k2[@]}" "${run[@]}" --checkpoint-dir ckpt_k2 --routing-trace-out trace_k2.bin
flag_line --layers 2 --d-model 64 --heads 4 --kv-heads 2 --d-ff 96 --experts 4 --top-k 2 --seq-len 32 --vocab 256 \
    --rope-theta 10000.0 --tie-embeddings 0 --batch 4 --train-data train.bin --val-data val.bin --init-from \
    ckpt/step-00000020 --eval-only 1 --eval-batches 2 --dump-logits ours.f32
flag_line --layers 1 --d-model 16 --heads 2 --kv-heads 2 --d-ff 16 --seq-len 16 --experts 4 --top-k 2 --batch 2 \
    --steps 2 --warmup 1 --eval-batches 1 --sample-tokens 0 --exchange-timeout 20 --capacity-factor 1.25 \
    --drop-priority score --zero 1 --skip-nonfinite 1 --routing-trace-in trace.bin --sample-prompt ''
du -b "$corpus"/* | sed "s|$root/||"
