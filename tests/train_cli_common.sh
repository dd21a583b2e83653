# train_cli_common.sh — sourced by the moe-train command-line tests (arguments MPIRUN MOE_TRAIN TEXT_TO_TOKENS
# EXPECT_FAILURE): a small corpus in a temporary $dir, the flags of a small 2-rank run, and the checks.
set -u
mpirun=$1 train=$2 text_to_tokens=$3 expect_failure=$4
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
failures=0

# a small valid corpus: 3000 bytes of text -> train.bin / val.bin
for i in $(seq 1 60); do echo "line $i of a small corpus for the refusal tests."; done > "$dir/text.txt"
"$text_to_tokens" "$dir/text.txt" "$dir/train.bin" "$dir/val.bin" 0.2 >/dev/null || exit 1

small=(--layers 1 --d-model 16 --heads 2 --kv-heads 2 --d-ff 16 --seq-len 16 --experts 4 --top-k 2 --batch 2
       --steps 2 --warmup 1 --eval-batches 1 --sample-tokens 0 --exchange-timeout 20
       --train-data "$dir/train.bin" --val-data "$dir/val.bin")

# merged=(the small run's flags, those given in "$@" replaced, then "$@"): moe-train refuses a flag given twice
merge() {
    local -A given=()
    local a i
    for a in "$@"; do [[ $a == --* ]] && given[$a]=1; done
    merged=()
    for ((i = 0; i < ${#small[@]}; i += 2)); do
        [ -n "${given[${small[i]}]:-}" ] || merged+=("${small[i]}" "${small[i + 1]}")
    done
    merged+=("$@")
}

fail_with_output() { # WHAT: counts a failure and shows moe-train's output
    echo "FAIL: $1:"
    cat "$dir/out.txt"
    failures=$((failures + 1))
}

refuses() { # PATTERN FLAGS... (on top of the small run's): fails fast with a line matching PATTERN
    local pattern=$1
    shift
    merge "$@"
    if ! "$expect_failure" "$pattern" 60 "$mpirun" -np 2 "$train" "${merged[@]}" > "$dir/out.txt" 2>&1; then
        fail_with_output "moe-train ${merged[*]} did not refuse with /$pattern/"
    else
        echo "ok: refused with: $(grep -E -e "$pattern" "$dir/out.txt" | head -n 1)"
    fi
}

# The ranks of a run that timeout ended: mpirun returns before they are gone, and one still holding its checkpoint
# directory's lock failed the next two runs of a test in CI (2026-12-07); they go first. Every run's flags name $dir.
end_leftovers() {
    pkill -9 -f -- "$train .*$dir/" 2>/dev/null || true
    for _ in $(seq 20); do pgrep -f -- "$train .*$dir/" > /dev/null || return 0; sleep 0.1; done
}

trains() { # WHAT PATTERN FLAGS...: the run succeeds (within 120 s) and prints a line matching PATTERN
    local what=$1 pattern=$2 rc=0
    shift 2
    merge "$@"
    timeout 120 "$mpirun" -np 2 "$train" "${merged[@]}" > "$dir/out.txt" 2>&1 || rc=$?
    if [ $rc -eq 0 ] && grep -Eq -e "$pattern" "$dir/out.txt"; then
        echo "ok: $what: $(grep -E -e "$pattern" "$dir/out.txt" | head -n 1)"
    else
        [ $rc -eq 124 ] && echo "(the run did not end within 120 s: stopped)" >> "$dir/out.txt" && end_leftovers
        fail_with_output "$what (no line /$pattern/, or a failure)"
    fi
}

finish() { # NAME
    echo "$1: $failures failure(s)"
    [ "$failures" -eq 0 ]
}
