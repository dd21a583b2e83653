#!/bin/bash
# test_data_scale.sh SCRIPT DIR — scripts/data_scale.sh --check (issue 52's scale: memory, never time, asserted) run
# into DIR holding a file of its own, which must outlive the run: the script works in a folder it makes inside DIR
# and removes only that (before 2026-12-07 it removed DIR with whatever it held: a probe).
set -u
script=$1 dir=$2
mkdir -p "$dir"
echo "not the script's" > "$dir/keep.txt"
bash "$script" --check --dir "$dir"
rc=$?
if [ "$(cat "$dir/keep.txt" 2> /dev/null)" != "not the script's" ]; then
    echo "FAIL: data_scale.sh removed $dir/keep.txt, a file it did not make"
    rc=1
elif [ -n "$(ls "$dir" | grep -v '^keep.txt$')" ]; then
    echo "FAIL: data_scale.sh left in $dir: $(ls "$dir" | grep -v '^keep.txt$')"
    rc=1
fi
rm -rf "$dir"
exit $rc
