#!/usr/bin/env bash
# test.sh — the README's second command: installs, builds, then runs every test suite.
#   bash scripts/test.sh            everything (what CI runs)
#   bash scripts/test.sh --quick    the unit and ref suites of the main build only (35 s once built): the
#                                   edit-compile-test loop (more arguments go to meson test with them)
#   bash scripts/test.sh ARGS...    `meson test ARGS` on the main build only (a suite, or a test's name; a name
#                                   no test has fails)
# Everything is three lanes, each with its own log in build/meson-logs/lane-<name>.txt:
#   main      build/: the suites unit (CPU tests), ref (against PyTorch and transformers), mpi (1 to 8 ranks),
#             faults (jobs hurt on purpose, docs/RELIABILITY.md), isa (the determinism tests as CPUs without AVX-512
#             run them: tests/meson.build), gpu (skips without a GPU), bundle (the bare GPU machine's path),
#             MOE_TEST_PROCESSES tests at a time (default 3: with 4, ranks of more jobs yield to each other;
#             docs/BENCHMARKS.md, "On an AVX2-only CPU")
#   sanitize  scripts/sanitize.sh: its own build (while the main lane tests), then, once the main lane is done, the
#             unit and mpi suites and four faults tests under ASan and UBSan, over Open MPI's TCP transport, the one
#             between nodes (the transport suite's bits over TCP: tests/meson.build; a lane of its own until
#             2026-12-07, after the sanitized one: ~35 s and ~50 CPU-s of the critical path)
#   fuzz      scripts/fuzz.sh: its own build (from the start, beside the main lane's tests), then, once the main lane
#             is done, each parser's corpus and MOE_FUZZ_SECONDS (default 10) of fuzzing per target, two targets at a
#             time, at the lowest priority (nice 19): its seconds are wall-clock, and beside the main lane they are
#             taken from its waiting ranks (each yield of a rank hands a core to it). In place, 2026-12-07: the main
#             lane 413 s with the fuzzing beside it, 301 s with it after (from a fresh clone the fuzz build runs beside
#             the main lane either way, and the difference was lost in the VM's noise)
# The multi-rank tests of one lane at a time (below, at `lanes`: side by side, their waiting ranks took ~400 CPU-s from
# each other), builds beside them. From a fresh clone, builds included: 9m28s-13m41s on a 2-core Zen 3 VM
# (2026-12-07, by its load: 11m00s, 12m42s and 13m41s within an hour for nearly the same code, 10m39s and 11m02s
# without the tcp lane, 1138 and 1185 CPU-s; with the four lanes at
# once 13.6-15.0 minutes there, and 10.6-11.8 on a faster Zen 4 VM), the main lane 327-425 s of it, the main build
# before the lanes 110-175 s (README, "Tests"; each lane's last line gives its CPU seconds; docs/BENCHMARKS.md, "Lanes
# in turns").
set -euo pipefail
export LC_ALL=C.UTF-8 # a decimal point in awk and printf whatever the user's locale (de_DE's comma broke them)
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
quick=0
[ "${1:-}" = "--quick" ] && { quick=1; shift; }
processes="${MOE_TEST_PROCESSES:-3}" # 1 to 64 (a probe: 0 hung the main lane, and every lane waited for it)
case "$processes" in '' | *[!0-9]* | ???*) processes=0 ;; esac
if [ "$((10#$processes))" -lt 1 ] || [ "$((10#$processes))" -gt 64 ]; then
    echo "test.sh: MOE_TEST_PROCESSES must be a whole number from 1 to 64, not '${MOE_TEST_PROCESSES:-}'" >&2
    exit 2
fi
processes=$((10#$processes))
export MOE_TEST_PROCESSES="$processes" # the sanitize lane's too
# clang and libFuzzer's runtime for the fuzz lane, installed here with the rest (installs before any lane starts)
extra=()
[ $quick -eq 0 ] && [ $# -eq 0 ] && extra=(clang libclang-rt-14-dev)
source "$here/setup.sh" python3-torch python3-numpy python3-pip python3-matplotlib time bible-kjv "${extra[@]}"

# Hugging Face transformers for test_hf_interop (suite ref), by pip into Debian's python3 beside python3-torch
# 1.13: 4.40.2 has MixtralForCausalLM and still supports torch 1.13; its dependencies are pinned too. Installed
# only when missing; if the install fails, test_hf_interop skips (exit 77) instead of failing.
if ! /usr/bin/python3 -c 'import transformers' 2>/dev/null; then
    echo "test.sh: installing transformers 4.40.2 for test_hf_interop"
    /usr/bin/python3 -m pip install --quiet --no-input --root-user-action=ignore --break-system-packages \
        transformers==4.40.2 tokenizers==0.19.1 huggingface_hub==0.23.0 safetensors==0.4.3 \
        regex==2024.5.10 filelock==3.14.0 fsspec==2024.3.1 tqdm==4.66.4 packaging==24.0 \
        || echo "test.sh: could not install transformers; test_hf_interop will skip" >&2
fi
cd "$moe_build"
count() { # FIELD FILE: meson's counts of that result, added over the summaries in FILE
    sed -n "s/^$1: *\([0-9][0-9]*\).*/\1/p" "$2" | awk '{ n += $1 } END { print n + 0 }'
}
summarize() { # FILE: "N passed, N failed, N skipped" from meson's summaries in FILE
    local failed=$(($(count Fail "$1") + $(count Timeout "$1")))
    echo "$(count Ok "$1") passed, $failed failed, $(count Skipped "$1") skipped"
}

if [ $quick -eq 1 ] || [ $# -gt 0 ]; then
    suites=()
    [ $quick -eq 1 ] && suites=(--suite unit --suite ref) # and whatever else was given (-v, a test's name)
    status=0
    meson test --print-errorlogs --num-processes "$processes" "${suites[@]}" "$@" |
        tee meson-logs/test-summary.txt || status=$?
    summarize meson-logs/test-summary.txt
    if grep -q '^No suitable tests defined' meson-logs/test-summary.txt; then # a misspelled name passed before
        given=("${suites[@]}" "$@")
        echo "test.sh: no test matches: ${given[*]}" >&2
        exit 1
    fi
    exit $status
fi

# Each lane runs in the background with its output in its log; --no-rebuild: the lanes share build/, which
# setup.sh has just built (two meson tests must not both run ninja there). The lanes that run multi-rank tests take
# turns (main, then sanitize's tests): side by side, the ranks of one job yield their cores to the other
# jobs' waiting ranks at every poll, each such rank a fair share of the CPU (Open MPI's mpi_yield_when_idle; ~30% of
# the samples in the mpi suites were sched_yield's paths, docs/BENCHMARKS.md), and 4 lanes at once took ~400 CPU-s
# more than the same lanes one by one. Builds run beside them (the sanitized and fuzz builds while the main lane tests;
# a compiler wastes nothing while ranks wait: it is work that must be done), and the fuzzing, whose seconds are
# wall-clock, at the lowest priority after the main lane.
lanes=(main sanitize fuzz)
lane_command() {
    case $1 in
    main) meson test --no-rebuild --print-errorlogs --num-processes "$processes" --suite unit --suite ref \
        --suite mpi --suite faults --suite isa --suite gpu --suite bundle ;;
    fuzz) nice -n 19 bash "$moe_root/scripts/fuzz.sh" --num-processes 2 ;; # 2 targets at once
    sanitize) bash "$moe_root/scripts/sanitize.sh" ;;
    esac
}
lane_build() { # what a lane does before its turn
    case $1 in
    sanitize) bash "$moe_root/scripts/sanitize.sh" --build-only ;;
    fuzz) nice -n 19 bash "$moe_root/scripts/fuzz.sh" --build-only ;;
    esac
}
lane_after() { # the lane whose end a lane's tests wait for
    case $1 in
    sanitize) echo main ;;
    fuzz) echo main ;;
    esac
}
times_cpu() { # FILE: CPU seconds (user + system) of the finished children in the output of bash's `times`
    awk 'NR == 2 { for (i = 1; i <= 2; i++) { split($i, t, "m"); s += t[1] * 60 + t[2] } printf "%.0f", s }' "$1"
}
declare -A pid=()
start=$(date +%s)
rm -f meson-logs/lane-*.done
for lane in "${lanes[@]}"; do
    # `times` in the lane's own shell (a pipe or $(...) would be a subshell without children): its children's CPU,
    # every descendant's included (meson waits for its tests, mpirun for its ranks). lane-NAME.done marks its end,
    # whatever the end (a failed lane must not leave the next one waiting).
    ( SECONDS=0; status=0 waited=0
      trap 'touch "meson-logs/lane-$lane.done"' EXIT
      lane_build "$lane" || status=$?
      after=$(lane_after "$lane")
      if [ -n "$after" ]; then
          t0=$SECONDS
          while [ ! -e "meson-logs/lane-$after.done" ]; do sleep 1; done
          waited=$((SECONDS - t0))
      fi
      [ $status -eq 0 ] && { lane_command "$lane" || status=$?; }
      times > "meson-logs/lane-$lane.times"
      echo "lane $lane: exit status $status after ${SECONDS}s${after:+ (${waited}s of them waiting for lane $after)}," \
          "$(times_cpu "meson-logs/lane-$lane.times") CPU-s"
    ) > "meson-logs/lane-$lane.txt" 2>&1 &
    pid[$lane]=$!
done
status=0 failed_lanes=()
for lane in "${lanes[@]}"; do
    wait "${pid[$lane]}" || true
    log="meson-logs/lane-$lane.txt"
    result=$(tail -n 1 "$log")
    echo "$result: $(summarize "$log") (log: $moe_build/$log)"
    if [[ $result != *"exit status 0 "* ]]; then
        status=1
        grep -E '^ *[0-9]+/[0-9]+ .* (FAIL|TIMEOUT|ERROR) ' "$log" || tail -n 40 "$log"
        failed_lanes+=("$log")
    fi
done
# why, last: CI shows only the end of this output. Our tests print "FAIL: what" and then their evidence.
for log in "${failed_lanes[@]}"; do
    echo "--- $log: the failures' own words"
    grep -E -A 20 '(^|[^A-Za-z_])FAIL: ' "$log" | head -n 100
done
verdict=$([ $status -eq 0 ] && echo 'all passed' || echo 'FAILED')
times > meson-logs/test.times # everything since test.sh started: installs, the main build and every lane
echo "test.sh: every lane done after $(($(date +%s) - start))s, $verdict;" \
    "$(times_cpu meson-logs/test.times) CPU-s since test.sh started (installs and the main build included)"
exit $status
