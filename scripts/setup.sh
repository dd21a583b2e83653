# setup.sh — sourced by train.sh and test.sh: installs what is missing, then configures and builds.
#   source scripts/setup.sh [extra Debian packages...]
# Idempotent: apt-get runs (update included) only when a package is missing; meson configures once.
# Environment: MOE_BUILD_DIR (default build), MOE_BUILDTYPE (default release), MOE_MARCH (default native: the C code
# compiled for this machine's CPU, core/cpu_target.h; empty for a build that runs on any x86-64), MOE_SETUP_ARGS
# (more arguments for meson setup, e.g. -Dcuda=disabled; used when the build directory is configured, not later).

moe_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
moe_build="${MOE_BUILD_DIR:-$moe_root/build}"
source "$moe_root/scripts/setup_lib.sh"
moe_install_packages "${moe_build_packages[@]}" "$@" || exit 1
moe_build_env

if [ ! -f "$moe_build/build.ninja" ]; then
    mapfile -t moe_native < <(moe_cuda_native_file "$moe_build")
    # shellcheck disable=SC2086 # MOE_SETUP_ARGS is a list of words
    meson setup "$moe_build" "$moe_root" --buildtype="${MOE_BUILDTYPE:-release}" -Dmarch="${MOE_MARCH-native}" \
        "${moe_native[@]}" ${MOE_SETUP_ARGS:-}
fi
meson compile -C "$moe_build"
