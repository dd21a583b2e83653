#!/bin/bash
# expect_failure.sh PATTERN LIMIT_S CMD... — a test that passes when CMD fails the way it should:
# exits non-zero within LIMIT_S seconds (no hang), prints a line matching the extended regex PATTERN
# (the clear message), and leaves no process of CMD's program running. A "%r" in PATTERN must match
# with every rank 0 .. EXPECT_RANKS-1 (default 2) in its place: every rank said it. A sanitizer report in the
# output (scripts/sanitize.sh) fails the test: the command is meant to fail by its own message, not by one.
pattern=$1 limit=$2
shift 2
# The command runs in a session of its own, so that what it leaves behind can be found by session id
# (other jobs on the machine do not count).
log=$(mktemp)
trap 'rm -f "$log"' EXIT
start=$(date +%s)
# Open MPI's mpirun, once a rank has exited non-zero, sends the others SIGCONT, SIGTERM and SIGKILL
# odls_base_sigkill_timeout seconds apart (1 by default), sleeping out both gaps whenever a rank's exit is not yet
# reaped, as when every rank refuses at once: 1-2 s per refusal of the hundreds in the suites. What is checked here is
# moe-train's own exit, so mpirun escalates at once (moe-train's stdout is line-buffered: nothing printed is lost).
export OMPI_MCA_odls_base_sigkill_timeout="${OMPI_MCA_odls_base_sigkill_timeout:-0}"
setsid timeout -k 5 "$limit" "$@" > "$log" 2>&1 &
session=$!
wait $session
rc=$?
output=$(cat "$log")
elapsed=$(( $(date +%s) - start ))
printf '%s\n' "$output"
echo "expect_failure: exit status $rc after ${elapsed}s"
fail() { echo "expect_failure: FAIL: $*"; exit 1; }
[ "$rc" -ne 0 ] || fail "the command succeeded"
[ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || fail "the command hung past ${limit}s"
report='(ERROR|SUMMARY): (Address|Leak|UndefinedBehavior)Sanitizer|: runtime error: '
! printf '%s\n' "$output" | grep -Eq -e "$report" || fail "a sanitizer report (above): not the failure it should be"
case $pattern in
*%r*) ranks=$(seq 0 $(( ${EXPECT_RANKS:-2} - 1 ))) ;;
*) ranks=0 ;;
esac
for r in $ranks; do
    p=$(printf '%s' "$pattern" | sed "s/%r/$r/g")
    printf '%s\n' "$output" | grep -Eq -e "$p" || fail "no line matches /$p/"
done
# nothing of the command's session may survive it (ranks killed by mpirun take a moment to disappear); a zombie has
# ended (its parent gone, it waits for init to reap it, which takes this machine's init up to 2 s) and does not count
for attempt in $(seq 20); do
    left=$(ps -o pid=,stat= -s "$session" | awk '$2 !~ /^Z/ { print $1 }')
    [ -z "$left" ] && break
    sleep 0.5
done
[ -z "$left" ] || fail "processes of the command are still running: $(ps -o pid=,comm= -s "$session" | tr '\n' ' ')"
echo "expect_failure: ok"
