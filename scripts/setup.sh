# setup.sh — sourced by train.sh and test.sh: installs what is missing, then configures and builds.
#   source scripts/setup.sh [extra Debian packages...]
# Idempotent: apt-get runs (update included) only when a package is missing; meson configures once.
# Environment: MOE_BUILD_DIR (default build), MOE_BUILDTYPE (default release), MOE_SETUP_ARGS (more arguments
# for meson setup, e.g. -Dcuda=disabled; used when the build directory is configured, not later).

moe_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
moe_build="${MOE_BUILD_DIR:-$moe_root/build}"
moe_packages=(build-essential meson ninja-build pkg-config libopenblas-dev libdnnl-dev libopenmpi-dev openmpi-bin libjansson-dev "$@")

moe_missing=()
for p in "${moe_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || moe_missing+=("$p")
done
if [ ${#moe_missing[@]} -gt 0 ]; then
    echo "setup: installing ${moe_missing[*]}"
    moe_sudo=()
    if [ "$(id -u)" -ne 0 ]; then
        command -v sudo >/dev/null || { echo "setup: need root (or sudo) to install: ${moe_missing[*]}" >&2; exit 1; }
        moe_sudo=(sudo)
    fi
    "${moe_sudo[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${moe_sudo[@]}" apt-get install -y -qq --no-install-recommends "${moe_missing[@]}"
fi

# nvcc lives outside PATH in the standard toolkit install; meson builds the CUDA code when it finds it.
[ -x /usr/local/cuda/bin/nvcc ] && case ":$PATH:" in *:/usr/local/cuda/bin:*) ;; *) export PATH="/usr/local/cuda/bin:$PATH" ;; esac

# OpenBLAS 0.3.21 mis-detects AVX-512 CPUs; its SkylakeX kernels are nearly twice as fast there.
if [ -z "${OPENBLAS_CORETYPE:-}" ] && grep -qw avx512f /proc/cpuinfo 2>/dev/null; then
    export OPENBLAS_CORETYPE=SkylakeX
fi

if [ ! -f "$moe_build/build.ninja" ]; then
    # shellcheck disable=SC2086 # MOE_SETUP_ARGS is a list of words
    meson setup "$moe_build" "$moe_root" --buildtype="${MOE_BUILDTYPE:-release}" ${MOE_SETUP_ARGS:-}
fi
meson compile -C "$moe_build"
