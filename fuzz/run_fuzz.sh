#!/usr/bin/env bash
# run_fuzz.sh MODE TARGET CORPUS SCRATCH [SECONDS] — one test of the fuzz suite (fuzz/meson.build).
#   replay: runs the libFuzzer binary TARGET once on every file of CORPUS; each must run clean.
#   fuzz:   fuzzes for SECONDS (default 20) from CORPUS; new inputs go to SCRATCH/new, never into CORPUS.
# A crash, a hang (over 10 s), a leak, a sanitizer report or an input the target calls wrongly accepted fails
# the test; libFuzzer saves the input under SCRATCH (crash-*, timeout-*, leak-*, oom-*) and this script names it.
# libFuzzer's own exit codes (77 for a crash, 70 for a timeout) would read as a skip to meson: both become 1.
set -u
mode=$1 exe=$2 corpus=$3 scratch=$4 seconds=${5:-20}
target=$(basename "$corpus")
mkdir -p "$scratch/new"
# the targets hand each input to the parsers as a file: in memory (/dev/shm) where there is one, 5x faster
tmp=$(mktemp -d /dev/shm/moe-fuzz.XXXXXX 2>/dev/null || mktemp -d "$scratch/tmp.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
export TMPDIR="$tmp"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
opts=(-rss_limit_mb=2048 -timeout=10 -error_exitcode=1 -timeout_exitcode=1 -artifact_prefix="$scratch/")
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# words that help the mutations (libFuzzer -dict): the dictionaries' values, and the names the sources define, taken
# from them each run so that none is missing or stale (a probe, 2026-12-08: 57 of moe-train's ~100 flags, the families'
# names and DeepSeek's and Qwen's keys were in no seed or dictionary, and the code behind them went unreached)
src=$(cd "$here/.." && pwd)
case $target in
safetensors | train_state | config | manifest)
    { cat "$here/json.dict"
      grep -ohE '(TOP|TOP2|TOP_IN|OURS|YARN|FIXED)\("[a-z_0-9]+"' "$src/checkpoint/config.c" | sed 's/.*(\(".*"\)/\1/'
      grep -ohE '"(mixtral|qwen3_moe|qwen2_moe|olmoe|deepseek_v3|deepseek_v2|moe_train_mixtral_variant)"' \
          "$src/models/model_config.c" "$src/checkpoint/checkpoint.h" | sort -u
    } > "$tmp/words.dict" && opts+=(-dict="$tmp/words.dict") ;;
train_options)
    { cat "$here/flags.dict"
      grep -oE '^    \{"--[a-z0-9-]+"' "$src/train/options.c" | sed 's/.*{"--/" --/'
    } > "$tmp/words.dict" && opts+=(-dict="$tmp/words.dict") ;;
esac
before=$(ls "$scratch" | grep -cE '^(crash|timeout|leak|oom|slow-unit)-')
case $mode in
replay) "$exe" "${opts[@]}" "$corpus"/* ;;
fuzz) "$exe" "${opts[@]}" -max_total_time="$seconds" -print_final_stats=1 "$scratch/new" "$corpus" ;;
*) echo "run_fuzz.sh: unknown mode $mode" >&2; exit 2 ;;
esac
status=$?
if [ $status -ne 0 ]; then
    found=$(ls -t "$scratch" | grep -E '^(crash|timeout|leak|oom|slow-unit)-' | head -n 1)
    echo "run_fuzz.sh: $target failed ($mode, exit $status)"
    if [ -n "$found" ] && [ "$(ls "$scratch" | grep -cE '^(crash|timeout|leak|oom|slow-unit)-')" -gt "$before" ]; then
        echo "  the input: $scratch/$found"
        echo "  reproduce: $exe $scratch/$found"
        echo "  once the parser is fixed, keep it: cp $scratch/$found fuzz/corpus/$target/crash-<what-it-found>"
    fi
    exit 1
fi
echo "run_fuzz.sh: $target: $mode clean"
