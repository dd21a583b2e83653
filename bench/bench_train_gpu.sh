#!/usr/bin/env bash
# bench_train_gpu.sh [--peak-tflops F] [--steps N] [--data DIR] [moe-train flags...] — training throughput and MFU of a
# ~1.2B-parameter MoE (~0.39B active) on one GPU with moe-train --device cuda (bf16 by default), for
# docs/BENCHMARKS.md. Needs the build (scripts/setup.sh), a GPU and the data (scripts/prepare_data.sh).
# Exit 77 without a GPU.
#
# The model: 16 layers, d_model 1024, 16 heads, 8 KV heads, 8 experts of d_ff 2816, top-2, vocab 32000,
# sequences of 1024 tokens, 16 per step (2 micro-batches of 8): 1.22e9 parameters, 0.39e9 active per token. Extra flags replace
# these (moe-train refuses a flag given twice, so the defaults below are dropped for every flag given). The token
# files: DIR/kjv_train.bin and DIR/kjv_val.bin (default DIR: the checkout's data/, scripts/prepare_data.sh), by
# absolute path, so that the script runs from any folder.
#
# MFU = achieved model FLOP/s / the GPU's dense bf16 peak, with the model FLOPs of one token
#   6 * N_active + 12 * L * d_model * S
# (PaLM, Chowdhery et al. 2022, appendix B: 6N for the forward and backward products of the weights; 12 L d S
# for attention's QK^T and AV, forward and backward, without halving for the causal mask). N_active counts
# every dense parameter (embedding and lm_head included) plus k/E of the expert parameters. Tokens/s is the
# median over the steps after the first 10 (start-up, allocation and cuBLAS's first calls excluded).
# Peak: H100 SXM and H200 989 TFLOP/s, H100 PCIe 756, A100 312 (dense bf16, NVIDIA's data sheets), from
# nvidia-smi's name unless --peak-tflops is given.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${MOE_BUILD_DIR:-$root/build}"
steps=40 peak="" data="$root/data"
while [ $# -gt 0 ]; do
    case $1 in
    --peak-tflops) peak=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    *) break ;;
    esac
done
[ "$steps" -gt 10 ] || { echo "bench_train_gpu: --steps must exceed 10 (the first 10 are not timed)" >&2; exit 2; }
data=$(cd "$data" && pwd) || { echo "bench_train_gpu: no data folder $data" >&2; exit 2; }
source "$root/bench/train_gpu_model.sh"
train_gpu_model_flags 16 "$data" "$@"

if [ -z "$peak" ]; then
    name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 || true)
    case $name in
    *H100*PCIe*) peak=756 ;;
    *H100* | *H200* | *GH200*) peak=989 ;;
    *A100*) peak=312 ;;
    "") echo "bench_train_gpu: no GPU (nvidia-smi finds none)"; exit 77 ;;
    *) echo "bench_train_gpu: unknown GPU '$name': give --peak-tflops" >&2; exit 2 ;;
    esac
fi
source "$root/scripts/mpi_env.sh"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
mpirun -np 1 "$build/moe-train" --device cuda --steps "$steps" --warmup 5 --eval-interval 0 --sample-tokens 0 \
    "${flags[@]}" > "$log" 2>&1 || { cat "$log"; echo "bench_train_gpu: moe-train failed" >&2; exit 1; }
grep -E "^(placement|GPU memory|world)" "$log" || true
python3 - "$log" "$peak" <<'PY'
import re, statistics, sys
text = open(sys.argv[1]).read()
peak = float(sys.argv[2]) * 1e12
def flag(name, default=None):
    m = re.search(r"^\s*%s\s+(\S+)" % re.escape(name), text, re.M)
    return m.group(1) if m else default
L, d, S = int(flag("--layers")), int(flag("--d-model")), int(flag("--seq-len"))
E, k = int(flag("--experts")), int(flag("--top-k"))
m = re.search(r"(\d+) dense \+ (\d+) expert parameters per rank", text)
dense, expert = int(m.group(1)), int(m.group(2))
active = dense + expert * k / E
rates = [float(r) for s, r in re.findall(r"^step\s+(\d+) .*?\|\s+([\d.]+) tok/s", text, re.M) if int(s) > 10]
tps = statistics.median(rates)
flops_per_token = 6 * active + 12 * L * d * S
print("parameters %.3fB total, %.3fB active; model FLOPs per token %.3g (6 N_active + 12 L d S)" %
      ((dense + expert) / 1e9, active / 1e9, flops_per_token))
print("tokens/s median %.0f (steps 11-%d); %.1f TFLOP/s; MFU %.1f%% of %.0f TFLOP/s" %
      (tps, len(rates) + 10, tps * flops_per_token / 1e12, 100 * tps * flops_per_token / peak, peak / 1e12))
PY
