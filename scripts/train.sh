#!/usr/bin/env bash
# train.sh — the README's first command: installs what is missing, builds, prepares the default data
# (the King James Bible, byte-level, from Debian's bible-kjv) and trains the default MoE language model
# with moe-train under mpirun on MOE_RANKS ranks (default 2). Extra arguments go to moe-train
# (see: build/moe-train --help); the metrics land in data/train_metrics.jsonl.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh" bible-kjv
bash "$moe_root/scripts/prepare_data.sh"
source "$moe_root/scripts/mpi_env.sh"
ranks="${MOE_RANKS:-2}"
cd "$moe_root"
exec mpirun -np "$ranks" "$moe_build/moe-train" \
    --train-data data/kjv_train.bin --val-data data/kjv_val.bin --log-file data/train_metrics.jsonl "$@"
