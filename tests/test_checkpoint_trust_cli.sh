#!/bin/bash
# test_checkpoint_trust_cli.sh MPIRUN MOE_TRAIN TEXT_TO_TOKENS EXPECT_FAILURE — checkpoints nobody can mix up (issue 25),
# on 2 ranks, each case one that main @ 203d493 got wrong:
#   R3  newest is the highest step: a checkpoint saved with a clock ahead is not "latest", and --keep-last keeps the
#       real newest;
#   R4  an unreadable manifest.json in an old step directory is passed over with a warning naming it: --resume latest,
#       naming the newest, and a run that saves and prunes beside it all go on (and it is not deleted);
#   R5  the manifest binds every file: a training state of another step, weights of another run of the same shape and
#       a BF16 header relabelled F16 (same length) are refused, naming the file;
#   R11 a second moment below zero (a valid file, checksums right) is refused naming the file and the tensor;
#   R10 with --skip-nonfinite 1 and every step non-finite (an expert at 1e20), the run stops after
#       --max-skipped-steps in a row, and no checkpoint is published of a step whose update was dropped;
#   R12 an empty step directory is passed over as "not a checkpoint", not called another run's checkpoints;
#   R13 (a probe of checkpoint files, 2026-12-07) a DeepSeek-V3's selection biases: NaN in the weights' copy
#       (transformers') refused by --init-from, Inf in the training state's refused by --resume, and a weights' copy
#       that differs from the state's refused by --resume (it used to load silently; the run failed at its first save);
#       a header length past the end of the file named as such (it was called checksum ffffffffffffffff);
#   issue 49 (2): one that cannot be used, newer than the step a run starts from, refuses the run before training.
. "$(dirname "$0")/train_cli_common.sh"
edit="$(dirname "$0")/safetensors_edit.py"

step_dir() { printf '%s/step-%08d' "$1" "$2"; }
saved_at() { sed -n 's/.*"saved_at_ns": \([0-9]*\).*/\1/p' "$1/manifest.json"; } # DIR
run_of() { grep -o '"run_id": "[^"]*"' "$1/manifest.json"; }                        # DIR

ck="$dir/ck"
trains "a run saves at 4, 8, 12" "^step    12" --steps 12 --checkpoint-dir "$ck" --checkpoint-interval 4 --keep-last 0

# R3: step 4's manifest says it was saved a day after step 12 (a node's clock ahead)
cp -r "$ck" "$dir/skew"
s4=$(step_dir "$dir/skew" 4)
sed -i "s/\"saved_at_ns\": [0-9]*/\"saved_at_ns\": $(($(saved_at "$(step_dir "$dir/skew" 12)") + 86400000000000))/" \
    "$s4/manifest.json"
trains "latest is the highest step, not the latest clock" "resumed from .*skew/step-00000012 after step 12" \
    --steps 16 --resume --checkpoint-dir "$dir/skew" --checkpoint-interval 2 --keep-last 2
for s in 14 16; do [ -d "$(step_dir "$dir/skew" $s)" ] || fail_with_output "--keep-last 2 pruned step $s"; done
for s in 4 8 12; do [ ! -e "$(step_dir "$dir/skew" $s)" ] || fail_with_output "--keep-last 2 kept step $s"; done

# a manifest that lists no file vouches for none (mutation testing, 2026-12-07: read as "no manifest", every file
# loaded unverified)
mkdir -p "$dir/unlisted" && cp -r "$(step_dir "$ck" 4)" "$dir/unlisted/"
python3 -c 'import json, sys; m = json.load(open(sys.argv[1])); m["files"] = m["crc32c"] = m["header_crc32c"] = {}
json.dump(m, open(sys.argv[1], "w"))' \
    "$(step_dir "$dir/unlisted" 4)/manifest.json"
refuses "step-00000004/[a-z_.]* is not in the checkpoint's manifest.json" --steps 6 \
    --init-from "$(step_dir "$dir/unlisted" 4)"

# R4: an unreadable manifest in an old step directory
cp -r "$ck" "$dir/bad"
echo "not json {" > "$(step_dir "$dir/bad" 4)/manifest.json"
trains "--resume latest passes over it" "warning: .*bad/step-00000004 is skipped: .*manifest.json: not JSON" \
    --steps 12 --resume --checkpoint-dir "$dir/bad"
trains "naming the newest" "resumed from .*bad/step-00000012 after step 12" --steps 14 \
    --resume "$(step_dir "$dir/bad" 12)" --checkpoint-dir "$dir/bad" --keep-last 1
[ -d "$(step_dir "$dir/bad" 14)" ] && [ ! -e "$(step_dir "$dir/bad" 12)" ] ||
    fail_with_output "the run beside it did not save step 14 and prune step 12"
[ -d "$(step_dir "$dir/bad" 4)" ] || fail_with_output "the unreadable step directory was deleted"

# issue 49, 2: an unreadable manifest in the newest step directory: refused before training, naming it and what to
# do (it warned, trained from step 8, then every save reaching step 12 failed: each requeue lost an interval);
# the only step directory is named too; once moved aside as the message says, the run resumes
cp -r "$ck" "$dir/trap"
echo "not json {" > "$(step_dir "$dir/trap" 12)/manifest.json"
refuses "trap/step-00000012 cannot be used as a checkpoint .*not JSON.*; it is the newest step directory.*mv .*trap/step-00000012 .*trap/damaged-step-00000012" \
    --steps 16 --resume --checkpoint-dir "$dir/trap" --checkpoint-interval 4
refuses "trap/step-00000012 cannot be used as a checkpoint .*its step is after the one this run starts from \(8\)" \
    --steps 16 --resume "$(step_dir "$dir/trap" 8)" --checkpoint-dir "$dir/trap" --checkpoint-interval 4
mv "$(step_dir "$dir/trap" 12)" "$dir/trap/damaged-step-00000012"
trains "the run after the damaged step was moved aside" "resumed from .*trap/step-00000008 after step 8" \
    --steps 12 --resume --checkpoint-dir "$dir/trap" --checkpoint-interval 4
mkdir -p "$dir/only" && cp -r "$(step_dir "$dir/trap" 12)" "$dir/only/" && echo "{" > "$(step_dir "$dir/only" 12)/manifest.json"
refuses "only/step-00000012 cannot be used as a checkpoint .*it is the only step directory" --steps 16 --resume \
    --checkpoint-dir "$dir/only"

# issue 49: a file the manifest lists, missing, is named as missing (it said "-1 bytes"); config.json edited to 3
# layers is named by the manifest check, before a rule of the layout (--pp 2 must divide the layers) refuses it
cp -r "$ck" "$dir/missing" && rm "$(step_dir "$dir/missing" 12)/train_state.safetensors"
refuses "missing/step-00000012/train_state.safetensors is missing or not a regular file: the manifest lists it" \
    --steps 14 --resume "$(step_dir "$dir/missing" 12)"
trains "a 2-layer run at --pp 2" "^step     2" --layers 2 --pp 2 --checkpoint-dir "$dir/edited"
sed -i 's/"num_hidden_layers": 2/"num_hidden_layers": 3/' "$(step_dir "$dir/edited" 2)/config.json"
refuses "edited/step-00000002/config.json: its bytes have checksum .*, the manifest says" --steps 4 --layers 3 --pp 2 \
    --resume "$(step_dir "$dir/edited" 2)"

# R5: files put in the place of others, each refused by name
cp -r "$ck" "$dir/swap"
cp "$(step_dir "$ck" 8)/train_state.safetensors" "$(step_dir "$dir/swap" 12)/"
# (by its header's checksum, or, where the other step's metadata is longer by a padding step, by its size)
refuses "step-00000012/train_state.safetensors: (its header .* the manifest says .*another step or run|[0-9]+ bytes, the manifest says [0-9]+)" --steps 14 \
    --resume "$(step_dir "$dir/swap" 12)"
trains "another run of the same shape" "^step     4" --steps 4 --seed 7 --checkpoint-dir "$dir/other"
cp -r "$ck" "$dir/mixed"
cp "$(step_dir "$dir/other" 4)/model.safetensors" "$(step_dir "$dir/mixed" 4)/"
refuses "step-00000004/model.safetensors: its header .* the manifest says" --steps 8 --resume "$(step_dir "$dir/mixed" 4)"
trains "a bf16 export" "^step     4" --steps 4 --checkpoint-dir "$dir/bf16" --save-dtype bf16
relabelled="$(step_dir "$dir/bf16" 4)"
perl -0777 -pi -e 's/"dtype":"BF16"/"dtype":"F16" /g' "$relabelled/model.safetensors"
refuses "step-00000004/model.safetensors: its header .* the manifest says" --steps 8 --init-from "$relabelled"

# R11: a negative second moment in a well-formed state (no manifest: another tool's checkpoint, checked on its own)
cp -r "$(step_dir "$ck" 8)" "$dir/negative"
rm "$dir/negative/manifest.json"
python3 "$edit" "$dir/negative/train_state.safetensors" exp_avg_sq.model.norm.weight -0.5 ||
    fail_with_output "safetensors_edit.py failed"
refuses "negative/train_state.safetensors: exp_avg_sq.model.norm.weight\[0\] is -0.5: a second moment .* cannot be negative" \
    --steps 12 --resume "$dir/negative"

# R12: an empty step directory beside a run's checkpoints
cp -r "$ck" "$dir/empty" && mkdir "$(step_dir "$dir/empty" 2)"
trains "an empty step directory passed over" "empty/step-00000002 is skipped: an empty directory, not a checkpoint" \
    --steps 14 --resume --checkpoint-dir "$dir/empty"
[ "$(run_of "$(step_dir "$dir/empty" 14)")" = "$(run_of "$(step_dir "$ck" 12)")" ] ||
    fail_with_output "the run did not continue as itself beside the empty directory"

# R10: weights that overflow in every step (expert 0's w1 and w2 at 1e20: finite, so they load)
cp -r "$(step_dir "$ck" 4)" "$dir/overflow"
rm "$dir/overflow/manifest.json"
for w in w1 w2; do
    python3 "$edit" "$dir/overflow/model.safetensors" "model.layers.0.block_sparse_moe.experts.0.$w.weight" 1e20 ||
        fail_with_output "safetensors_edit.py failed"
done
refuses "3 steps in a row were dropped as non-finite \(--max-skipped-steps 3\)" --steps 10 --init-from "$dir/overflow" \
    --skip-nonfinite 1 --max-skipped-steps 3 --checkpoint-dir "$dir/dropped" --checkpoint-interval 1 \
    --log-file "$dir/dropped.jsonl"
# the dropped steps' records are JSON (strict: no NaN or Infinity), their non-finite values null (a probe: "inf")
python3 -c '
import json, sys
def refuse(name): raise ValueError("not JSON: " + name)
records = [json.loads(line, parse_constant=refuse) for line in open(sys.argv[1])]
steps = [r for r in records if "step" in r]
assert len(steps) == 3 and all(r.get("skipped") for r in steps), steps
assert any(r["grad_norm"] is None or r["loss"] is None for r in steps), steps
' "$dir/dropped.jsonl" && echo "ok: the dropped steps' metrics records are JSON" ||
    fail_with_output "the dropped steps' metrics records: $(head -c 600 "$dir/dropped.jsonl")"
# a save due at a dropped step waits (the run then ends at the final evaluation, which the overflow fails)
refuses "step 2's update was dropped: its checkpoint waits for the next step that updates" --steps 4 \
    --init-from "$dir/overflow" --skip-nonfinite 1 --checkpoint-dir "$dir/dropped" --checkpoint-interval 2
[ -z "$(ls "$dir/dropped" | grep step-)" ] || fail_with_output "checkpoints of dropped steps: $(ls "$dir/dropped")"
# ... but for the run's end: a stop at a dropped step saves what the run has, the last applied update's weights (a
# probe, 2026-12-07: waiting for a step that never came lost every step since the last save, and the run exited 0)
merge --steps 100000 --init-from "$dir/overflow" --skip-nonfinite 1 --max-skipped-steps 100000 \
    --checkpoint-dir "$dir/dropped_end" --eval-interval 0
rm -f "$dir/end.txt" # its own file: the last run's output in out.txt has a step 3 before the redirect empties it
timeout 120 "$train" "${merged[@]}" > "$dir/end.txt" 2>&1 &
job=$!
for _ in $(seq 600); do grep -q "^step     3 " "$dir/end.txt" 2> /dev/null && break; sleep 0.1; done
kill -TERM $job
rc=0
wait $job || rc=$?
cp "$dir/end.txt" "$dir/out.txt"
[ $rc = 143 ] && grep -q "update was dropped, and the run ends here: its checkpoint holds the last applied" \
    "$dir/out.txt" && [ -n "$(ls "$dir/dropped_end" | grep step-)" ] &&
    echo "ok: a stop at a dropped step saved $(ls "$dir/dropped_end" | grep step-)" ||
    fail_with_output "a stop at a dropped step: exit $rc, saved: $(ls "$dir/dropped_end")"

# evaluation of weights whose attention overflows (layer 0's v and o projections at 1e30): the checked re-run names
# the op, not the next router; under a pipeline the first stage's router stops it at once (a review, 2026-12-08: the
# re-run's exchange waited for a stage still expecting activations, until the watchdog)
trains "a 2-layer checkpoint" "^step     1" --layers 2 --steps 1 --checkpoint-dir "$dir/two_layers"
cp -r "$(step_dir "$dir/two_layers" 1)" "$dir/attn_overflow" && rm "$dir/attn_overflow/manifest.json"
for w in v_proj o_proj; do
    python3 "$edit" "$dir/attn_overflow/model.safetensors" "model.layers.0.self_attn.$w.weight" 1e30 ||
        fail_with_output "safetensors_edit.py failed"
done
refuses "validation: a non-finite value: layer 0: the residual after attention \(o_proj\) holds the first NaN" \
    --init-from "$dir/attn_overflow" --eval-only 1 --layers 2
refuses "validation failed: layer 0, world rank 0: router logit of token [0-9]+, expert [0-9]+ is" \
    --init-from "$dir/attn_overflow" --eval-only 1 --layers 2 --pp 2

# R14: a finite gradient whose squares pass fp32's range (the final norm at 1e25, lm_head at 1e-25: finite logits):
# with --clip 0 AdamW's second moments would turn Inf and freeze those weights, silently (a probe); a non-finite step
cp -r "$(step_dir "$ck" 4)" "$dir/huge" && rm "$dir/huge/manifest.json"
python3 "$edit" "$dir/huge/model.safetensors" model.norm.weight 1e25 &&
    python3 "$edit" "$dir/huge/model.safetensors" lm_head.weight 1e-25 || fail_with_output "safetensors_edit.py failed"
refuses "step 1: gradient norm [0-9.e+]+: squares of its values could pass fp32's range" --steps 6 \
    --init-from "$dir/huge" --clip 0

# R13: a DeepSeek-V3's selection biases (sigmoid scores), kept in its weights and in the training state
v3=(--family deepseek_v3 --score sigmoid --bias-update-rate 0.01)
trains "a DeepSeek-V3 with sigmoid scores saves" "^step     2" "${v3[@]}" --checkpoint-dir "$dir/v3"
bias=model.layers.0.mlp.gate.e_score_correction_bias
for case in nan inf differs; do
    cp -r "$(step_dir "$dir/v3" 2)" "$dir/v3_$case" && rm "$dir/v3_$case/manifest.json"
done
python3 "$edit" "$dir/v3_nan/model.safetensors" "$bias" nan &&
    python3 "$edit" "$dir/v3_inf/train_state.safetensors" expert_bias.layers.0 inf &&
    python3 "$edit" "$dir/v3_differs/model.safetensors" "$bias" 5 || fail_with_output "safetensors_edit.py failed"
refuses "v3_nan/model.safetensors: $bias\[0\] is nan: a selection bias must be finite" "${v3[@]}" \
    --init-from "$dir/v3_nan" --eval-only 1
refuses "v3_inf/train_state.safetensors: expert_bias.layers.0\[0\] is inf: a selection bias must be finite" \
    "${v3[@]}" --steps 4 --resume "$dir/v3_inf"
refuses "v3_differs/model.safetensors: $bias differs from the training state's expert_bias.layers.0" "${v3[@]}" \
    --steps 4 --resume "$dir/v3_differs"

# R13: a header length (the first 8 bytes) past the end of the file, the manifest as saved
cp -r "$(step_dir "$dir/v3" 2)" "$dir/v3_length"
printf '\001' | dd of="$dir/v3_length/model.safetensors" bs=1 seek=6 conv=notrunc status=none
refuses "v3_length/model.safetensors: its header's length \(the first 8 bytes\) points past the end of the file" \
    "${v3[@]}" --init-from "$dir/v3_length" --eval-only 1

finish test_checkpoint_trust_cli
