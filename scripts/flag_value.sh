# flag_value.sh — sourced by scripts that read "--flag value" pairs under `set -u`, where a flag given last without
# its value ended in bash's "unbound variable" (a probe, 2026-12-07).
# moe_flag_value PROGRAM "$@" (in the loop, with $1 the flag): exit 2, saying so, unless a non-empty value follows it.
moe_flag_value() {
    [ $# -ge 3 ] && [ -n "$3" ] || { echo "$1: $2 needs a value" >&2; exit 2; }
}
