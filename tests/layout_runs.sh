# layout_runs.sh — sourced after train_cli_common.sh by the CLI tests that compare one run across layouts
# (test_world_invariant_cli.sh, test_data_cli.sh): a run into $dir/NAME, its losses, and the comparison of two runs.

run() { # NAME RANKS FLAGS...: trains into $dir/NAME (checkpoints) and $dir/NAME.jsonl
    local name=$1 np=$2
    shift 2
    merge --checkpoint-dir "$dir/$name" --log-file "$dir/$name.jsonl" "$@"
    if ! timeout 300 "$mpirun" -np "$np" "$train" "${merged[@]}" > "$dir/out.txt" 2>&1; then
        fail_with_output "$name: moe-train on $np ranks failed"
    fi
}

# "STEP LOSS" per logged step, sorted as join wants them
losses() { grep '"step"' "$1" | sed 's/.*"step": *\([0-9]*\).*"loss": *\([-0-9.e+]*\).*/\1 \2/' | sort -k1,1; }

same_run() { # WHAT NAME REFERENCE: the same losses for the steps NAME ran, the same step-10 files
    local what=$1 a=$2 b=$3 f
    if ! join <(losses "$dir/$a.jsonl") <(losses "$dir/$b.jsonl") | awk '$2 != $3 { bad = 1 } END { exit bad }' ||
        [ "$(losses "$dir/$a.jsonl" | wc -l)" -lt 5 ]; then
        echo "FAIL: $what: losses differ from $b's"; paste <(losses "$dir/$a.jsonl") <(losses "$dir/$b.jsonl")
        failures=$((failures + 1))
        return
    fi
    for f in model.safetensors train_state.safetensors; do
        if ! cmp -s "$dir/$a/step-00000010/$f" "$dir/$b/step-00000010/$f"; then
            echo "FAIL: $what: step 10's $f differs from $b's"
            failures=$((failures + 1))
            return
        fi
    done
    echo "ok: $what: $(losses "$dir/$a.jsonl" | wc -l) losses and the step-10 checkpoint bitwise $b's"
}
