#!/bin/bash
# expect_failure.sh PATTERN LIMIT_S CMD... — a test that passes when CMD fails the way it should:
# exits non-zero within LIMIT_S seconds (no hang), prints a line matching the extended regex PATTERN
# (the clear message), and leaves no process of CMD's program running. A "%r" in PATTERN must match
# with every rank 0 .. EXPECT_RANKS-1 (default 2) in its place: every rank said it.
pattern=$1 limit=$2
shift 2
# the programs to watch: every argument that is an executable file (mpirun and the program it starts)
programs=$(for a in "$@"; do [ -f "$a" ] && [ -x "$a" ] && basename "$a"; done)
running() { for p in $programs; do pgrep -x "$p"; done | sort; }
before=$(running)
start=$(date +%s)
output=$(timeout -k 5 "$limit" "$@" 2>&1)
rc=$?
elapsed=$(( $(date +%s) - start ))
printf '%s\n' "$output"
echo "expect_failure: exit status $rc after ${elapsed}s"
fail() { echo "expect_failure: FAIL: $*"; exit 1; }
[ "$rc" -ne 0 ] || fail "the command succeeded"
[ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || fail "the command hung past ${limit}s"
case $pattern in
*%r*) ranks=$(seq 0 $(( ${EXPECT_RANKS:-2} - 1 ))) ;;
*) ranks=0 ;;
esac
for r in $ranks; do
    p=$(printf '%s' "$pattern" | sed "s/%r/$r/g")
    printf '%s\n' "$output" | grep -Eq -e "$p" || fail "no line matches /$p/"
done
# processes that were not there before the command (others may run beside this test) must be gone
# within 10 s (ranks killed by mpirun take a moment to disappear)
for attempt in $(seq 20); do
    left=$(comm -13 <(printf '%s\n' "$before") <(running) | grep . || true)
    [ -z "$left" ] && break
    sleep 0.5
done
[ -z "$left" ] || fail "processes of $(echo $programs) still running: $(echo $left)"
echo "expect_failure: ok"
