#!/usr/bin/env bash
# train.sh — the README's first command: installs, builds, then trains.
# For now it trains one MoE layer (moe-layer-demo, a teacher-student fit); the language-model trainer
# replaces it when it lands. Extra arguments go to the program (see: build/moe-layer-demo --help).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
"$moe_build/moe-layer-demo" "$@"
