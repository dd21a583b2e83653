#!/usr/bin/env bash
# bench_train_gpu.sh [--model 1.2b|mixtral] [--torch] [--tokens random|kjv] [--peak-tflops F] [--steps N] [--data DIR]
#                   [moe-train flags...]
# — training throughput and MFU on one GPU with moe-train --device cuda (bf16 by default), for docs/BENCHMARKS.md, and
# with --torch the PyTorch peer of the same model on the same GPU (bench/bench_train_torch_gpu.py: transformers'
# MixtralForCausalLM, bf16 autocast, SDPA, fused AdamW), tokens/s side by side. Needs the build (scripts/setup.sh), a
# GPU (and for --tokens kjv the data: scripts/prepare_data.sh). Exit 77 without a GPU.
#
# The models (bench/train_gpu_model.sh):
#   1.2b (default): 16 layers, d_model 1024, 16 heads, 8 KV heads, 8 experts of d_ff 2816, top-2, vocab 32000,
#     sequences of 1024 tokens, 16 per step (2 micro-batches of 8), lr 3e-4: 1.22e9 parameters, 0.39e9 active per token.
#   mixtral: Mixtral 8x7B's layer shape (d 4096, 32 heads / 8 kv, 8 experts of d_ff 14336, top-2, vocab 32000, S 4096),
#     4 sequences a step one at a time, --recompute full, lr 1e-4, with as many layers as moe-plan's memory model
#     (the one moe-train checks itself against) fits in the GPU's memory (2 on 80 GB: 63.5 GB predicted).
# Extra flags replace the model's (moe-train refuses a flag given twice, so a default is dropped for every flag given).
#
# The tokens (--tokens): random (the default) — uniformly random ids over the vocabulary, written by this script, as
# Megatron-LM's mock data: a throughput benchmark's routing must stay balanced while it is timed, and on real text it
# does not: the KJV token files (bytes, or a 21k BPE) route unevenly from the first step, before any update (expert
# loads 0.00-2.63 of the mean at step 1 on the 1.2B shape cut to 2 layers, and 0.00-4.00 within 8 steps whether lr
# 3e-3 or 3e-4, aux-loss coefficient 0.01 or 0.1, softmax or sigmoid routing with bias steps of 0.01; random ids: 0.34-
# 1.59 and staying there; docs/BENCHMARKS.md); kjv: DIR/kjv_train.bin and DIR/kjv_val.bin (default DIR: the
# checkout's data/, scripts/prepare_data.sh). The expert loads' range over the steps is printed either way.
#
# MFU = achieved model FLOP/s / the GPU's dense bf16 peak, with the model FLOPs of one token
#   6 * N + 12 * L * d_model * S
# (PaLM, Chowdhery et al. 2022, appendix B: 6N for the forward and backward products of the weights; 12 L d S for
# attention's QK^T and AV, forward and backward, without halving for the causal mask). N counts the parameters a token's
# products use: every dense parameter but the embedding table (a lookup, not a product; lm_head counted) plus k/E of the
# expert parameters. Recompute's extra forward is not counted (MFU, not hardware FLOP utilisation). Tokens/s is the
# median over the steps after the first 10 (start-up, allocation and cuBLAS's first calls excluded).
# Peak: H100 SXM and H200 989 TFLOP/s, H100 PCIe 756, A100 312 (dense bf16, NVIDIA's data sheets), from
# nvidia-smi's name unless --peak-tflops is given.
set -euo pipefail
export LC_ALL=C.UTF-8 # a decimal point in awk and printf whatever the user's locale (de_DE's comma broke them)
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/flag_value.sh"
build="${MOE_BUILD_DIR:-$root/build}"
steps=40 peak="" data="$root/data" model=1.2b torch=0 tokens=random
while [ $# -gt 0 ]; do
    case $1 in
    --model) moe_flag_value bench_train_gpu "$@"; model=$2; shift 2 ;;
    --tokens) moe_flag_value bench_train_gpu "$@"; tokens=$2; shift 2 ;;
    --torch) torch=1; shift ;;
    --peak-tflops) moe_flag_value bench_train_gpu "$@"; peak=$2; shift 2 ;;
    --steps) moe_flag_value bench_train_gpu "$@"; steps=$2; shift 2 ;;
    --data) moe_flag_value bench_train_gpu "$@"; data=$2; shift 2 ;;
    *) break ;;
    esac
done
[ "$steps" -gt 10 ] || { echo "bench_train_gpu: --steps must exceed 10 (the first 10 are not timed)" >&2; exit 2; }

name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 || true)
[ -n "$name" ] || { echo "bench_train_gpu: no GPU (nvidia-smi finds none)"; exit 77; }
if [ -z "$peak" ]; then
    case $name in
    *H100*PCIe*) peak=756 ;;
    *H100* | *H200* | *GH200*) peak=989 ;;
    *A100*) peak=312 ;;
    *) echo "bench_train_gpu: unknown GPU '$name': give --peak-tflops" >&2; exit 2 ;;
    esac
fi
source "$root/bench/train_gpu_model.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
case $tokens in
kjv)
    data=$(cd "$data" && pwd) || { echo "bench_train_gpu: no data folder $data" >&2; exit 2; }
    train="$data/kjv_train.bin" val="$data/kjv_val.bin" ;;
random) # llm.c token files of uniformly random ids below 32000 (seeded: the same tokens every run)
    train="$tmp/random_train.bin" val="$tmp/random_val.bin"
    python3 - "$train" "$val" <<'PY'
import random, struct, sys
rng = random.Random(1337)
for path, n in ((sys.argv[1], 1 << 21), (sys.argv[2], 1 << 17)):
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
        f.write(struct.pack("<%dH" % n, *(rng.randrange(32000) for _ in range(n))))
PY
    ;;
*) echo "bench_train_gpu: --tokens is random or kjv, not '$tokens'" >&2; exit 2 ;;
esac
layers=16
if [ "$model" = mixtral ]; then # the most layers moe-plan says fit (its memory model is moe-train's own check)
    gpu_gb=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -n 1 | awk '{ print $1 * 1.048576 / 1000 }')
    layers=0
    for try in $(seq 1 32); do
        train_gpu_model_flags mixtral "$try" "$train" "$val" "$@"
        fits=$("$build/moe-plan" --layers "$try" --d-model "$(train_gpu_flag --d-model)" --heads "$(train_gpu_flag --heads)" \
            --kv-heads "$(train_gpu_flag --kv-heads)" --d-ff "$(train_gpu_flag --d-ff)" --experts 8 --top-k 2 \
            --vocab 32000 --seq-len "$(train_gpu_flag --seq-len)" --micro-batch 1 --recompute full \
            --gpus-per-node 1 --gpu-memory "$gpu_gb" --json | python3 -c 'import json, sys; print(int(json.load(sys.stdin)["prediction"]["fits"]))')
        [ "$fits" = 1 ] && layers=$try || break
    done
    [ "$layers" -ge 1 ] || { echo "bench_train_gpu: not one Mixtral-shape layer fits $gpu_gb GB (moe-plan)" >&2; exit 1; }
    echo "mixtral shape: $layers layers fit $name's $gpu_gb GB (moe-plan)"
fi
train_gpu_model_flags "$model" "$layers" "$train" "$val" "$@"
source "$root/scripts/mpi_env.sh"
log="$tmp/moe-train.log" torch_log="$tmp/torch.log"
: > "$torch_log"
mpirun -np 1 "$build/moe-train" --device cuda --steps "$steps" --warmup 5 --eval-interval 0 --sample-tokens 0 \
    "${flags[@]}" > "$log" 2>&1 || { cat "$log"; echo "bench_train_gpu: moe-train failed" >&2; exit 1; }
grep -E "^(placement|GPU memory|world)|^step +[0-9]+ on the GPU" "$log" || true
if [ $torch = 1 ]; then # the same model, batch and learning rate in PyTorch (its warm-up: the same 10 untimed steps)
    python3 "$root/bench/bench_train_torch_gpu.py" --train-data "$train" --steps "$steps" --warmup 10 \
        --layers "$(train_gpu_flag --layers)" --d-model "$(train_gpu_flag --d-model)" --heads "$(train_gpu_flag --heads)" \
        --kv-heads "$(train_gpu_flag --kv-heads)" --d-ff "$(train_gpu_flag --d-ff)" --experts "$(train_gpu_flag --experts)" \
        --top-k "$(train_gpu_flag --top-k)" --vocab "$(train_gpu_flag --vocab)" --seq-len "$(train_gpu_flag --seq-len)" \
        --batch "$(train_gpu_flag --batch)" --micro-batches "$(train_gpu_flag --micro-batches)" \
        --lr "$(train_gpu_flag --lr)" --recompute "$( [ "$(train_gpu_flag --recompute)" = full ] && echo full || echo none)" \
        > "$torch_log" 2>&1 || echo "bench_train_gpu: the PyTorch peer failed or did not run (its last lines below)"
    grep -E "^(GPU|model|tokens/s|bench_train_torch_gpu)" "$torch_log" || tail -n 5 "$torch_log"
fi
python3 - "$log" "$peak" "$torch_log" <<'PY'
import json, re, statistics, sys
text = open(sys.argv[1]).read()
peak = float(sys.argv[2]) * 1e12
def flag(name, default=None):
    m = re.search(r"^\s*%s\s+(\S+)" % re.escape(name), text, re.M)
    return m.group(1) if m else default
L, d, S = int(flag("--layers")), int(flag("--d-model")), int(flag("--seq-len"))
E, k, V = int(flag("--experts")), int(flag("--top-k")), int(flag("--vocab"))
m = re.search(r"(\d+) dense \+ (\d+) expert parameters per rank", text)
dense, expert = int(m.group(1)), int(m.group(2))
active = dense + expert * k / E
products = active - (0 if flag("--tie-embeddings", "0") == "1" else V * d)  # the embedding is a lookup
rates = [float(r) for s, r in re.findall(r"^step\s+(\d+) .*?\|\s+([\d.]+) tok/s", text, re.M) if int(s) > 10]
loads = re.findall(r"^step\s+(\d+) .*?\| load ([\d.]+)-([\d.]+)", text, re.M)
tps = statistics.median(rates)
flops_per_token = 6 * products + 12 * L * d * S
print("parameters %.3fB total, %.3fB active (%.3fB in products); model FLOPs per token %.3g (6 N + 12 L d S)" %
      ((dense + expert) / 1e9, active / 1e9, products / 1e9, flops_per_token))
if loads:
    lo, hi = min(float(l) for _, l, _ in loads), max(float(h) for _, _, h in loads)
    print("expert loads over the steps: %.2f-%.2f of the mean (1.00 each: balanced)" % (lo, hi))
print("tokens/s median %.0f (steps 11-%d); %.1f TFLOP/s; MFU %.1f%% of %.0f TFLOP/s" %
      (tps, len(rates) + 10, tps * flops_per_token / 1e12, 100 * tps * flops_per_token / peak, peak / 1e12))
peer = [json.loads(l[6:]) for l in open(sys.argv[3]).read().splitlines() if l.startswith("json: ")]
if peer:
    t = peer[-1]["tokens_per_s"]
    print("PyTorch peer (transformers %s, torch %s): tokens/s median %.0f, MFU %.1f%%; moe-train / PyTorch %.2fx" %
          (peer[-1]["transformers"], peer[-1]["torch"], t, 100 * t * flops_per_token / peak, tps / t))
PY
