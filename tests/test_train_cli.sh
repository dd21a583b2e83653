#!/bin/bash
# test_train_cli.sh MPIRUN MOE_TRAIN TEXT_TO_TOKENS EXPECT_FAILURE — moe-train refuses bad flags and bad
# data files with a clear message, on 2 ranks, without hanging or leaving a process behind; and a tiny
# valid run succeeds (so the refusals are not a program that always fails).
set -u
mpirun=$1 train=$2 text_to_tokens=$3 expect_failure=$4
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
failures=0

# a small valid corpus: 3000 bytes of text -> train.bin / val.bin
for i in $(seq 1 60); do echo "line $i of a small corpus for the refusal tests."; done > "$dir/text.txt"
"$text_to_tokens" "$dir/text.txt" "$dir/train.bin" "$dir/val.bin" 0.2 >/dev/null || exit 1
# bad files, made from the good one
printf 'this is not a token file at all, it is text................................................' > "$dir/text.bin"
head -c 1100 "$dir/train.bin" > "$dir/truncated.bin"
cp "$dir/train.bin" "$dir/wrong_version.bin"
printf '\x02' | dd of="$dir/wrong_version.bin" bs=1 seek=4 conv=notrunc status=none

small=(--layers 1 --d-model 16 --heads 2 --kv-heads 2 --d-ff 16 --seq-len 16 --experts 4 --top-k 2 --batch 2
       --steps 2 --warmup 1 --eval-batches 1 --sample-tokens 0 --exchange-timeout 20)
data=(--train-data "$dir/train.bin" --val-data "$dir/val.bin")

refuses() { # PATTERN ARGS...
    local pattern=$1
    shift
    if ! "$expect_failure" "$pattern" 60 "$mpirun" -np 2 "$train" "$@" > "$dir/out.txt" 2>&1; then
        echo "FAIL: moe-train $* did not refuse with /$pattern/:"
        cat "$dir/out.txt"
        failures=$((failures + 1))
    else
        echo "ok: refused with: $(grep -E -e "$pattern" "$dir/out.txt" | head -n 1)"
    fi
}

refuses "unknown flag '--lerning-rate'" "${small[@]}" "${data[@]}" --lerning-rate 1
refuses "--experts expects an integer in \[1, 4096\], got 'eight'" "${small[@]}" "${data[@]}" --experts eight
refuses "--lr expects a number in \[0, 10\], got '-1'" "${small[@]}" "${data[@]}" --lr -1
refuses "--score must be softmax or sigmoid, got 'relu'" "${small[@]}" "${data[@]}" --score relu
refuses "--steps needs a value" "${small[@]}" "${data[@]}" --steps
refuses "top_k must be between 1 and the number of experts" "${small[@]}" "${data[@]}" --top-k 5
refuses "--ep 3 must divide the number of ranks \(2\)" "${small[@]}" "${data[@]}" --ep 3 --experts 6
refuses "ep_size must divide the number of experts" "${small[@]}" "${data[@]}" --ep 2 --experts 5
refuses "--batch 3 must be divisible by the number of ranks \(2\)" "${small[@]}" "${data[@]}" --batch 3
refuses "number of heads must divide d_model" "${small[@]}" "${data[@]}" --heads 3
refuses "kv heads must divide the number of heads" "${small[@]}" "${data[@]}" --kv-heads 3 --heads 4
refuses "--warmup 5 exceeds --steps 2" "${small[@]}" "${data[@]}" --warmup 5
refuses "bad data file: .*missing.bin: cannot open: No such file" "${small[@]}" --train-data "$dir/missing.bin" --val-data "$dir/val.bin"
refuses "bad data file: .*text.bin: (wrong magic|truncated)" "${small[@]}" --train-data "$dir/text.bin" --val-data "$dir/val.bin"
refuses "bad data file: .*truncated.bin: the header announces [0-9]+ tokens but the file holds" "${small[@]}" --train-data "$dir/truncated.bin" --val-data "$dir/val.bin"
refuses "bad data file: .*wrong_version.bin: unsupported version 2" "${small[@]}" --train-data "$dir/wrong_version.bin" --val-data "$dir/val.bin"
refuses "bad data file: .*train.bin: token [0-9]+ at position [0-9]+ is outside the vocabulary \(size 64\)" "${small[@]}" "${data[@]}" --vocab 64

if timeout 120 "$mpirun" -np 2 "$train" "${small[@]}" "${data[@]}" > "$dir/out.txt" 2>&1 && grep -q "^step     2" "$dir/out.txt"; then
    echo "ok: a valid tiny run trains"
else
    echo "FAIL: a valid tiny run did not train:"
    cat "$dir/out.txt"
    failures=$((failures + 1))
fi
echo "test_train_cli: $failures failure(s)"
[ "$failures" -eq 0 ]
