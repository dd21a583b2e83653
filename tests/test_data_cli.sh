#!/usr/bin/env bash
# test_data_cli.sh MPIRUN MOE_TRAIN TEXT_TO_TOKENS EXPECT_FAILURE — data sets of shards as a user meets them (issue 52,
# docs/DATA.md): three shards by a quoted glob with --shuffle 1 train bitwise the same on 1 and 4 ranks, and the
# 4-rank checkpoint of step 5 resumed on 2 ranks continues the 1-rank curve to the same step-10 files (the data
# position travels in the checkpoint); the shuffled order is another than the unshuffled one; a checkpoint without a
# data position (before issue 52: tests/strip_data_position.py makes one) continues in order with a note. A resume on a changed
# shard list or --shuffle is refused naming what changed, and continues with --allow-data-change 1, saying so; a
# damaged data position (a counter past int64, or not a number) is refused naming the key.
# Refused with the path named: a pattern matching nothing, a token past --vocab (a uint32 shard of another vocabulary
# among uint16 ones: when it is read, with its offset), and a shard truncated while the run reads it (a message, not
# SIGBUS).
source "$(dirname "$0")/train_cli_common.sh"

mkdir -p "$dir/shards"
for k in 1 2 3; do
    for i in $(seq 1 $((30 * k))); do echo "shard $k, line $i: words of a corpus cut into shards ($((i * k)))."; done \
        > "$dir/text$k.txt"
    "$text_to_tokens" "$dir/text$k.txt" "$dir/shards/train_00$k.bin" "$dir/shards/val_00$k.bin" 0.1 >/dev/null || exit 1
done

small=(--layers 2 --d-model 16 --heads 2 --kv-heads 2 --d-ff 16 --seq-len 16 --experts 4 --top-k 2 --batch 8
       --micro-batches 2 --zero 1 --capacity-factor 1.0 --steps 10 --warmup 1 --eval-batches 1 --eval-interval 100
       --sample-tokens 0 --exchange-timeout 60 --shuffle 1
       --train-data "$dir/shards/train_*.bin" --val-data "$dir/shards/val_001.bin,$dir/shards/val_00[23].bin")

source "$(dirname "$0")/layout_runs.sh" # run, losses, same_run

run one 1
if grep -q "data: train 3 shard(s) from $dir/shards/train_\*.bin, .* windows of 16 + 1 tokens, shuffled" "$dir/out.txt"; then
    echo "ok: $(grep '^data:' "$dir/out.txt")"
else
    fail_with_output "no line saying the data set is 3 shards, shuffled"
fi
run four 4 --ep 2 --checkpoint-interval 5 --keep-last 0
same_run "3 shards shuffled, 4 ranks, ep 2" four one
run resumed2 2 --ep 1 --resume "$dir/four/step-00000005"
same_run "3 shards shuffled: step 5 of 4 ranks resumed on 2 ranks" resumed2 one
run in_order 1 --shuffle 0 --checkpoint-interval 5 --keep-last 0
if [ "$(losses "$dir/in_order.jsonl" | head -n 1)" = "$(losses "$dir/one.jsonl" | head -n 1)" ]; then
    echo "FAIL: --shuffle 1 read the first batch that --shuffle 0 reads"
    failures=$((failures + 1))
else
    echo "ok: --shuffle 1 reads another first batch than --shuffle 0"
fi
# a checkpoint from before data positions (its train_state without the data_* metadata, as moe-train wrote it then):
# resumed in order on 2 ranks it continues at step x micro-batches x batch with a note, bitwise the run's steps 6-10
mkdir -p "$dir/old" && cp -r "$dir/in_order/step-00000005" "$dir/old/"
python3 "$(dirname "$0")/strip_data_position.py" "$dir/old/step-00000005" > /dev/null ||
    fail_with_output "strip_data_position.py failed"
run old_resumed 2 --shuffle 0 --resume "$dir/old/step-00000005"
grep -q "note: .*records no data set identity (saved before data positions were): the shard list is not checked; continuing at window counter 80" "$dir/out.txt" ||
    fail_with_output "a checkpoint without a data position: no note saying so"
same_run "a checkpoint from before data positions, resumed on 2 ranks" old_resumed in_order
# a damaged data position (a probe, 2026-12-07: past int64 it overflowed the reads' counter, '12abc' passed for a
# checkpoint from before data positions): refused naming the key
for bad in 99999999999999999999 12abc; do
    rm -rf "$dir/damaged" && mkdir -p "$dir/damaged" && cp -r "$dir/in_order/step-00000005" "$dir/damaged/"
    python3 "$(dirname "$0")/strip_data_position.py" "$dir/damaged/step-00000005" "data_windows_done=$bad" \
        > /dev/null || fail_with_output "strip_data_position.py failed"
    refuses "data_windows_done '$bad' is not a whole number within 2\^63" --resume "$dir/damaged/step-00000005" \
        --checkpoint-dir "$dir/damaged"
done

# a resume on other data: refused naming what changed, or continued with --allow-data-change 1
state="$dir/four/step-00000005"
refuses "the training data differs from the checkpoint's: the list had 3 shards, now 2.*--allow-data-change 1" \
    --resume "$state" --checkpoint-dir "$dir/changed" --train-data "$dir/shards/train_00[12].bin"
cp "$dir/shards/train_001.bin" "$dir/shards/other_002.bin"
refuses "shard 2 \(now .*other_002.bin, [0-9]+ tokens\) is not the saved list's shard 2" --resume "$state" \
    --checkpoint-dir "$dir/changed" --train-data "$dir/shards/train_001.bin,$dir/shards/other_002.bin,$dir/shards/train_003.bin"
refuses "the training data differs from the checkpoint's: --shuffle was 1, now 0" --resume "$state" \
    --checkpoint-dir "$dir/changed" --shuffle 0
# other tokens under the same names and counts (a resume from another folder, whose relative paths named another
# copy: it went on silently, a probe, 2026-12-07): told by the shards' first and last 4 KiB
mkdir -p "$dir/elsewhere" && for k in 1 2 3; do
    python3 -c 'import sys; b = open(sys.argv[1], "rb").read(); h = 1024; t = b[h:]
open(sys.argv[2], "wb").write(b[:h] + b"".join(t[i:i + 2] for i in range(len(t) - 2, -1, -2)))' \
        "$dir/shards/train_00$k.bin" "$dir/elsewhere/train_00$k.bin"
done
refuses "shard 1 \(now .*elsewhere/train_001.bin\) holds other tokens than the saved list's shard of that name" \
    --resume "$state" --checkpoint-dir "$dir/changed" --train-data "$dir/elsewhere/train_00*.bin"
trains "--allow-data-change 1 continues on 2 shards, keeping the window counter" \
    "note: the training data differs from the checkpoint's \(the list had 3 shards, now 2\); --allow-data-change 1: continuing at window counter 80 " \
    --resume "$state" --checkpoint-dir "$dir/changed" --train-data "$dir/shards/train_00[12].bin" --allow-data-change 1

# bad data sets, each named (a missing file, a bad header, a short shard: tests/test_data.c; a validation set of fewer
# windows than ranks: tests/test_train_cli.sh)
# (once, for both ranks: each distinct start-up failure is told by its lowest rank)
refuses "moe-train: rank 0 \(and 1 other alike\): cannot start: bad data file: .*/shards/nothing_\*.bin: no file \
matches this pattern" --train-data "$dir/shards/nothing_*.bin"
# a uint32 shard of a larger vocabulary (tokens 1000 and up) among the byte-level ones: found when read
{
    printf '\xa1\xd9\x34\x01\x07\x00\x00\x00\x40\x00\x00\x00'; head -c $((1024 - 12)) /dev/zero
    for i in $(seq 0 63); do printf "\\x$(printf %02x $((i % 200 + 24)))\\x03\\x00\\x00"; done
} > "$dir/shards/wide.bin"
refuses "training data of step 1: .*/shards/wide.bin: token [0-9]+ at token offset [0-9]+ is outside the vocabulary \(size 256\)" \
    --train-data "$dir/shards/wide.bin,$dir/shards/train_001.bin" --shuffle 0

# a shard truncated while the run reads it: the run stops with a message naming it (not SIGBUS, not a hang)
merge --steps 1000000 --eval-interval 0 --log-file "$dir/long.jsonl"
timeout 120 "$mpirun" -np 2 "$train" "${merged[@]}" > "$dir/out.txt" 2>&1 &
job=$!
for _ in $(seq 1 300); do grep -q '"step": *3' "$dir/long.jsonl" 2>/dev/null && break; sleep 0.1; done
truncate -s 1100 "$dir/shards/train_003.bin"
wait "$job"
rc=$?
if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] &&
    grep -Eq "train_003.bin: the file ends at 1100 bytes, before tokens .* truncated or replaced while the run reads it" "$dir/out.txt" &&
    ! grep -qi "bus error\|SIGBUS\|signal 7" "$dir/out.txt"; then
    echo "ok: a shard truncated mid-run: $(grep -Eo 'train_003.bin: the file ends.*' "$dir/out.txt" | head -n 1)"
else
    fail_with_output "a shard truncated mid-run (exit $rc)"
fi
# more shards than the process may hold open (each stays open for the run): the limit and the shard named (a probe:
# "cannot open: Too many open files" blamed a file); one process without mpirun, under ulimit -n 40
mkdir -p "$dir/many" && for i in $(seq 1 60); do ln -sf "$dir/shards/train_001.bin" "$dir/many/s_$i.bin"; done
merge --train-data "$dir/many/s_*.bin" --val-data "$dir/shards/val_001.bin"
(ulimit -n 40 && "$train" "${merged[@]}" > "$dir/out.txt" 2>&1)
grep -Eq "cannot open the data set's shard [0-9]+: this process may hold 40 open files" "$dir/out.txt" &&
    echo "ok: too many shards for the open-file limit: $(grep -o "cannot open the data set's shard.*" "$dir/out.txt")" ||
    fail_with_output "too many shards for the open-file limit"
finish test_data_cli
