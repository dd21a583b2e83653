#!/bin/sh
# when_cpu_has.sh FLAG CMD... — runs CMD when /proc/cpuinfo lists FLAG, else skips (exit 77, meson's skip).
# The suite isa's avx2 variant (tests/meson.build) holds oneDNN to AVX2 so that a CPU with AVX-512 runs the
# determinism tests as an AVX2-only CPU does; on a CPU without avx512f that is what the unit and mpi suites have just
# run, natively, so the variant would repeat them (~45 CPU-s of a 2-core CI machine's test command, 2026-12-06).
flag=$1
shift
if ! grep -qw -- "$flag" /proc/cpuinfo 2> /dev/null; then
    echo "skipped: this CPU has no $flag, so the suites unit and mpi ran these tests as this variant would"
    exit 77
fi
exec "$@"
