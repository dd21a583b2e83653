# bundle_env.sh — sourced: puts the GPU bundle (scripts/gpu_bundle.sh) to use on a machine that lacks what the
# build and the tests need (a bare GPU machine: CUDA, Python, meson and ninja, no Open MPI, jansson, OpenBLAS or
# pkg-config, no package registry).
#   source scripts/bundle_env.sh
#   moe_bundle_activate BUNDLE_DIR PREFIX   # unpacks into PREFIX (made anew; never /), exports the environment
#   moe_nccl_dir PREFIX                     # prints a folder for meson's -Dnccl_dir, or nothing (see below)
# The packages are Debian 12's (glibc 2.36), unpacked under PREFIX/usr, never over /. What activation exports:
#   PATH             PREFIX/usr/bin first (mpirun, pkg-config)
#   LD_LIBRARY_PATH  the bundle's library folders first (Open MPI, PMIx, OpenBLAS, jansson, ...); the few base
#                    libraries a bare machine may still lack (libudev, libuuid, libatomic) only where the system
#                    has none of that name (ldconfig -p), so that the system's own copies keep serving the rest
#   PKG_CONFIG, PKG_CONFIG_PATH  the bundle's pkgconf and .pc files, whose /usr paths are rewritten to PREFIX/usr
#   OPAL_PREFIX, OPAL_SYSCONFDIR, PMIX_INSTALL_PREFIX  Open MPI's and PMIx's relocation: they look for their
#                    plugins, help texts and configuration under PREFIX instead of the /usr they were built for
#   PMIX_MCA_pcompress_base_silence_warning  (below)
# Returns non-zero with a message on stderr when the bundle is missing or incomplete.

moe_bundle_activate() {
    local bundle=$1 prefix=$2
    case $prefix in
    / | "" | /usr | /usr/*) echo "bundle_env: will not unpack into '$prefix' (give a private folder)" >&2; return 1 ;;
    esac
    local tarball="$bundle/debian-packages.tar.gz"
    [ -f "$tarball" ] || { echo "bundle_env: $tarball missing: run scripts/gpu_bundle.sh where apt works" >&2; return 1; }
    local need have
    need=$(sed -n 's/^glibc //p' "$bundle/MANIFEST" 2>/dev/null)
    have=$(getconf GNU_LIBC_VERSION 2>/dev/null | sed 's/^glibc //')
    if [ -n "$need" ] && [ -n "$have" ] && [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -n 1)" != "$need" ]; then
        echo "bundle_env: the bundle's libraries need glibc $need or newer; this machine has $have (make the" \
            "bundle on a Debian release as old as this machine, or install Open MPI, jansson and OpenBLAS here)" >&2
        return 1
    fi
    source "$(dirname "${BASH_SOURCE[0]}")/dir_guard.sh"
    moe_replaceable "$prefix" usr/lib/x86_64-linux-gnu/libmpi.so.40 fallback-active || return 1 # one it unpacked
    rm -rf "$prefix" && mkdir -p "$prefix" || return 1
    prefix=$(cd "$prefix" && pwd)
    tar -xzf "$tarball" -C "$prefix" || { echo "bundle_env: could not unpack $tarball" >&2; return 1; }
    local lib="$prefix/usr/lib/x86_64-linux-gnu"
    [ -f "$lib/libmpi.so.40" ] || { echo "bundle_env: $tarball holds no Open MPI" >&2; return 1; }

    # .pc files name /usr (as prefix= or as whole paths): point them into the prefix
    local pc
    while IFS= read -r -d '' pc; do
        sed -i -E "s#^([A-Za-z_]+)=/usr(/|\$)#\\1=$prefix/usr\\2#" "$pc" || return 1
    done < <(find "$prefix/usr" -name '*.pc' -type f -print0)

    # base libraries, only where the system lacks them (ldconfig's cache names a file that is there)
    local active="$prefix/fallback-active" so name path
    mkdir -p "$active"
    for so in "$prefix"/fallback/*.so.*; do
        [ -e "$so" ] || continue
        name=$(basename "$so")
        path=$(ldconfig -p 2>/dev/null | awk -v n="$name" '$1 == n { print $NF; exit }')
        [ -n "$path" ] && [ -e "$path" ] || ln -sf "$so" "$active/$name"
    done

    export PATH="$prefix/usr/bin:$PATH"
    export LD_LIBRARY_PATH="$lib:$lib/openmpi/lib:$lib/openblas-pthread:$active${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export PKG_CONFIG="$prefix/usr/bin/pkgconf"
    export PKG_CONFIG_PATH="$lib/pkgconfig:$lib/openmpi/lib/pkgconfig:$lib/openblas-pthread/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
    export OPAL_PREFIX="$prefix/usr" OPAL_SYSCONFDIR="$prefix/etc/openmpi" PMIX_INSTALL_PREFIX="$prefix/usr"
    # PMIx also opens plugins at the path it was built with (/usr/lib/x86_64-linux-gnu/pmix2/lib/pmix), relocated or
    # not (neither PMIX_INSTALL_PREFIX nor its component-path variables change that, strace, 2026-11-26): on a
    # machine whose own PMIx is there, its zlib plugin fails to load ("undefined symbol: pmix_output_info", an H100
    # image) and PMIx prints a banner about compression. Harmless (it compresses nothing at these sizes): the banner
    # is silenced, the one dlopen line stays.
    export PMIX_MCA_pcompress_base_silence_warning=1
    export MOE_BUNDLE_PREFIX="$prefix"
}

# NCCL for the build: the toolkit's own (meson finds it there; nothing to print), else the system's (a distribution's
# libnccl-dev: /usr/include/nccl.h and libnccl.so.2 in ldconfig's cache), else a pip package beside the machine's
# python3 (PyTorch's nvidia-nccl-cu13 or -cu12: nccl.h and libnccl.so.2 below the `nvidia` namespace package,
# nvidia/nccl/ or nvidia/cu13/ by the wheel's generation; no libnccl.so). For the last two a folder PREFIX/nccl is
# made, include/ with links to the nccl* headers and lib/libnccl.so(.2) -> the library, and printed (meson's
# -Dnccl_dir). Nothing printed and status 1 when none has NCCL (the build then goes without it and says so).
moe_nccl_dir() {
    local prefix=$1 cuda
    cuda=$(dirname "$(dirname "$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")")
    [ -f "$cuda/include/nccl.h" ] && return 0
    local header="" library="" py roots="" root h
    if [ -f /usr/include/nccl.h ]; then
        library=$(ldconfig -p 2>/dev/null | awk '$1 == "libnccl.so.2" { print $NF; exit }')
        [ -n "$library" ] && header=/usr/include/nccl.h
    fi
    if [ -z "$header" ]; then
        library=""
        for py in python3 /usr/bin/python3; do
            roots=$("$py" -c 'import nvidia; print("\n".join(nvidia.__path__))' 2>/dev/null) && [ -n "$roots" ] && break
            roots=""
        done
        while IFS= read -r root; do
            [ -d "$root" ] || continue
            [ -n "$header" ] || header=$(find "$root" -maxdepth 4 -path '*/include/nccl.h' -print -quit 2>/dev/null)
            [ -n "$library" ] || library=$(find "$root" -maxdepth 4 -name libnccl.so.2 -print -quit 2>/dev/null)
        done <<< "$roots"
    fi
    [ -n "$header" ] && [ -n "$library" ] || return 1
    rm -rf "$prefix/nccl" && mkdir -p "$prefix/nccl/lib" "$prefix/nccl/include" || return 1
    for h in "$(dirname "$header")"/nccl*; do ln -sf "$h" "$prefix/nccl/include/"; done
    ln -sf "$library" "$prefix/nccl/lib/libnccl.so.2"
    ln -sf libnccl.so.2 "$prefix/nccl/lib/libnccl.so"
    echo "$prefix/nccl"
}
