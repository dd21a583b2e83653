#!/usr/bin/env bash
# test.sh — the README's second command: installs, builds, then runs every test suite.
#   unit: CPU tests; ref: against the PyTorch implementation; mpi: 1, 2 and 4 ranks under mpirun;
#   gpu: CUDA tests (skip without a GPU).
# Extra arguments go to `meson test` (for example --suite unit, or a test's name).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh" python3-torch python3-numpy
cd "$moe_build"
suites=(--suite unit --suite ref --suite mpi --suite gpu)
[ $# -gt 0 ] && suites=()
status=0
meson test --print-errorlogs --num-processes 2 "${suites[@]}" "$@" | tee meson-logs/test-summary.txt || status=$?
count() { sed -n "s/^$1: *\([0-9][0-9]*\).*/\1/p" meson-logs/test-summary.txt | tail -n 1; }
failed=$(( $(count Fail) + $(count Timeout) + $(count 'Unexpected Pass') ))
echo "$(count Ok) passed, $failed failed, $(count Skipped) skipped"
exit $status
