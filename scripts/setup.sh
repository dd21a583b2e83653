# setup.sh — sourced by train.sh and test.sh: installs what is missing, then configures and builds.
#   source scripts/setup.sh [extra Debian packages...]
# Idempotent: apt-get runs (update included) only when a package is missing; meson configures once.
# Environment: MOE_BUILD_DIR (default build), MOE_BUILDTYPE (default release), MOE_MARCH (default native: the C code
# compiled for this machine's CPU, core/cpu_target.h; empty for a build that runs on any x86-64), MOE_SETUP_ARGS
# (more arguments for meson setup, e.g. -Dcuda=disabled; used when the build directory is configured, not later;
# MOE_BUILDTYPE and MOE_MARCH are applied to a configured one where they differ).

moe_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
moe_build="${MOE_BUILD_DIR:-$moe_root/build}"
source "$moe_root/scripts/setup_lib.sh"
moe_install_packages "${moe_build_packages[@]}" "$@" || exit 1
moe_build_env

# A build folder configured before keeps its options; MOE_BUILDTYPE or MOE_MARCH given and differing from them are
# applied to it (meson configure), said so (until 2026-12-07 they were ignored there without a word).
moe_option_changes() {
    python3 - "$moe_build/meson-info/intro-buildoptions.json" "${MOE_BUILDTYPE:-}" "${MOE_MARCH-}" "${MOE_MARCH+set}" << 'PY'
import json, sys
path, buildtype, march, march_given = sys.argv[1:]
have = {o["name"]: o["value"] for o in json.load(open(path))}
if buildtype and have.get("buildtype") != buildtype:
    print("-Dbuildtype=" + buildtype)
if march_given and have.get("march") != march:
    print("-Dmarch=" + march)
PY
}
if [ -f "$moe_build/build.ninja" ] && [ -f "$moe_build/meson-info/intro-buildoptions.json" ]; then
    mapfile -t moe_changes < <(moe_option_changes)
    if [ ${#moe_changes[@]} -gt 0 ]; then
        echo "setup.sh: $moe_build was configured with other options: meson configure ${moe_changes[*]}"
        meson configure "$moe_build" "${moe_changes[@]}" || exit 1
    fi
fi
if [ ! -f "$moe_build/build.ninja" ]; then
    mapfile -t moe_native < <(moe_cuda_native_file "$moe_build")
    # shellcheck disable=SC2086 # MOE_SETUP_ARGS is a list of words
    meson setup "$moe_build" "$moe_root" --buildtype="${MOE_BUILDTYPE:-release}" -Dmarch="${MOE_MARCH-native}" \
        "${moe_native[@]}" ${MOE_SETUP_ARGS:-}
fi
meson compile -C "$moe_build"
