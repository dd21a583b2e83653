#!/usr/bin/env bash
# test.sh — the README's second command: installs, builds, then runs every test suite.
#   unit: CPU tests; ref: against the PyTorch implementation; mpi: 1, 2 and 4 ranks under mpirun;
#   faults: jobs hurt on purpose (docs/RELIABILITY.md); gpu: CUDA tests (skip without a GPU); bundle: the bare GPU
#   machine's path (scripts/gpu_check.sh --rehearse from the bundle alone);
#   then the mpi suite again over Open MPI's TCP transport (meson test --setup tcp), and, in builds of their
#   own, fuzz (scripts/fuzz.sh) and sanitize (scripts/sanitize.sh).
# Extra arguments go to `meson test` of the main build only (for example --suite unit, or a test's name).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh" python3-torch python3-numpy python3-pip python3-matplotlib time

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
suites=(--suite unit --suite ref --suite mpi --suite faults --suite gpu --suite bundle)
[ $# -gt 0 ] && suites=()
status=0
meson test --print-errorlogs --num-processes 2 "${suites[@]}" "$@" | tee meson-logs/test-summary.txt || status=$?
count() { sed -n "s/^$1: *\([0-9][0-9]*\).*/\1/p" meson-logs/test-summary.txt | tail -n 1; }
failed=$(( $(count Fail) + $(count Timeout) + $(count 'Unexpected Pass') ))
echo "$(count Ok) passed, $failed failed, $(count Skipped) skipped"
if [ $# -eq 0 ]; then
    # the mpi suite once more over Open MPI's TCP transport (the one between nodes) instead of shared memory
    meson test --print-errorlogs --num-processes 2 --setup tcp --suite mpi > meson-logs/test-tcp-summary.txt 2>&1 ||
        { tail -n 30 meson-logs/test-tcp-summary.txt; echo "test.sh: the mpi suite over TCP failed" >&2; status=1; }
    echo "mpi suite over TCP: $(grep -E '^(Ok|Fail|Timeout):' meson-logs/test-tcp-summary.txt | tr -s ' \n' ' ')"
    bash "$moe_root/scripts/fuzz.sh" || { echo "test.sh: the fuzz suite failed" >&2; status=1; }
    bash "$moe_root/scripts/sanitize.sh" || { echo "test.sh: the sanitize suite failed" >&2; status=1; }
fi
exit $status
