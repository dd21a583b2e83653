#!/usr/bin/env bash
# gpu_check.sh — the one command for a GPU machine: installs what is missing and builds (scripts/setup.sh),
# runs the gpu test suite, two --verify-steps training runs on the local GPUs (bf16: dropless, then with
# capacity drops and micro-batches) checked step by step against the CPU fp32 reference, and the GPU
# benchmarks; then prints one report (passed / failed / numbers, markdown) for docs/BENCHMARKS.md, also
# written to $MOE_BUILD_DIR/gpu_check_report.md.
# Exit status: 0 when every check passed, 1 when one failed, 77 when there is no GPU.
# Environment: MOE_GPU_CHECK_QUICK=1 skips the benchmarks (a minute or two instead of ~15).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/setup.sh" python3-numpy time || exit 1
source "$root/scripts/mpi_env.sh"
build="$moe_build"
report="$build/gpu_check_report.md"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0

gpus=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true)
if [ -z "$gpus" ]; then
    echo "gpu_check: no GPU here (nvidia-smi lists none); nothing to check"
    exit 77
fi
ngpu=$(printf '%s\n' "$gpus" | wc -l)
ranks=1 # the verify runs: the largest power of two <= the GPUs, at most 8 (it divides the batch and the experts)
while [ $((ranks * 2)) -le "$ngpu" ] && [ $ranks -lt 8 ]; do ranks=$((ranks * 2)); done
bash "$root/scripts/prepare_data.sh" > /dev/null || { echo "gpu_check: scripts/prepare_data.sh failed" >&2; exit 1; }

# 1. the gpu suite: each CUDA op against its CPU twin, the transports, the layer, two steps of moe-train
(cd "$build" && meson test --suite gpu --print-errorlogs --num-processes 1) > "$work/suite.txt" 2>&1
suite_rc=$?
count() { sed -n "s/^$1: *\([0-9][0-9]*\).*/\1/p" "$work/suite.txt" | tail -n 1; }
[ $suite_rc -eq 0 ] || status=1
[ "$(count Ok)" -gt 0 ] 2>/dev/null || status=1 # every gpu test skipped on a GPU machine: none saw the GPU

# 2. --verify-steps: 20 steps of the default model on every local GPU, each checked against the CPU reference
#    (one rank per GPU on up to 8 of them, experts sharded over all: tokens over NCCL)
verify() { # NAME FLAGS...
    local name=$1
    shift
    mpirun -np "$ranks" "$build/moe-train" --device cuda --ep "$ranks" --steps 20 --verify-steps 20 --eval-interval 0 \
        --sample-tokens 0 "$@" > "$work/$name.txt" 2>&1
    local rc=$?
    [ $rc -eq 0 ] || touch "$work/$name.failed"
    local last
    last=$(grep -E "^verify step" "$work/$name.txt" | tail -n 1)
    if [ $rc -eq 0 ]; then echo "passed: $last"
    else echo "FAILED (exit $rc): $(grep -E '^moe-train' "$work/$name.txt" | head -n 2 | tr '\n' ' ')"
    fi
}
verify_dropless=$(verify verify_dropless)
verify_capacity=$(verify verify_capacity --capacity-factor 1.25 --micro-batches 2)

# 3. benchmarks (numbers only; no pass or fail but a program's own failure)
bench() { # NAME CMD...: the command's last lines
    local name=$1
    shift
    if "$@" > "$work/$name.txt" 2>&1; then grep -vE '^json: ' "$work/$name.txt" | tail -n 6
    else echo "FAILED (exit $?): $(tail -n 2 "$work/$name.txt" | tr '\n' ' ')"; touch "$work/$name.failed"
    fi
}
if [ "${MOE_GPU_CHECK_QUICK:-0}" != 1 ]; then
    b_train=$(bench train bash "$root/bench/bench_train_gpu.sh")
    b_grouped=$(bench grouped "$build/bench/bench_grouped_gemm")
    b_permute=$(bench permute "$build/bench/bench_permute")
    b_layer=$(bench layer "$build/bench/bench_moe_layer_gpu")
else
    b_train="skipped (MOE_GPU_CHECK_QUICK=1)" b_grouped=$b_train b_permute=$b_train b_layer=$b_train
fi
# the functions above ran in $(...) subshells: their failures are marks in $work
compgen -G "$work/*.failed" > /dev/null && status=1

{
    echo "## gpu_check: $(date -u +%Y-%m-%d) on $ngpu GPU(s): $(printf '%s\n' "$gpus" | head -n 1)"
    echo
    echo "commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown), CUDA $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
    echo
    echo "| check | result |"
    echo "| --- | --- |"
    echo "| gpu suite | $(count Ok) passed, $(( $(count Fail) + $(count Timeout) )) failed, $(count Skipped) skipped |"
    echo "| --verify-steps 20, bf16, dropless, $ranks rank(s) | $verify_dropless |"
    echo "| --verify-steps 20, bf16, capacity 1.25, 2 micro-batches, $ranks rank(s) | $verify_capacity |"
    echo
    echo "### ~1.2B MoE training on one GPU (bench/bench_train_gpu.sh)"
    echo '```'; echo "$b_train"; echo '```'
    echo "### grouped expert GEMM (build/bench/bench_grouped_gemm)"
    echo '```'; echo "$b_grouped"; echo '```'
    echo "### permute / combine (build/bench/bench_permute)"
    echo '```'; echo "$b_permute"; echo '```'
    echo "### MoE layer forward + backward (build/bench/bench_moe_layer_gpu)"
    echo '```'; echo "$b_layer"; echo '```'
    [ $suite_rc -eq 0 ] || { echo "### gpu suite failures"; echo '```'; grep -E "FAIL|Timeout" "$work/suite.txt" | head -n 20; echo '```'; }
    echo
    [ $status -eq 0 ] && echo "**every check passed**" || echo "**FAILED: see above; the logs (suite.txt, verify_*.txt, ...) are in $build**"
} | tee "$report"
cp "$work"/*.txt "$build/" 2>/dev/null || true
exit $status
