# dir_guard.sh — sourced: moe_replaceable DIR MARKER...: 0 when DIR may be deleted and made anew by the script that
# owns it: DIR does not exist, is empty, or holds one of the MARKER paths that script writes (so it made DIR before);
# else a message on stderr naming DIR and 1. A probe (2026-12-07): hf_env.sh, gpu_bundle.sh, gpu_check.sh --out and
# moe_bundle_activate each deleted a user's folder given to them, files and all.
moe_replaceable() {
    local dir=$1 marker
    shift
    [ -e "$dir" ] || return 0
    [ -d "$dir" ] || { echo "$dir exists and is not a folder: not replaced" >&2; return 1; }
    [ -z "$(ls -A "$dir" 2>/dev/null)" ] && return 0
    for marker in "$@"; do [ -e "$dir/$marker" ] && return 0; done
    echo "$dir holds files this script did not make (none of: $*): it is deleted and made anew, so give a new or" \
        "empty folder" >&2
    return 1
}
