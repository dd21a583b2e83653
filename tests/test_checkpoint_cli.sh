#!/bin/bash
# test_checkpoint_cli.sh MPIRUN MOE_TRAIN TEXT_TO_TOKENS EXPECT_FAILURE — moe-train's checkpoints as a user
# meets them, on 2 ranks (issue 12): a saved step that is not a step number, a checkpoint beyond --steps, a
# fresh run into a directory of another run, a resume from an older checkpoint (a fork: --keep-last prunes
# only the fork's own checkpoints), and a --checkpoint-dir path longer than any fixed buffer.
. "$(dirname "$0")/train_cli_common.sh"

ck="$dir/ck"
step_dir() { printf '%s/step-%08d' "$1" "$2"; }
run_of() { grep -o '"run_id": "[^"]*"' "$1/manifest.json"; } # DIR

trains "a run saves at 4, 8, 12" "^step    12" --steps 12 --checkpoint-dir "$ck" --checkpoint-interval 4 --keep-last 0
for s in 4 8 12; do [ -d "$(step_dir "$ck" $s)" ] || fail_with_output "step $s was not saved"; done
first_run=$(run_of "$(step_dir "$ck" 12)")

# the saved step, edited to what is not a step number (same length: the header stays valid)
for bad in -1 ab; do
    cp -r "$(step_dir "$ck" 12)" "$dir/bad$bad"
    perl -0777 -pi -e "s/\"step\":\"12\"/\"step\":\"$bad\"/" "$dir/bad$bad/train_state.safetensors"
    refuses "the saved step '$bad' is not a step number" --steps 20 --resume "$dir/bad$bad"
done
refuses "the checkpoint is at step 12, beyond --steps 8" --steps 8 --resume --checkpoint-dir "$ck"
trains "a complete run resumed" "the run is complete at step 12" --steps 12 --resume --checkpoint-dir "$ck"
refuses "already holds another run's checkpoints .*step-00000012, run" --steps 12 --checkpoint-dir "$ck"

# a fork: resume the old step 4 into the same directory, saving at 6, 9, 12 and keeping 1 of its own
trains "a resume from step 4 forks" "resumed from .*step-00000004 after step 4 \(run [0-9a-f]+, continued from run" \
    --steps 12 --resume "$(step_dir "$ck" 4)" --checkpoint-dir "$ck" --checkpoint-interval 3 --keep-last 1
for s in 4 8; do # the first run's: never pruned by the fork
    [ "$(run_of "$(step_dir "$ck" $s)")" = "$first_run" ] || fail_with_output "the first run's step $s was lost"
done
for s in 6 9; do [ ! -e "$(step_dir "$ck" $s)" ] || fail_with_output "the fork's step $s was not pruned"; done
[ "$(run_of "$(step_dir "$ck" 12)")" != "$first_run" ] || fail_with_output "step 12 is not the fork's"
trains "latest is the newest saved" "resumed from .*step-00000012 after step 12" --steps 12 --resume \
    --checkpoint-dir "$ck"

# a path of 700 characters (fixed buffers cut paths at about 580)
long="$dir"
for i in 1 2 3 4 5 6 7; do long="$long/$(printf 'a%.0s' $(seq 1 95))"; done
mkdir -p "$long"
trains "a 700-character --checkpoint-dir" "^step     2" --checkpoint-dir "$long/ck"
trains "resume from it" "resumed from .*/ck/step-00000002 after step 2" --steps 3 --resume --checkpoint-dir "$long/ck"

finish test_checkpoint_cli
