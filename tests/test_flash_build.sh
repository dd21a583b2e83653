#!/bin/sh
# test_flash_build.sh — the tensor-core flash attention's build checks (issue 50, item 6), without a GPU:
#   - for each GPU architecture the build targets, ptxas's resource report (-Xptxas -v) of kernels/attention_flash.cu
#     names every kernel with "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads": no register spills and
#     no local memory (a per-thread array that the compiler could not keep in registers would show here);
#   - the PTX nvcc emits holds, in every kernel's entry, mma.sync.aligned.m16n8k16 with bf16 inputs and fp32
#     accumulation, ldmatrix and cp.async (the tensor-core path fed asynchronously, not an FMA fallback);
#   - where cuobjdump is installed, the SASS of the newest architecture holds HMMA instructions.
# Usage: test_flash_build.sh NVCC SOURCE_ROOT ARCH... (the build's -Dgpu_arch, e.g. 80 90). Suite unit.
set -eu
nvcc=$1 root=$2
shift 2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
src="$root/kernels/attention_flash.cu"
fail=0
kernels=12 # forward, dQ and dK/dV (one and two stages of queries) at head_dim 32, 64 and 128
last=$(for arch in "$@"; do echo "$arch"; done | tail -n 1)
mkdir "$tmp/keep"
for arch in "$@"; do
    keep="" # the newest architecture's compile keeps its PTX (checked below): no compile of its own
    [ "$arch" = "$last" ] && keep="-keep -keep-dir $tmp/keep" # mktemp's path: no spaces
    # shellcheck disable=SC2086
    "$nvcc" -std=c++17 -O3 -I"$root" -gencode "arch=compute_$arch,code=sm_$arch" -Xptxas -v -cubin $keep \
        -o "$tmp/flash_$arch.cubin" "$src" 2>"$tmp/ptxas_$arch.log"
    entries=$(grep -c "Compiling entry function" "$tmp/ptxas_$arch.log" || true)
    clean=$(grep -c "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads" "$tmp/ptxas_$arch.log" || true)
    echo "sm_$arch: $entries kernels, $clean with no stack frame and no spills"
    grep -E "Used [0-9]+ registers" "$tmp/ptxas_$arch.log" | sed 's/^ptxas info *: */    /'
    if [ "$entries" -ne "$kernels" ] || [ "$clean" -ne "$kernels" ]; then
        echo "FAIL sm_$arch: expected $kernels kernels, each without spills or a stack frame:"
        cat "$tmp/ptxas_$arch.log"
        fail=1
    fi
done
cp "$tmp/keep/attention_flash.ptx" "$tmp/flash.ptx" || { echo "FAIL: nvcc -keep left no PTX"; exit 1; }
# per .entry: whether it holds the bf16 mma and ldmatrix
awk '/^\.visible \.entry|^\.entry/ { entry++; name[entry] = $NF }
     /mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.bf16\.bf16\.f32/ { mma[entry]++ }
     /ldmatrix\.sync\.aligned\.m8n8\.x4/ { ldm[entry]++ }
     /cp\.async\.cg\.shared\.global/ { cpa[entry]++ }
     END { for (e = 1; e <= entry; e++) printf "%s %d %d %d\n", name[e], mma[e] + 0, ldm[e] + 0, cpa[e] + 0 }' \
    "$tmp/flash.ptx" \
    >"$tmp/entries"
entries=$(wc -l <"$tmp/entries")
with=$(awk '$2 > 0 && $3 > 0 && $4 > 0' "$tmp/entries" | wc -l)
echo "PTX (compute_$last): $entries kernels, $with with mma.m16n8k16 bf16, ldmatrix and cp.async"
if [ "$entries" -ne "$kernels" ] || [ "$with" -ne "$kernels" ]; then
    echo "FAIL: a kernel without tensor-core instructions:"
    cat "$tmp/entries"
    fail=1
fi
if command -v cuobjdump >/dev/null 2>&1; then
    hmma=$(cuobjdump -sass "$tmp/flash_$last.cubin" | grep -c HMMA || true)
    echo "SASS (sm_$last): $hmma HMMA instructions"
    [ "$hmma" -gt 0 ] || { echo "FAIL: no HMMA in the SASS"; fail=1; }
else
    echo "SASS: cuobjdump not installed here, not checked"
fi
[ "$fail" -eq 0 ] && echo "test_flash_build: all checks passed"
exit "$fail"
