#!/usr/bin/env bash
# sanitize.sh — the unit and mpi test suites, and the faults tests that end jobs by their error paths, under
# AddressSanitizer + UndefinedBehaviorSanitizer (with LeakSanitizer), in their own build directory:
#   bash scripts/sanitize.sh [extra meson test arguments, e.g. a test's name]
#   bash scripts/sanitize.sh --build-only    configure and build, no test (scripts/test.sh builds while other lanes test)
# Configures build-sanitize/ once (again only when the options below change), rebuilds what changed, runs
# the tests. Needs the packages scripts/setup.sh installs (run it, or scripts/test.sh, first). CPU only: nvcc
# and the sanitizers do not mix, and the CUDA code cannot run without a GPU (no gpu suite). The ref suite is
# left out: its time goes to PyTorch and transformers, and its C code is the layer the unit suite runs.
# About 3.5 minutes on 2 cores alone (the first build more); docs/SANITIZERS.md has the options.
# Environment: MOE_SANITIZE_BUILD_DIR (default build-sanitize), MOE_TEST_PROCESSES (tests at a time, default 3).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${MOE_SANITIZE_BUILD_DIR:-$root/build-sanitize}"
build_only=0
[ "${1:-}" = "--build-only" ] && { build_only=1; shift; }

for tool in gcc meson ninja pkg-config mpirun; do
    command -v "$tool" >/dev/null || { echo "sanitize: $tool not found: run scripts/setup.sh first" >&2; exit 1; }
done

# -fno-sanitize-recover=all: every UBSan report ends its process, whatever UBSAN_OPTIONS reaches it.
# -fno-omit-frame-pointer: whole stacks in the reports. -g1 (after -Ddebug's -g): line tables and functions,
# all a report's stack needs (file:line per frame), without the types and variables only a debugger reads: the
# build from scratch, alone, 81 -> 70 CPU-s (2026-11-27, docs/SANITIZERS.md). -O1 (the optimization ASan's authors
# recommend), not debugoptimized's -O2: the build from scratch, alone, 129 -> 85 CPU-s, the tests the same (253 and
# 257 CPU-s; a 2-core Zen 3 VM, 2026-12-06).
setup_args=(-Doptimization=1 -Ddebug=true "-Db_sanitize=address,undefined" -Dcuda=disabled
            "-Dc_args=-fno-sanitize-recover=all -fno-omit-frame-pointer -g1")
stamp="$build/sanitize-setup-args.txt"
if [ ! -f "$build/build.ninja" ] || [ "$(cat "$stamp" 2>/dev/null)" != "${setup_args[*]}" ]; then
    wipe=()
    [ -d "$build/meson-private" ] && wipe=(--wipe) # configured before, with other options or interrupted
    CC=gcc meson setup "${wipe[@]}" "$build" "$root" "${setup_args[@]}"
    printf '%s' "${setup_args[*]}" > "$stamp"
fi
meson compile -C "$build"
# the shims preloaded below, compiled without the sanitizers: preloaded into every process of the run (bash,
# mpirun, nm, python), they must not bring the ASan runtime into those that have none
gcc -shared -fPIC -O2 -o "$build/keep_modules_loaded.so" "$root/tests/keep_modules_loaded.c"
gcc -shared -fPIC -O2 -fno-omit-frame-pointer -o "$build/asprintf_frames.so" "$root/tests/asprintf_frames.c"
[ $build_only -eq 1 ] && exit 0

# Every option and why (docs/SANITIZERS.md says the same at more length):
#   ASan  halt_on_error=1        stop at the first memory error (the default, stated).
#         detect_leaks=1         LeakSanitizer at every process exit (the x86-64 Linux default, stated).
#         print_summary=1        one SUMMARY line per report, which expect_failure.sh looks for.
#         verify_asan_link_order=0  LD_PRELOAD below puts two shims before the ASan runtime (no allocator in them).
#         (fast_unwind_on_malloc, the default 1: allocation stacks by frame pointers. The project's code keeps
#                                them (-fno-omit-frame-pointer); Debian's Open MPI, PMIx, hwloc and OpenBLAS do not, so
#                                a stack ends, or turns to noise, inside them — but the frame right above malloc is
#                                always right, and tests/lsan.supp names the libraries by it. Unwinding every stack
#                                with DWARF instead took 6x the CPU of the whole sanitized run.)
#         malloc_context_size=8  allocation stacks of 8 frames, not 30: the project's frames and the library frame
#                                above malloc that the suppressions name stay in them; the run's CPU fell 9% (501 s to
#                                458 s: `/usr/bin/time bash scripts/sanitize.sh` with its build done, 2026-11-27).
#   LD_PRELOAD tests/keep_modules_loaded.c: dlclose does nothing, so Open MPI's components (mca_*.so), unloaded in
#                                MPI_Finalize, keep their names in the leak reports at exit.
#              tests/asprintf_frames.c: asprintf and vasprintf with a frame pointer, so that the strings Open MPI
#                                keeps are named by its library, not by glibc's internal function (which only glibc's
#                                debug info names, and the run hides that: below).
#   UBSan halt_on_error=1, print_stacktrace=1: every report is fatal and shows its stack (the build also
#                                passes -fno-sanitize-recover=all, so this holds without the variable).
#   LSan  suppressions=tests/lsan.supp: Open MPI's (and its hwloc's and libevent's) own
#                                allocations kept until exit; never the project's.
# Not set: detect_odr_violation (nothing trips it: OpenBLAS is not instrumented), b_lundef=false (only clang
# needs it). Under mpirun every rank is a child of mpirun on this machine and inherits this environment (no
# -x needed). A rank that ends in MPI_Abort leaves by _exit: no leak check there, but an ASan or UBSan report
# before it still ends the rank and prints, and expect_failure.sh fails the test on it.
export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:print_summary=1:verify_asan_link_order=0:malloc_context_size=8"
export LD_PRELOAD="$build/keep_modules_loaded.so $build/asprintf_frames.so"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:print_summary=1"
export LSAN_OPTIONS="suppressions=$root/tests/lsan.supp:print_suppressions=0"
# OPENBLAS_CORETYPE as scripts/setup.sh sets it, so the sanitized run takes the same GEMM kernels
if [ -z "${OPENBLAS_CORETYPE:-}" ] && grep -qw avx512f /proc/cpuinfo 2>/dev/null; then
    export OPENBLAS_CORETYPE=SkylakeX
fi

# Without glibc's separate debug info: LSan checks every leak at a process's exit against tests/lsan.supp (Open MPI's,
# in every process), naming the allocator's frame first, and its symbolizer then loads the DWARF of every library
# it finds, glibc's from /usr/lib/debug where libc6-dbg is installed (valgrind pulls it in; this VM's image has it):
# 4 MB inflated by every sanitized process. With /usr/lib/debug hidden (an empty tmpfs over it in a mount namespace
# of this run only), test_checkpoint_cli and test_config_cli took 16.2 instead of 25.7 CPU-s (2026-11-28). Reports
# keep glibc's function names (its symbol table), not its line numbers. Only where this is root and may unshare.
no_debug_info=()
if [ "$(id -u)" -eq 0 ] && [ -d /usr/lib/debug ] && unshare -m true 2> /dev/null; then
    no_debug_info=(unshare -m bash -c 'mount -t tmpfs -o size=1m,mode=755 moe-no-debug-info /usr/lib/debug ||
        echo "sanitize: /usr/lib/debug stays visible (slower leak checks)" >&2; exec "$@"' no_debug_info)
fi

# Not the 8-rank runs (suite eight): they run the 4-rank runs' code, one level more of the same trees; what they add is
# the layout, which the main build checks bitwise. Sanitized, they were the lane's longest tests (the world-invariant
# run 232 s in-lane at 3 steps, the tree all-reduce 93 s, 2026-12-06) in its longest lane.
# Nor the CLI comparisons of layouts and configurations whose code the sanitized C tests run (tests/meson.build
# leaves them out of a sanitized build: test_world_invariant_cli, test_pipeline_cli, test_tp_cli, test_config_cli,
# test_gpu_layouts_cpu, test_data_scale).
suites=(--suite unit --suite mpi --no-suite eight)
for a in "$@"; do [[ $a == -* ]] || suites=(); done # a test named: that test alone (an option, -v, keeps the suites)
# Over Open MPI's TCP transport (the tcp setup, tests/meson.build), the one between nodes, not shared memory: the
# sanitizers check this project's code, which is the same over either, and the transport suite's bits over TCP are
# checked here once, not in a pass of their own (scripts/test.sh's tcp lane until 2026-12-07: ~50 CPU-s and ~35 s
# of the test command's critical path). A --setup given after it wins (meson takes the last).
setup=(--setup tcp)
cd "$build"
rm -f meson-logs/testlog*.txt # this run's logs only, whatever the setup names them (testlog-tcp.txt, ...)
status=0 faults=""
# the faults tests whose jobs end by their own error paths (a full disk, a failed save, a held lock, a stop by signal,
# a save past --checkpoint-timeout, which ends the job by MPI_Abort):
# the clean-up on the way out is checked for leaks too (not the kill -9 ones: a killed process checks nothing). Beside
# the suites, in logs of their own (testlog-faults.*): their jobs mostly wait (one after them took 15 s of the test
# command's critical path). Both --no-rebuild: built above, and two meson tests must not both run ninja here.
if [ $# -eq 0 ]; then
    "${no_debug_info[@]}" meson test --no-rebuild "${setup[@]}" --logbase testlog-faults --print-errorlogs \
        --num-processes 3 fault_disk fault_two_jobs fault_signals fault_slow_save > meson-logs/faults-summary.txt 2>&1 &
    faults=$!
fi
"${no_debug_info[@]}" meson test --no-rebuild "${setup[@]}" --print-errorlogs \
    --num-processes "${MOE_TEST_PROCESSES:-3}" "${suites[@]}" "$@" | tee meson-logs/test-summary.txt || status=$?
if [ -n "$faults" ]; then
    wait "$faults" || status=1
    tee -a meson-logs/test-summary.txt < meson-logs/faults-summary.txt
fi
# A test that tolerates a failing command (the expected failures) must not hide a sanitizer report in it:
# expect_failure.sh fails on one; this catches any other that reached a test's log.
report='(ERROR|SUMMARY): (Address|Leak|UndefinedBehavior)Sanitizer|: runtime error: '
if grep -n -E -e "$report" meson-logs/testlog*.txt; then
    echo "sanitize: sanitizer reports above (build-sanitize/meson-logs/testlog*.txt)" >&2
    status=1
fi
exit $status
