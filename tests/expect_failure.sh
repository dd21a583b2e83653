#!/bin/sh
# expect_failure.sh PATTERN LIMIT_S CMD... — a test that passes when CMD fails the way it should:
# exits non-zero within LIMIT_S seconds (no hang), prints a line matching the extended regex PATTERN
# (the clear message), and leaves no process of CMD's program running. A "%r" in PATTERN must match
# with every rank 0 .. EXPECT_RANKS-1 (default 2) in its place: every rank said it.
pattern=$1 limit=$2
shift 2
program=$(basename "$(for a in "$@"; do case $a in */*) echo "$a"; break ;; esac; done)")
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
sleep 1
[ -n "$program" ] && pgrep -x "$program" >/dev/null && fail "processes of $program are still running"
echo "expect_failure: ok"
