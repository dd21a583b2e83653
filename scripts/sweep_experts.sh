#!/usr/bin/env bash
# sweep_experts.sh [sweep_experts.py flags] [-- moe-train flags] — installs what is missing (python3-matplotlib
# for the plots, bible-kjv for the data, time for peak memory), builds, prepares data/kjv_{train,val}.bin,
# then runs scripts/sweep_experts.py: moe-train on 2 ranks for several expert counts at the same active
# parameters, with a table (sweep.csv, sweep.md) and plots in --out. Resumable: rerun to finish a sweep.
#   scripts/sweep_experts.sh --experts-list 1 2 4 8 16 --steps 300 --out /tmp/sweep-kjv -- --eval-batches 16
# docs/SWEEPS.md shows a sweep and what to read from it.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh" python3-matplotlib bible-kjv time
"$moe_root/scripts/prepare_data.sh"
exec /usr/bin/python3 "$moe_root/scripts/sweep_experts.py" --moe-train "$moe_build/moe-train" "$@"
