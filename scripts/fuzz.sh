#!/usr/bin/env bash
# fuzz.sh — the fuzz suite (fuzz/): installs what is missing (clang and libFuzzer's runtime, besides setup.sh's
# packages), configures build-fuzz/ once (CC=clang, -Dfuzz=enabled, no CUDA, no MPI: only the parsers), builds,
# and runs `meson test --suite fuzz`: every target replays its corpus under ASan and UBSan, then fuzzes for
# MOE_FUZZ_SECONDS seconds (default 10; new inputs go to build-fuzz/fuzz/scratch/, never into fuzz/corpus/).
#   bash scripts/fuzz.sh [meson test arguments, e.g. fuzz_safetensors]
#   bash scripts/fuzz.sh --build-only    configure and build, no test (scripts/test.sh builds while other lanes test)
# Environment: MOE_FUZZ_BUILD_DIR (default build-fuzz), MOE_FUZZ_SECONDS. Idempotent: apt-get runs only for a
# missing package, meson configures once.
set -euo pipefail
build_only=0
[ "${1:-}" = "--build-only" ] && { build_only=1; shift; }
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export CC=clang MOE_BUILD_DIR="${MOE_FUZZ_BUILD_DIR:-$root/build-fuzz}" MOE_BUILDTYPE=debugoptimized
export MOE_SETUP_ARGS="-Dfuzz=enabled -Dcuda=disabled -Dmpi=disabled"
source "$root/scripts/setup.sh" clang libclang-rt-14-dev
# every run sets it, so that a value given once does not stay in build-fuzz for the runs after it (a probe, 2026-12-07);
# only when it changes (meson configure touches the build files, and the next compile then regenerates them)
seconds="${MOE_FUZZ_SECONDS:-10}"
if [ "$(meson introspect "$moe_build" --buildoptions 2>/dev/null |
    python3 -c 'import json, sys; print(next((o["value"] for o in json.load(sys.stdin) if o["name"] == "fuzz_seconds"), ""))' \
    2>/dev/null)" != "$seconds" ]; then
    meson configure "$moe_build" -Dfuzz_seconds="$seconds"
fi
[ $build_only -eq 1 ] && exit 0
meson test -C "$moe_build" --suite fuzz --print-errorlogs "$@"
