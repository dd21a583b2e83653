#!/bin/bash
# test_checkpoint_cli.sh MPIRUN MOE_TRAIN TEXT_TO_TOKENS EXPECT_FAILURE — moe-train's checkpoints as a user
# meets them, on 2 ranks (issue 12): a saved step that is not a step number, a checkpoint beyond --steps, a
# fresh run into a directory of another run, a resume from an older checkpoint (a fork: refused in its parent's
# directory, where its saves would replace the parent's newer ones; elsewhere --keep-last prunes only the fork's
# own checkpoints), and a --checkpoint-dir path longer than any fixed buffer; issue 16: a
# --save-dtype bf16 export (BF16 weights, no moments: no training state, or under sigmoid routing the
# selection biases alone; --init-from takes it, --resume refuses it) and a --save-shard-size save (shards + index,
# every file in the manifest, the same eval loss as one file, resumable, the size inherited by --resume, written
# by --print-config and read by --config; a missing shard and an altered index refused).
. "$(dirname "$0")/train_cli_common.sh"

ck="$dir/ck"
step_dir() { printf '%s/step-%08d' "$1" "$2"; }
run_of() { grep -o '"run_id": "[^"]*"' "$1/manifest.json"; } # DIR

trains "a run saves at 4, 8, 12" "^step    12" --steps 12 --checkpoint-dir "$ck" --checkpoint-interval 4 --keep-last 0
for s in 4 8 12; do [ -d "$(step_dir "$ck" $s)" ] || fail_with_output "step $s was not saved"; done
first_run=$(run_of "$(step_dir "$ck" 12)")
# the directory of checkpoints named where one checkpoint is meant (a probe: "DIR/config.json: cannot open")
refuses "--init-from .* holds checkpoints \(step-NNNNNNNN folders\), not one: give one of them \(the newest is \
.*step-00000012\)" --init-from "$ck"

# the saved step, edited to what is not a step number (same length: the header stays valid). The manifest binds
# the header (issue 25): refused as altered; without the manifest (another tool's directory) the step's own parse
# refuses it
for bad in -1 ab; do
    cp -r "$(step_dir "$ck" 12)" "$dir/bad$bad"
    perl -0777 -pi -e "s/\"step\":\"12\"/\"step\":\"$bad\"/" "$dir/bad$bad/train_state.safetensors"
    refuses "train_state.safetensors: its header .* checksum .*, the manifest says" --steps 20 --resume "$dir/bad$bad"
    rm "$dir/bad$bad/manifest.json"
    refuses "the saved step '$bad' is not a step number" --steps 20 --resume "$dir/bad$bad"
done
refuses "the checkpoint is at step 12, beyond --steps 8" --steps 8 --resume --checkpoint-dir "$ck"
# --eval-only reads no training data: a --train-data that does not exist (the default's relative path, from another
# folder) is not opened, and a resumed checkpoint past --steps evaluates (before: both refused; probes)
trains "--eval-only without training data" "^eval: val_loss" --eval-only 1 --init-from "$(step_dir "$ck" 12)" \
    --train-data "$dir/no_such_train.bin"
# --eval-only beside --checkpoint-dir alone evaluated fresh weights, unsaid (a probe): refused, pointing to --resume
refuses "--eval-only evaluates the weights --resume or --init-from loads; --checkpoint-dir only names where saves go" \
    --eval-only 1 --checkpoint-dir "$ck"
trains "--eval-only of fresh weights, noted" "^note: --eval-only without --resume or --init-from evaluates freshly" \
    --eval-only 1
trains "--eval-only of a resumed checkpoint past --steps" "^eval: val_loss" --eval-only 1 --steps 8 \
    --resume "$(step_dir "$ck" 12)" --train-data "$dir/no_such_train.bin"
# an option the training state's fingerprint holds, changed on --resume: refused by name before anything loads
# (before: "resume: --seed 7 (the saved run had ...)" as if taken, then "training state from another run" and two
# long lists to compare)
refuses "--resume latest: --seed 7, but the saved run trained with [0-9]+: a resume continues that run" \
    --steps 14 --resume --checkpoint-dir "$ck" --seed 7
refuses "--z-loss-coef 0.5, but the saved run trained with 0.001" --steps 14 --resume --checkpoint-dir "$ck" \
    --z-loss-coef 0.5
trains "a complete run resumed" "the run is complete at step 12" --steps 12 --resume --checkpoint-dir "$ck"
refuses "already holds another run's checkpoints .*step-00000012, run" --steps 12 --checkpoint-dir "$ck"

# a fork: resume the old step 4. Into the same directory it would reach the first run's steps 8 and 12 and replace
# them (issue 25): refused before training, nothing touched; into a directory of its own it trains, saving at 6, 9,
# 12 and keeping 1 of its own
refuses "this run resumed run [0-9a-f]+ at step 4, and --checkpoint-dir .*ck holds that run's newer checkpoint .*step-00000012 \(step 12\)" \
    --steps 12 --resume "$(step_dir "$ck" 4)" --checkpoint-dir "$ck" --checkpoint-interval 3 --keep-last 1
for s in 4 8 12; do # the first run's: all there, all its own
    [ "$(run_of "$(step_dir "$ck" $s)")" = "$first_run" ] || fail_with_output "the first run's step $s was lost"
done
trains "a resume from step 4 forks" "resumed from .*step-00000004 after step 4 \(run [0-9a-f]+, continued from run" \
    --steps 12 --resume "$(step_dir "$ck" 4)" --checkpoint-dir "$dir/fork" --checkpoint-interval 3 --keep-last 1
for s in 6 9; do [ ! -e "$(step_dir "$dir/fork" $s)" ] || fail_with_output "the fork's step $s was not pruned"; done
[ "$(run_of "$(step_dir "$dir/fork" 12)")" != "$first_run" ] || fail_with_output "the fork's step 12 is not its own"
trains "latest is the newest saved" "resumed from .*ck/step-00000012 after step 12" --steps 12 --resume \
    --checkpoint-dir "$ck"
# a copy of a checkpoint resumed without --checkpoint-dir saves beside the copy (before: into the saved run's folder,
# the original run's, where --keep-last then pruned its step 4: a probe); the change is noted
mkdir "$dir/copy" && cp -r "$(step_dir "$ck" 12)" "$dir/copy/"
trains "a copy resumed saves beside it" "^checkpoint: $dir/copy/step-00000014 saved" --steps 14 --keep-last 1 \
    --resume "$(step_dir "$dir/copy" 12)"
grep -q "^resume: --checkpoint-dir .$dir/copy. (the saved run had .$ck.)" "$dir/out.txt" ||
    fail_with_output "the resume did not note where it saves"
# ... and that its longer --steps stretches the schedule (a probe: the rate rose 5.6x, said only as a --steps change)
grep -q "^resume: step 13 trains at lr [0-9.e-]* under this schedule; the saved run's gave [0-9.e-]* at its last \
step, 12 (a longer --steps stretches the cosine: the rate rises)" "$dir/out.txt" ||
    fail_with_output "the resume did not note the stretched schedule"
[ "$(ls "$ck" | grep -c step-)" = 3 ] && [ ! -e "$(step_dir "$ck" 14)" ] ||
    fail_with_output "the original run's folder changed: $(ls "$ck")"

# what a new run from a checkpoint's weights (--init-from) takes as defaults where the checkpoint's run trained
# otherwise, and a resume's metrics log, are said (a probe: both silent)
trains "a run with --z-loss-coef 0" "^step     2" --z-loss-coef 0 --checkpoint-dir "$dir/z0" --log-file "$dir/z0.jsonl"
trains "--init-from it notes the recipe" "^note: --init-from .*z0/step-00000002: its run trained with --z-loss-coef \
0(\.0)? \(this run: 0.001\); this run takes the defaults" --init-from "$(step_dir "$dir/z0" 2)" --steps 1
trains "a resume of it notes the log" "^resume: the saved run logged metrics to .*z0.jsonl; this run keeps no metrics \
log unless --log-file is given" --resume "$(step_dir "$dir/z0" 2)" --steps 3

# --resume auto, a job script run again and again (Slurm's requeue): fresh where the folder holds no checkpoint yet
# (from --init-from's weights if given), the newest where it does (--init-from then moot); a probe: --resume latest
# refused the first start, and a requeue script needed a wrapper
mkdir -p "$dir/auto" && touch "$dir/auto/step-notes.txt" # a file, not a checkpoint (a review: it was taken for one)
"$train" --resume auto --checkpoint-dir "$dir/auto" --print-config 2> /dev/null | grep -q '"resume": "auto"' ||
    fail_with_output "--print-config did not keep --resume auto"
trains "--resume auto starts fresh" "^resume: --resume auto: .*/auto holds no checkpoint yet: a fresh run from the \
weights of" --resume auto --checkpoint-dir "$dir/auto" --steps 2 --init-from "$(step_dir "$ck" 12)"
trains "--resume auto resumes" "resumed from .*/auto/step-00000002 after step 2" --resume auto \
    --checkpoint-dir "$dir/auto" --steps 4 --init-from "$(step_dir "$ck" 12)"
grep -q "^resume: --resume auto: .*/auto holds checkpoints: the newest is resumed, and --init-from .* has no effect" \
    "$dir/out.txt" || fail_with_output "--resume auto did not note its --init-from moot"
refuses "--resume auto needs --checkpoint-dir" --resume auto

# a path of 700 characters (fixed buffers cut paths at about 580)
long="$dir"
for i in 1 2 3 4 5 6 7; do long="$long/$(printf 'a%.0s' $(seq 1 95))"; done
mkdir -p "$long"
trains "a 700-character --checkpoint-dir" "^step     2" --checkpoint-dir "$long/ck"
trains "resume from it" "resumed from .*/ck/step-00000002 after step 2" --steps 3 --resume --checkpoint-dir "$long/ck"

# --save-dtype bf16: an export of the weights
trains "a bf16 export" "^step     2" --checkpoint-dir "$dir/bf16" --save-dtype bf16
b=$(step_dir "$dir/bf16" 2)
grep -q '"dtype":"BF16"' "$b/model.safetensors" || fail_with_output "the bf16 export holds no BF16 tensor"
grep -q '"torch_dtype": "bfloat16"' "$b/config.json" ||
    fail_with_output "the bf16 export's config.json does not say torch_dtype bfloat16: $(grep torch_dtype "$b/config.json")"
[ ! -e "$b/train_state.safetensors" ] || fail_with_output "the bf16 export holds a training state"
trains "--init-from a bf16 export" "weights from .*bf16/step-00000002" --steps 1 --init-from "$b"
refuses "holds weights stored in less than F32 .*--init-from" --steps 4 --resume "$b"
# under sigmoid routing the selection biases are part of the function: the export keeps them (and no moments)
trains "a sigmoid bf16 export" "^step     2" --checkpoint-dir "$dir/bf16s" --save-dtype bf16 --score sigmoid
b=$(step_dir "$dir/bf16s" 2)
grep -q 'expert_bias.layers.0' "$b/train_state.safetensors" && ! grep -q 'exp_avg' "$b/train_state.safetensors" ||
    fail_with_output "the sigmoid bf16 export's training state is not the biases alone"
trains "--init-from a sigmoid bf16 export" "eval: val_loss" --init-from "$b" --eval-only 1
# --keep-last never prunes the run's last f32 checkpoint for bf16 exports saved after it, and keeps it besides the N
# newest (probes: a resumed run that switched to --save-dtype bf16 pruned every state it could continue from; then,
# with the f32 one counted among the N, --keep-last 1 deleted the export it had just saved)
trains "f32 saves at 1 and 2" "^step     2" --checkpoint-dir "$dir/ex" --checkpoint-interval 1 --keep-last 1
trains "resumed, exports at 3 and 4" "^step     4" --steps 4 --resume --checkpoint-dir "$dir/ex" --save-dtype bf16
[ "$(ls "$dir/ex" | grep step- | tr '\n' ' ')" = "step-00000002 step-00000004 " ] &&
    echo "ok: --keep-last 1 kept the newest export and the last f32 state (step 2)" ||
    fail_with_output "--keep-last with exports kept: $(ls "$dir/ex")"
trains "the kept f32 state resumes elsewhere" "^step     4" --steps 4 --resume "$(step_dir "$dir/ex" 2)" \
    --checkpoint-dir "$dir/ex_again"
# and in place: --resume passes over the run's exports to its f32 state, goes on as that run, saves over step 4
trains "--resume past the run's exports" "^resume: .*step-00000004 is a bf16 export, which cannot be resumed: resuming \
.*step-00000002, its run's newest f32 checkpoint" --steps 4 --resume --checkpoint-dir "$dir/ex" --save-dtype f32
cmp -s "$(step_dir "$dir/ex" 4)/model.safetensors" "$(step_dir "$dir/ex_again" 4)/model.safetensors" &&
    echo "ok: step 4 saved again in place, as the run resumed elsewhere saved it" ||
    fail_with_output "step 4 in place differs from the run resumed elsewhere"
# the step it replaced is gone, not left aside (mutation testing, 2026-12-07: a whole checkpoint's disk kept unseen)
[ -z "$(ls -A "$dir/ex" | grep '^\.old-step')" ] || fail_with_output "left aside: $(ls -A "$dir/ex")"
# a step folder linked in from an archive: pruning it removes the link, never the archive (a probe, 2026-12-07: the
# link was followed and the archive's only copy emptied)
trains "a run to archive" "^step     3" --steps 3 --checkpoint-dir "$dir/to_archive"
mkdir -p "$dir/archive" "$dir/linked" && mv "$(step_dir "$dir/to_archive" 3)" "$dir/archive/" &&
    ln -s "$dir/archive/step-00000003" "$dir/linked/step-00000003" && echo mine > "$dir/archive/step-00000003/KEEPME"
trains "resumed from the link, pruning it" "^step     5" --steps 5 --resume --checkpoint-dir "$dir/linked" \
    --checkpoint-interval 1 --keep-last 1
[ -f "$dir/archive/step-00000003/KEEPME" ] && [ -f "$dir/archive/step-00000003/model.safetensors" ] &&
    [ ! -e "$dir/linked/step-00000003" ] &&
    [ "$(ls -A "$dir/linked" | grep -v '^\.lock$' | tr '\n' ' ')" = "step-00000005 " ] &&
    echo "ok: --keep-last removed the link, not the archived step" ||
    fail_with_output "the archive after pruning its link: $(ls -la "$dir/archive/step-00000003" "$dir/linked")"

# a tensor the model has no place for, named; a tied model's file with a head of its own, said so (a probe)
add_tensor() { # FROM_DIR TO_DIR NAME [COPY_OF]: a copy, without its manifest and checksums, with one more tensor: F32
    # [2, 2] of zeros, or a copy of tensor COPY_OF
    mkdir -p "$2" && cp "$1"/config.json "$2"/ && python3 - "$1/model.safetensors" "$2/model.safetensors" "$3" \
        "${4:-}" << 'EOF'
import json, struct, sys
src, dst, name, copy_of = sys.argv[1:]
raw = open(src, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header, data = json.loads(raw[8:8 + n]), raw[8 + n:]
header["__metadata__"] = {k: v for k, v in header.get("__metadata__", {}).items() if not k.startswith("crc32c")}
if copy_of:
    begin, end = header[copy_of]["data_offsets"]
    added = data[begin:end]
    header[name] = dict(header[copy_of], data_offsets=[len(data), len(data) + len(added)])
else:
    added = bytes(16)
    header[name] = {"dtype": "F32", "shape": [2, 2], "data_offsets": [len(data), len(data) + 16]}
text = json.dumps(header).encode()
open(dst, "wb").write(struct.pack("<Q", len(text)) + text + data + added)
EOF
}
trains "a tied model" "^step     2" --checkpoint-dir "$dir/tied" --tie-embeddings 1
add_tensor "$(step_dir "$dir/tied" 2)" "$dir/tied_head" lm_head.weight
refuses "unexpected tensor lm_head.weight: config.json says tie_word_embeddings true" --init-from "$dir/tied_head" \
    --eval-only 1
# ... but one equal to the embedding, as a converter that writes both leaves it, is what the model computes with
# (transformers ties it silently; a probe, 2026-12-07: refused)
add_tensor "$(step_dir "$dir/tied" 2)" "$dir/tied_equal" lm_head.weight model.embed_tokens.weight
trains "a tied model's file with a head equal to its embedding" "eval: val_loss" --init-from "$dir/tied_equal" \
    --eval-only 1
add_tensor "$(step_dir "$dir/tied" 2)" "$dir/stray" model.stray.weight
refuses "unexpected tensor model.stray.weight \(a different model, or wrong names\)" --init-from "$dir/stray" \
    --eval-only 1

# --save-shard-size: the same run saved whole and in shards of at most 20 KB
trains "one file" "^step     2" --checkpoint-dir "$dir/whole"
# a run started from a Hugging Face folder carries its tokenizer and generation files and config.json's token ids
# into its checkpoints, and a resume of those on (a probe: a fine-tuned folder had neither)
mkdir "$dir/hf" && cp "$(step_dir "$dir/whole" 2)"/{model.safetensors,config.json} "$dir/hf/"
python3 -c 'import json, sys; p = sys.argv[1]; c = json.load(open(p)); c.update(bos_token_id=1, eos_token_id=[2, 3])
json.dump(c, open(p, "w"))' "$dir/hf/config.json"
echo '{"version": "1.0"}' > "$dir/hf/tokenizer.json" &&
    echo '{"eos_token_id": [2, 3]}' > "$dir/hf/generation_config.json"
trains "--init-from a folder with a tokenizer" "^step     2" --init-from "$dir/hf" --checkpoint-dir "$dir/tuned"
trains "resumed" "^step     4" --resume --checkpoint-dir "$dir/tuned" --steps 4
for s in 2 4; do
    t=$(step_dir "$dir/tuned" $s)
    cmp -s "$dir/hf/tokenizer.json" "$t/tokenizer.json" && cmp -s "$dir/hf/generation_config.json" \
        "$t/generation_config.json" && grep -q '"bos_token_id": 1' "$t/config.json" &&
        grep -q '"tokenizer.json"' "$t/manifest.json" && echo "ok: step $s carries the tokenizer and the token ids" ||
        fail_with_output "step $s lacks the tokenizer, generation_config.json or bos_token_id: $(ls "$t")"
done
trains "shards of 20KB" "^step     2" --checkpoint-dir "$dir/sharded" --save-shard-size 20KB
sh=$(step_dir "$dir/sharded" 2)
shards=$(ls "$sh" | grep -c '^model-0000[0-9]-of-0000[0-9]\.safetensors$')
[ "$shards" -ge 2 ] && [ -f "$sh/model.safetensors.index.json" ] && [ ! -e "$sh/model.safetensors" ] ||
    fail_with_output "no shards and index in $sh ($(ls "$sh"))"
for f in "$sh"/*; do
    n=$(basename "$f")
    [ "$n" = manifest.json ] || grep -q "\"$n\": $(stat -c %s "$f")" "$sh/manifest.json" ||
        fail_with_output "manifest.json does not list $n with its size"
done
grep -q '"save_shard_size": "20KB"' "$sh/manifest.json" ||
    fail_with_output "manifest.json's config does not record --save-shard-size"
for d in whole sharded; do
    trains "eval of the $d save" "eval: val_loss" --init-from "$(step_dir "$dir/$d" 2)" --eval-only 1
    grep -o 'eval: val_loss [0-9.]*' "$dir/out.txt" > "$dir/eval_$d.txt"
done
cmp -s "$dir/eval_whole.txt" "$dir/eval_sharded.txt" ||
    fail_with_output "sharded and whole saves evaluate differently: $(cat "$dir"/eval_*.txt)"
# both save options are run options: --resume inherits them (no --save-shard-size here), --print-config writes
# them and --config reads them back, checked like the flag
trains "resume from shards" "resumed from .*sharded/step-00000002 after step 2" --steps 3 --resume \
    --checkpoint-dir "$dir/sharded"
[ -f "$(step_dir "$dir/sharded" 3)/model.safetensors.index.json" ] ||
    fail_with_output "the resumed run did not inherit --save-shard-size"
merge --save-dtype bf16 --save-shard-size 20KB --print-config
if "$mpirun" -np 1 "$train" "${merged[@]}" > "$dir/save.json" 2> "$dir/out.txt" &&
    grep -q '^  "save_dtype": "bf16",$' "$dir/save.json" &&
    grep -q '^  "save_shard_size": "20KB",$' "$dir/save.json"; then
    echo "ok: --print-config writes save_dtype and save_shard_size"
else
    fail_with_output "--print-config without save_dtype/save_shard_size: $(cat "$dir/save.json")"
fi
sed 's/"save_shard_size": "20KB"/"save_shard_size": "5XB"/' "$dir/save.json" > "$dir/badsize.json"
refuses "--save-shard-size expects a byte count .* got '5XB'" --config "$dir/badsize.json"
refuses "--save-shard-size expects a byte count .* got '5XB'" --save-shard-size 5XB
# saves this machine could not load back (a load keeps every shard open: 4 layers' 79 one-byte shards under ulimit -n
# 100) are refused before training; before, the run trained to its first save and failed there, or saved and failed
# to load
before=$failures
(ulimit -n 100 && refuses "before training: --save-shard-size: 79 shards, all open while a load reads them, .*ulimit \
-n allows 100" --layers 4 --save-shard-size 1 --checkpoint-dir "$dir/toomany" && [ $failures -eq $before ]) ||
    failures=$((failures + 1))
cp -r "$sh" "$dir/noshard" && rm "$dir/noshard/model-00002-of-0000$shards.safetensors"
refuses "model-00002-of-0000$shards.safetensors is missing or not a regular file: the manifest lists it" --init-from "$dir/noshard"
rm "$dir/noshard/manifest.json" # without one (another tool's directory): named by its file, not by its rank in the index
refuses "shard model-00002-of-0000$shards.safetensors \(one of the $shards that .*index.json names\)" \
    --init-from "$dir/noshard"
cp -r "$sh" "$dir/badindex" && sed -i 's/model-00001-of/model-00002-of/' "$dir/badindex/model.safetensors.index.json"
refuses "model.safetensors.index.json: its bytes have checksum .* \(altered" --init-from "$dir/badindex"
rm "$dir/badindex/manifest.json" # without a manifest the index's own check finds it
refuses "index.json names tensor .* in .*model-00002-of-0000$shards.safetensors, which does not hold it" \
    --init-from "$dir/badindex"

finish test_checkpoint_cli
