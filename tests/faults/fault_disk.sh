#!/bin/bash
# fault_disk.sh MPIRUN MOE_TRAIN TEXT_TO_TOKENS EXPECT_FAILURE — the checkpoint disk full or read-only, on real
# file systems (tmpfs mounts: needs root with mount rights; exits 77, a skip, without them):
#   full: room for one checkpoint and not two; with --keep-last 1 the second save (which needs both until the
#   new one is durable) fails with "No space left on device", the job ends, and the first checkpoint loads;
#   read-only: a run saving there is refused before training; a checkpoint there resumes and initialises a
#   run that saves elsewhere (loading never writes).
. "$(dirname "$0")/faults_common.sh"
mounts=()
unmount_all() {
    local m
    for m in "${mounts[@]}"; do umount "$m" 2>/dev/null; done
    rm -rf "$dir"
}
trap unmount_all EXIT
mount_tmpfs() { # DIR SIZE_KB
    mkdir -p "$1" && mount -t tmpfs -o "size=${2}k" tmpfs "$1" 2>/dev/null || return 1
    mounts+=("$1")
}
if ! mount_tmpfs "$dir/probe" 64; then
    echo "fault_disk: cannot mount a tmpfs here (not root, or no mount rights): skipped"
    exit 77
fi

# one checkpoint, to size the full disk by and to resume from
trains "a checkpoint to copy" "^step     1" --steps 1 --checkpoint-dir "$dir/one"
one_kb=$(du -sk "$dir/one/step-00000001" | cut -f1)

# full: a tmpfs of 1.5 checkpoints
mount_tmpfs "$dir/full" $((one_kb * 3 / 2 + 8)) || exit 1
refuses "checkpoint save failed \\(earlier checkpoints are intact\\): .*No space left on device" --steps 3 \
    --checkpoint-dir "$dir/full/ck" --checkpoint-interval 1 --keep-last 1
trains "the checkpoint before the full disk loads" "resumed from .*full/ck/step-00000001 after step 1" --steps 2 \
    --resume "$dir/full/ck/step-00000001" --checkpoint-dir "$dir/after-full"

# read-only: the checkpoint copied in, then the file system remounted read-only
mount_tmpfs "$dir/ro" $((one_kb * 4 + 64)) || exit 1
cp -r "$dir/one" "$dir/ro/ck"
mount -o remount,ro "$dir/ro" || exit 1
refuses "before training: --checkpoint-dir .*ro/ck is not writable: Read-only file system" --steps 2 \
    --checkpoint-dir "$dir/ro/ck" --resume
trains "a read-only checkpoint resumes" "resumed from .*ro/ck/step-00000001 after step 1" --steps 2 \
    --resume "$dir/ro/ck/step-00000001" --checkpoint-dir "$dir/after-ro"
trains "a read-only checkpoint initialises" "weights from .*ro/ck/step-00000001" --steps 1 \
    --init-from "$dir/ro/ck/step-00000001"

report "checkpoint disk full, read-only" 2 $((2 - (failures > 0))) 0 0 0
finish fault_disk
