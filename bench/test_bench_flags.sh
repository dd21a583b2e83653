#!/bin/sh
# test_bench_flags.sh PROGRAM... — every bench program's command line against its own --help
# (bench/bench_util.h: the help and the parser come from one table; this checks that they do).
#
# For each program:
#   --help exits 0 and lists --dry-run and --help;
#   every flag it lists with a default ("  --name VALUE-KIND  help ... (default D)") is accepted as "--name D" and as
#     "--name=D", all of them in one `--dry-run` command line each way (exit 0, and the resolved flags echo every
#     "--name D"), and a value no kind takes is refused (exit 2), flag by flag;
#   --dry-run alone exits 0;
#   an unknown flag exits 2 with "unknown flag: --no-such-flag" and the usage on stderr.
# MPI programs run as singletons (no mpirun; meson's test env allows root); GPU programs parse their flags
# before looking for a GPU, so all of this runs on a machine without one. The programs are checked in
# parallel (an MPI singleton takes ~0.4 s to start). Exit 1 after any failure.
set -u
[ $# -gt 0 ] || { echo "usage: test_bench_flags.sh PROGRAM..." >&2; exit 2; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

# check_program PROGRAM TAG: prints "FAIL: ..." per failure and one "ok: ..." or "FAIL: ..." summary line
check_program() {
    prog=$1 out=$dir/$2.out err=$dir/$2.err name=$(basename "$1") failures=0
    fail() {
        echo "FAIL: $name $*"
        failures=$((failures + 1))
    }
    run() { # stdout in $out, stderr in $err, the exit code in $rc
        "$prog" "$@" >"$out" 2>"$err" </dev/null
        rc=$?
    }
    run --help
    [ "$rc" -eq 0 ] || fail "--help: exit $rc, want 0"
    grep -q '^  --dry-run ' "$out" || fail "--help does not list --dry-run"
    grep -q '^  --help, -h ' "$out" || fail "--help does not list --help"
    # "  --flag META  help text [range] (default VALUE)" -> "--flag VALUE"
    flags=$(sed -n 's/^  \(--[a-z0-9-]*\) [^ ]*  .*(default \([^ ()]*\))$/\1 \2/p' "$out")
    listed=$(grep -c '^  --[a-z0-9-]* [^ ]*  ' "$out")
    count=$(printf '%s' "$flags" | grep -c .)
    # every flag line but --dry-run's must carry a default the test can use
    [ "$count" -eq $((listed - 1)) ] || fail "--help: $listed flag lines, $count with a default (want $((listed - 1)))"
    # every flag at its default in one command line, as "--name D" and then as "--name=D" (a run starts an MPI
    # singleton in ~0.4 s of CPU: one run for all flags, not one per flag); each resolved flag echoed
    pairs=$(printf '%s\n' "$flags" | awk 'NF == 2 { printf " %s %s", $1, $2 }')
    joined=$(printf '%s\n' "$flags" | awk 'NF == 2 { printf " %s=%s", $1, $2 }')
    # shellcheck disable=SC2086 # split on purpose: flags and values hold no blanks
    run --dry-run $pairs
    [ "$rc" -eq 0 ] || fail "--dry-run with every flag at its default: exit $rc, want 0: $(head -n 1 "$err")"
    resolved=$(cat "$out")
    # shellcheck disable=SC2086
    run --dry-run $joined
    [ "$rc" -eq 0 ] || fail "--dry-run with every flag as --name=default: exit $rc, want 0: $(head -n 1 "$err")"
    checked=0
    while read -r flag value; do
        [ -n "$flag" ] || continue
        printf '%s\n' "$resolved" | grep -q -- " $flag $value\( \|$\)" ||
            fail "--dry-run $flag $value: the resolved flags do not show \"$flag $value\""
        run --dry-run "$flag" "not/a-value"
        [ "$rc" -eq 2 ] || fail "--dry-run $flag not/a-value: exit $rc, want 2 (a usage error)"
        checked=$((checked + 1))
    done <<FLAGS
$flags
FLAGS
    run --dry-run
    [ "$rc" -eq 0 ] || fail "--dry-run: exit $rc, want 0: $(head -n 1 "$err")"
    for bad in "--no-such-flag 1" "--no-such-flag=1"; do
        # shellcheck disable=SC2086 # split on purpose: the flag and its value
        run --dry-run $bad
        [ "$rc" -eq 2 ] || fail "$bad: exit $rc, want 2"
        grep -q "unknown flag: --no-such-flag\$" "$err" || fail "$bad: no \"unknown flag: --no-such-flag\" on stderr"
        grep -q '^usage: ' "$err" || fail "$bad: no usage on stderr"
    done
    if [ "$failures" -eq 0 ]; then
        echo "ok: $name: $checked listed flags accepted at their defaults (and refuse a bad value), unknown flag refused"
    else
        echo "FAIL: $name: $failures failure(s) above"
    fi
}

i=0
for prog in "$@"; do
    i=$((i + 1))
    check_program "$prog" "$i" >"$dir/$i.log" 2>&1 &
done
wait
i=0
for prog in "$@"; do
    i=$((i + 1))
    cat "$dir/$i.log"
done
failed=$(cat "$dir"/*.log | grep -c '^FAIL: [^ ]*: [0-9]* failure')
ok=$(cat "$dir"/*.log | grep -c '^ok: ')
if [ "$failed" -ne 0 ] || [ "$ok" -ne $# ]; then
    echo "$failed of $# programs failed ($ok ok)"
    exit 1
fi
echo "all $# programs agree with their --help"
