#!/bin/bash
# hf_env.sh — the Python environment with transformers 5 that scripts/hf_families.py checks Qwen3-MoE and OLMoE
# against (transformers 4.40, which the default test command installs beside Debian's torch 1.13, has neither family;
# 4.51 and later need torch >= 2). Made once, idempotently, in $MOE_HF_VENV (default ~/.cache/moe-train/hf-venv):
# PyPI's torch 2.15.0 wheel, which on a machine without a GPU imports and runs on the CPU once the NVIDIA libraries it
# links are installed beside it (about 5.6 GB in all), and transformers 5.23.0.
#
#   scripts/hf_env.sh                      make the environment (or say it is there)
#   scripts/hf_env.sh --python ARGS...     run its python with ARGS (LD_LIBRARY_PATH set for torch's libraries)
#   scripts/hf_env.sh --check              exit 0 when it is made, 77 when not (what the meson test asks)
set -euo pipefail
venv=${MOE_HF_VENV:-$HOME/.cache/moe-train/hf-venv}
made="$venv/.made"

library_path() { # torch's NVIDIA libraries and the CUDA toolkit's
    local dirs
    dirs=$(ls -d "$venv"/lib/python3*/site-packages/nvidia/*/lib 2>/dev/null | tr '\n' ':')
    echo "${dirs}/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}

case "${1:-}" in
--check) [ -f "$made" ] && exit 0 || exit 77 ;;
--python)
    shift
    [ -f "$made" ] || { echo "hf_env.sh: no environment at $venv: run scripts/hf_env.sh first" >&2; exit 77; }
    LD_LIBRARY_PATH=$(library_path) exec "$venv/bin/python" "$@" ;;
"") ;;
*) echo "usage: scripts/hf_env.sh [--check | --python ARGS...]" >&2; exit 2 ;;
esac

if [ -f "$made" ]; then
    echo "hf_env.sh: $venv is made"
    exit 0
fi
command -v /usr/bin/python3 > /dev/null || { echo "hf_env.sh: /usr/bin/python3 is missing" >&2; exit 1; }
/usr/bin/python3 -m venv --help > /dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq python3-venv; }
source "$(dirname "${BASH_SOURCE[0]}")/dir_guard.sh"
moe_replaceable "$venv" pyvenv.cfg .made || exit 2 # a venv this script began, or nothing
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
/usr/bin/python3 -m venv "$venv"
echo "hf_env.sh: installing torch 2.15.0 and transformers 5.23.0 into $venv (about 5.6 GB)"
"$venv/bin/pip" install --quiet --no-input torch==2.15.0 transformers==5.23.0 safetensors numpy \
    nvidia-nccl-cu13 nvidia-cufile nvidia-cusparselt-cu13 nvidia-nvshmem-cu13
LD_LIBRARY_PATH=$(library_path) "$venv/bin/python" -c \
    'import torch, transformers; from transformers import Qwen3MoeForCausalLM, OlmoeForCausalLM; print("hf_env.sh: torch", torch.__version__, "transformers", transformers.__version__)'
touch "$made"
