# bounded.sh — sourced: moe_bounded SECONDS CMD...: CMD under coreutils timeout, and yet stopped by the caller's Ctrl-C
# or SIGTERM. timeout runs CMD in a process group of its own (so that it can end all of it), which the terminal's
# SIGINT never reaches, and bash runs a trap only once its foreground command has ended (a probe, 2026-12-07: Ctrl-C
# let a benchmark's run finish and the next one start; SIGTERM to the script left the job running). Here CMD runs in
# the background while the shell waits: INT or TERM is passed to timeout as TERM, which passes it on to CMD (mpirun
# ends its ranks), and the shell then exits 130 or 143. Returns CMD's status (124: out of time; 137: it outlived the
# TERM by 10 s and was killed).
moe_bounded() {
    local seconds=$1 rc=0
    shift
    timeout -k 10 "$seconds" "$@" &
    moe_bounded_pid=$!
    trap 'kill -TERM "$moe_bounded_pid" 2>/dev/null; wait "$moe_bounded_pid" || true; exit 130' INT
    trap 'kill -TERM "$moe_bounded_pid" 2>/dev/null; wait "$moe_bounded_pid" || true; exit 143' TERM
    wait "$moe_bounded_pid" || rc=$?
    trap - INT TERM
    return $rc
}
