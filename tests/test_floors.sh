#!/bin/bash
# test_floors.sh SOURCE_ROOT — the folders form floors (docs/ARCHITECTURE.md) and a file includes only from
# its own folder and the folders it stands on:
#   core -> {kernels, alltoall} -> {experts (on kernels), router (on kernels and alltoall)} -> moe -> tp (tensor
#   parallelism's sums) -> models
#   core -> pipeline (the rank grid and the schedules, as data) -> {alltoall (splits its groups from the grid), models}
#   models -> checkpoint (checkpoints and their file formats) -> plan (moe-plan, the planner: it notes what moe-train
#   refuses in a config.json by checkpoint's list) -> train (the trainer, its options, moe-train; its memory estimate
#   is the planner's)
# Programs (tests/, bench/) may include anything. Every violation is printed as file:line.
root=${1:-.}
declare -A may=(
    [core]="core"
    [pipeline]="core pipeline"
    [kernels]="core kernels"
    [alltoall]="core pipeline alltoall"
    [experts]="core kernels experts"
    [router]="core kernels alltoall router"
    [moe]="core kernels alltoall experts router moe"
    [tp]="core kernels alltoall experts router moe tp"
    [models]="core kernels alltoall experts router moe tp pipeline models"
    [plan]="core kernels alltoall experts router moe tp pipeline models checkpoint plan"
    [checkpoint]="core kernels alltoall experts router moe tp pipeline models checkpoint"
    [train]="core kernels alltoall experts router moe tp pipeline models plan checkpoint train"
)
status=0
checked=0
for folder in "${!may[@]}"; do
    for file in "$root/$folder"/*; do
        case $file in *.c|*.h|*.cu|*.cuh) ;; *) continue ;; esac
        checked=$((checked + 1))
        while IFS=: read -r line target; do
            dir=${target%%/*}
            case " ${may[$folder]} " in
            *" $dir "*) ;;
            *) echo "FAIL: ${file#$root/}:$line includes \"$target\": $dir/ is not below $folder/"; status=1 ;;
            esac
        done < <(grep -n -o '^#include "[a-z_]*/[^"]*"' "$file" | sed 's/#include "//; s/"$//')
    done
done
[ $status -eq 0 ] && echo "ok: $checked files include only from their own floor and the floors below"
exit $status
