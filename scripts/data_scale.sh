#!/usr/bin/env bash
# data_scale.sh [--dir DIR] [--steps N] [--keep] [--check] — issue 52's scale check on one machine (docs/DATA.md, "Scale"):
# 64 sparse llm.c shards of 2^32 - 1 uint32 tokens each (valid headers, bodies that are holes: 1 TiB announced, no
# disk used; every token reads as 0) train for a few steps at 2 ranks with --shuffle 1, and so does the same model on
# a 10 MB corpus of random tokens. Prints the data set's opening time (moe-train's "data:" line, rank 0) and each run's
# peak resident memory (GNU time, the larger rank): a rank's memory for data is O(its batch), so the two agree.
# Needs the build (scripts/setup.sh) and GNU time (Debian package `time`). It works in a new folder inside DIR
# (default /tmp/moe-data-scale), removed at the end unless --keep. --check (the test test_data_scale): exit 1 unless the 1 TiB run's peak memory is within 10% + 8 MiB of the
# 10 MB run's (memory, not time: the opening time is printed, never asserted).
set -euo pipefail
export LC_ALL=C.UTF-8 # a decimal point in awk and printf whatever the user's locale (de_DE's comma broke them)
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${MOE_BUILD_DIR:-$root/build}"
source "$root/scripts/flag_value.sh"
dir=/tmp/moe-data-scale steps=6 keep=0 check=0
while [ $# -gt 0 ]; do
    case $1 in
    --dir) moe_flag_value data_scale "$@"; dir=$2; shift 2 ;;
    --steps) moe_flag_value data_scale "$@"; steps=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    --check) check=1; shift ;;
    *) echo "usage: scripts/data_scale.sh [--dir DIR] [--steps N] [--keep] [--check]" >&2; exit 2 ;;
    esac
done
[ -x /usr/bin/time ] || { echo "data_scale: needs GNU time (apt-get install time)" >&2; exit 1; }
source "$root/scripts/mpi_env.sh"
# a folder of its own inside DIR, the only thing removed (before, DIR itself went, with whatever it held: a probe)
mkdir -p "$dir"
dir=$(mktemp -d "$dir/data_scale.XXXXXX")
if [ $keep = 1 ]; then echo "data_scale: the shards and logs stay in $dir"; else trap 'rm -rf "$dir"' EXIT; fi

# 64 shards: the 1 KiB header (magic 20240801, version 7, the count 2^32 - 1 as llm.c's int32 field holds it,
# unsigned), then a hole to the size the count announces
/usr/bin/python3 - "$dir" << 'EOF'
import os, struct, sys
d = sys.argv[1]
count = 2**32 - 1
for i in range(64):
    path = os.path.join(d, f"sparse_train_{i:06d}.bin")
    with open(path, "wb") as f:
        f.write(struct.pack("<3I", 20240801, 7, count) + bytes(1024 - 12))
        f.truncate(1024 + 4 * count)
# the 10 MB corpus (2.5M random uint32 tokens below 256) and a small validation file, both real bytes
for name, n in (("small_train_000000.bin", 2_500_000), ("val.bin", 100_000)):
    body = bytes(b for t in os.urandom(n) for b in (t, 0, 0, 0))
    with open(os.path.join(d, name), "wb") as f:
        f.write(struct.pack("<3I", 20240801, 7, n) + bytes(1024 - 12) + body)
EOF
announced=$(du -b --apparent-size -c "$dir"/sparse_train_*.bin | tail -n 1 | cut -f1)
used=$(du -k -c "$dir"/sparse_train_*.bin | tail -n 1 | cut -f1)
echo "data_scale: 64 shards announcing $announced bytes ($(awk -v b="$announced" 'BEGIN { printf "%.3f TiB", b / 2^40 }')), $used KiB on disk"

peak_kib() { sort -n "$dir/$1.rss" | tail -n 1; } # NAME: the larger rank's peak RSS of that run, KiB
run() { # NAME TRAIN_SPEC: trains, then prints its data line and the larger rank's peak RSS
    local name=$1 spec=$2 rss="$dir/$1.rss"
    rm -f "$rss"
    mpirun -np 2 /usr/bin/time -a -o "$rss" -f %M "$build/moe-train" --train-data "$spec" --val-data "$dir/val.bin" \
        --shuffle 1 --steps "$steps" --eval-interval 0 --eval-batches 2 --sample-tokens 0 > "$dir/$name.log" 2>&1 ||
        { cat "$dir/$name.log"; echo "data_scale: the $name run failed" >&2; exit 1; }
    printf '%-7s %s\n' "$name" "$(grep '^data:' "$dir/$name.log")"
    printf '%-7s peak RSS %s MiB (the larger rank); %s\n' "$name" \
        "$(awk -v k="$(peak_kib "$name")" 'BEGIN { printf "%.1f", k / 1024 }')" \
        "$(grep "^step *$steps " "$dir/$name.log" | cut -d'|' -f1-2,6-7 | tr -s ' ')"
}
run sparse "$dir/sparse_train_*.bin"
run small "$dir/small_train_*.bin"
if [ $check = 1 ]; then
    awk -v big="$(peak_kib sparse)" -v small="$(peak_kib small)" 'BEGIN { exit !(big <= 1.1 * small + 8192) }' ||
        { echo "data_scale: FAIL: the 1 TiB run's peak memory is not the 10 MB run's" >&2; exit 1; }
    echo "data_scale: ok: the same peak memory for 1 TiB of shards as for 10 MB"
fi
