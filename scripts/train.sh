#!/usr/bin/env bash
# train.sh — the README's first command: installs what is missing, builds, prepares the default data
# (the King James Bible, byte-level, from Debian's bible-kjv) and trains the default MoE language model
# with moe-train under mpirun on MOE_RANKS ranks (default 2). Extra arguments go to moe-train
# (see: build/moe-train --help); the metrics land in data/train_metrics.jsonl. Ctrl-C (or SIGTERM) stops the run
# at the next step, after a checkpoint when --checkpoint-dir is given; twice, at once.
set -euo pipefail
ranks="${MOE_RANKS:-2}" # mpirun -np 0 would take every slot, and a word gets its own format error
# (at most 7 digits: bash's arithmetic wraps a longer number, and 99999999999999999999 ranks had mpirun fill the
# machine's memory: a probe, 2026-12-07)
case "$ranks" in *[!0-9]* | ????????*) ranks=0 ;; esac
if [ "$((10#$ranks))" -lt 1 ]; then
    echo "train.sh: MOE_RANKS must be a positive whole number of ranks (up to 7 digits), not '${MOE_RANKS:-}'" >&2
    exit 2
fi
# a relative MOE_BUILD_DIR is the caller's: absolute before the cd below (a probe: built, then not found)
[ -z "${MOE_BUILD_DIR:-}" ] || MOE_BUILD_DIR=$(realpath -m "$MOE_BUILD_DIR")
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh" bible-kjv
bash "$moe_root/scripts/prepare_data.sh"
source "$moe_root/scripts/mpi_env.sh"
ranks=$((10#$ranks))
# no cd: the caller's relative paths (--checkpoint-dir ck, --train-data mine.bin) are the caller's (a probe, 2026-12-07:
# they landed in, or were looked for in, the repository); the defaults are named whole
# Stopping: Ctrl-C or a SIGTERM to this script (a scheduler's) goes to every rank as itself (they are mpirun's
# children on this node): moe-train saves a checkpoint at the next step boundary (with --checkpoint-dir) and exits
# with 130 or 143, and mpirun, not signalled, waits for the save; a second one ends it at once. (mpirun itself, given
# SIGINT or SIGTERM, passes on SIGTERM after odls_base_sigkill_timeout seconds and SIGKILLs the ranks as long again
# later, 1 s by default: docs/RELIABILITY.md; in a session of its own it sees neither.)
# one rank takes every core: Open MPI would bind it to one (more ranks: a core each, their default thread count)
bind=()
[ "$ranks" -eq 1 ] && bind=(--bind-to none)
# the default data and metrics, but for what the caller gives (--flag value or --flag=value: given twice, refused)
defaults=()
for flag in "--train-data data/kjv_train.bin" "--val-data data/kjv_val.bin" "--log-file data/train_metrics.jsonl"; do
    given=0
    for a in "$@"; do [[ $a == "${flag%% *}" || $a == "${flag%% *}="* ]] && given=1; done
    [ $given = 1 ] || defaults+=("${flag%% *}" "$moe_root/${flag#* }")
done
setsid mpirun -np "$ranks" "${bind[@]}" "$moe_build/moe-train" "${defaults[@]}" "$@" &
job=$!
for sig in INT TERM USR1; do trap "pkill -$sig -P \"\$job\" 2>/dev/null" "$sig"; done
while :; do
    rc=0
    wait "$job" || rc=$?
    kill -0 "$job" 2>/dev/null || exit $rc # else wait was cut short by the trap: the job goes on stopping
done
