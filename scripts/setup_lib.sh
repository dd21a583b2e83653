# setup_lib.sh — sourced by setup.sh and gpu_check.sh: what both do before they configure a build.
#   moe_install_packages PKG...  installs the Debian packages that are missing (apt-get update included, only when
#                                one is missing; as root or through sudo); non-zero on failure
#   moe_build_packages           what the build and the tests need beyond a C compiler
#   moe_build_env                nvcc on PATH where the toolkit is installed in its standard place; OpenBLAS's
#                                kernels for AVX-512 where the CPU has it
moe_install_packages() {
    local p missing=() sudo=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    [ ${#missing[@]} -gt 0 ] || return 0
    echo "setup: installing ${missing[*]}"
    if [ "$(id -u)" -ne 0 ]; then
        command -v sudo > /dev/null || { echo "setup: need root (or sudo) to install: ${missing[*]}" >&2; return 1; }
        sudo=(sudo)
    fi
    "${sudo[@]}" apt-get update -qq &&
        DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

moe_build_packages=(build-essential meson ninja-build pkg-config libopenblas-dev libdnnl-dev libopenmpi-dev openmpi-bin
    libjansson-dev)

# moe_cuda_native_file BUILD_DIR: where nvcc is on PATH, writes BUILD_DIR/nvcc_deps.ini, a meson machine file that makes
# scripts/nvcc_deps the CUDA compiler (meson 1.0.1 asks nvcc for no dependency files: without it a .cu object is not
# rebuilt when only a header it includes changes), and prints "--native-file BUILD_DIR/nvcc_deps.ini" for `meson
# setup`; prints nothing where there is no nvcc. Before the first `meson setup` of BUILD_DIR only (meson keeps its
# compilers).
moe_cuda_native_file() {
    command -v nvcc > /dev/null 2>&1 || return 0
    local root
    root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    mkdir -p "$1" && printf "[binaries]\ncuda = '%s'\n" "$root/scripts/nvcc_deps" > "$1/nvcc_deps.ini" &&
        printf '%s\n' --native-file "$1/nvcc_deps.ini"
}

moe_build_env() {
    # nvcc lives outside PATH in the standard toolkit install; meson builds the CUDA code when it finds it.
    if [ -x /usr/local/cuda/bin/nvcc ]; then
        case ":$PATH:" in *:/usr/local/cuda/bin:*) ;; *) export PATH="/usr/local/cuda/bin:$PATH" ;; esac
    fi
    # OpenBLAS 0.3.21 mis-detects AVX-512 CPUs; its SkylakeX kernels are nearly twice as fast there.
    if [ -z "${OPENBLAS_CORETYPE:-}" ] && grep -qw avx512f /proc/cpuinfo 2>/dev/null; then
        export OPENBLAS_CORETYPE=SkylakeX
    fi
}
