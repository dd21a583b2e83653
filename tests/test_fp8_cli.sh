#!/bin/bash
# test_fp8_cli.sh MPIRUN MOE_TRAIN TEXT_TO_TOKENS EXPECT_FAILURE — DeepSeek-V3's released checkpoint format
# (checkpoint/fp8.h) read by --init-from: a small DeepSeek-V3 trained here is made by tests/fp8_blocks.py into FP8
# weights with block scales of 16 x 8 (partial blocks at the edges; rows and columns told apart), two shards with the
# scales apart from their weights, and a multi-token prediction layer; and into the F32 weights those files mean
# (decoded and scaled by the script's own formula). --eval-only from each gives the same validation loss and logits,
# bit for bit, on 2 ranks; the FP8 weights are not the trained ones (the quantization shows); refusals name the key or
# the tensor.
. "$(dirname "$0")/train_cli_common.sh"
blocks="$(dirname "$0")/fp8_blocks.py"
deepseek=(--family deepseek_v3 --layers 2 --d-model 32 --heads 4 --kv-heads 4 --head-dim 12 --qk-rope-dim 4
          --v-head-dim 6 --kv-lora-rank 16 --q-lora-rank 12 --d-ff 16 --experts 4 --top-k 2 --score sigmoid
          --renormalize 1 --shared-d-ff 16 --first-dense-layers 1 --dense-d-ff 24 --norm-eps 1e-6)
trains "a DeepSeek-V3 trains 2 steps" "^step     2" "${deepseek[@]}" --checkpoint-dir "$dir/ck"
python3 "$blocks" "$dir/ck/step-00000002" "$dir/fp8" "$dir/ref" 16 8 > "$dir/out.txt" 2>&1 ||
    fail_with_output "fp8_blocks.py failed"

# --init-from takes the architecture from config.json: these runs give no shape flag
data=(--seq-len 16 --batch 2 --eval-batches 1 --sample-tokens 0 --exchange-timeout 20 --train-data "$dir/train.bin"
      --val-data "$dir/val.bin")
eval_of() { # NAME DIR: --eval-only from DIR, its loss line in $dir/NAME.txt and its logits in $dir/NAME.logits
    timeout 120 "$mpirun" -np 2 "$train" "${data[@]}" --init-from "$2" --eval-only 1 --dump-logits "$dir/$1.logits" \
        > "$dir/$1.txt" 2>&1
    grep -o 'eval: val_loss [0-9.]*' "$dir/$1.txt"
}
fp8=$(eval_of fp8 "$dir/fp8") ref=$(eval_of ref "$dir/ref") trained=$(eval_of trained "$dir/ck/step-00000002")
if [ -n "$fp8" ] && [ "$fp8" = "$ref" ] && cmp -s "$dir/fp8.logits" "$dir/ref.logits"; then
    echo "ok: the FP8 checkpoint (block scales, shards, an MTP layer skipped) evaluates as its F32 meaning: $fp8"
else
    cp "$dir/fp8.txt" "$dir/out.txt"
    fail_with_output "FP8 '$fp8' against its F32 meaning '$ref' (or the logits differ)"
fi
if [ -n "$trained" ] && ! cmp -s "$dir/fp8.logits" "$dir/trained.logits"; then
    echo "ok: the FP8 weights are not the trained ones ($trained before quantization)"
else
    fail_with_output "the quantized model's logits are the trained model's: nothing was quantized"
fi

refuses_init() { # PATTERN DIR: --init-from DIR --eval-only fails fast with a line matching PATTERN
    if ! "$expect_failure" "$1" 60 "$mpirun" -np 2 "$train" "${data[@]}" --init-from "$2" --eval-only 1 \
        > "$dir/out.txt" 2>&1; then
        fail_with_output "--init-from $2 did not refuse with /$1/"
    else
        echo "ok: refused with: $(grep -E -e "$1" "$dir/out.txt" | head -n 1)"
    fi
}

# refusals: FP8 tensors without quantization_config; a scale missing from the index; a scale beside an F32 weight;
# another quantization method
cp -r "$dir/fp8" "$dir/no_config"
python3 -c "import json, sys; p = sys.argv[1]; c = json.load(open(p)); del c['quantization_config']
json.dump(c, open(p, 'w'))" "$dir/no_config/config.json"
refuses_init "is F8_E4M3 but config.json has no quantization_config" "$dir/no_config"
python3 "$blocks" "$dir/ck/step-00000002" "$dir/no_scale" "$dir/ref2" 16 8 \
    model.layers.1.self_attn.o_proj.weight_scale_inv > "$dir/out.txt" 2>&1 || fail_with_output "fp8_blocks.py failed"
refuses_init "o_proj.weight is F8_E4M3 but .*o_proj.weight_scale_inv \(its block scales\) is missing" "$dir/no_scale"
python3 "$blocks" "$dir/ck/step-00000002" "$dir/plain" "$dir/ref3" 16 8 "" \
    model.layers.1.self_attn.o_proj.weight > "$dir/out.txt" 2>&1 || fail_with_output "fp8_blocks.py failed"
refuses_init "o_proj.weight_scale_inv is a block scale, but .*o_proj.weight is stored as F32" "$dir/plain"
cp -r "$dir/fp8" "$dir/int8"
sed -i 's/"quant_method": "fp8"/"quant_method": "bitsandbytes"/' "$dir/int8/config.json"
refuses_init "quantization_config.quant_method must be \"fp8\"" "$dir/int8"
finish test_fp8_cli
