#!/usr/bin/env bash
# prepare_data.sh — the default data set: the King James Bible from Debian's bible-kjv package, as
# byte-level llm.c token files (vocab 256), split 90/10 into data/kjv_train.bin and data/kjv_val.bin.
# Nothing is downloaded but the Debian package, and no corpus text is committed. Idempotent.
# Needs the build (scripts/setup.sh) for moe-text-to-tokens.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${MOE_BUILD_DIR:-$root/build}"
out="$root/data"
if [ -f "$out/kjv_train.bin" ] && [ -f "$out/kjv_val.bin" ]; then
    echo "prepare_data: $out/kjv_train.bin and kjv_val.bin exist"
    exit 0
fi
if ! command -v bible >/dev/null; then
    echo "prepare_data: installing bible-kjv"
    [ "$(id -u)" -eq 0 ] || { echo "prepare_data: need root to install bible-kjv" >&2; exit 1; }
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends bible-kjv
fi
mkdir -p "$out"
text="$(mktemp)"
trap 'rm -f "$text"' EXIT
# every verse of Genesis 1:1 .. Revelation 22:21, without the "Ge1:1 " references
bible -f "gen1:1-rev22:21" | sed -E 's/^[1-3]?[A-Za-z]+[0-9]+:[0-9]+ //' > "$text"
"$build/moe-text-to-tokens" "$text" "$out/kjv_train.bin" "$out/kjv_val.bin" 0.1
