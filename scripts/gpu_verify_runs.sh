# gpu_verify_runs.sh — sourced: the --verify-steps runs of scripts/gpu_check.sh, as data, so that its rehearsal on
# the CPU (gpu_check.sh --rehearse, tests/test_gpu_check_bundle.sh) runs exactly the runs a GPU machine runs.
#
# Each run: 40 steps of the default model, every one checked against the CPU fp32 reference (docs/GPU.md), warmed
# up over all 40 to a peak learning rate of 1e-3. With the defaults (3e-3, a warm-up of min(100, steps / 10): 2
# steps of a 20-step run) the gradient norm spikes early (1.8 -> 5.9 at step 11), and at a spike bf16's gradient
# moves off fp32's by more than the 5% the norm may differ: a false alarm. Measured on the CPU, bf16 against
# fp32, 2 ranks, 2026-11-26, the largest gradient-norm difference over the verified steps (dropless / capacity),
# with oneDNN's GEMMs and with OpenBLAS's (which move the trajectory, and so the spikes):
#   --steps 20 (warm-up 2)                         5.3% at step 11: fails (oneDNN)
#   --steps 40 --warmup 10                         12% at step 11: fails (oneDNN)
#   --steps 20 --warmup 20                         3.5% / 1.8% (oneDNN), 8% (OpenBLAS): fails
#   --steps 40 --warmup 40                         0.6% / 1.3% (oneDNN), 12% at step 34 (OpenBLAS): fails
#   --steps 40 --warmup 40 --lr 1e-3 (these)       0.07% / 0.07% (oneDNN), 0.8% / 0.06% (OpenBLAS)
# (On the GPU only the experts' GEMMs are bf16, so its differences should be smaller still.)
gpu_verify_steps=40
gpu_verify_common=(--lr 1e-3 --eval-interval 0 --sample-tokens 0)
gpu_verify_names=(dropless capacity)
declare -A gpu_verify_flags=(
    [dropless]=""
    [capacity]="--capacity-factor 1.25 --micro-batches 2"
)
declare -A gpu_verify_titles=(
    [dropless]="dropless"
    [capacity]="capacity 1.25, 2 micro-batches"
)

# gpu_verify_command NAME DATA_DIR [STEPS] -> the moe-train flags of run NAME (into the array gpu_verify_args), with
# the token files named by absolute path (the run may start in any folder). STEPS (default gpu_verify_steps, the GPU
# machine's 40) for a rehearsal on the CPU, which shows the path (the bundle's libraries, mpirun, the comparison) and
# runs fewer: the CPU bf16 run's agreement over many steps is test_verify_cli's (suite mpi), not the rehearsal's, and
# its two 40-step runs were the longest phase of scripts/test.sh's longest lane (issue 48).
gpu_verify_command() {
    local name=$1 data steps=${3:-$gpu_verify_steps}
    data=$(cd "$2" && pwd) || return 1
    # shellcheck disable=SC2206 # the flags are words
    gpu_verify_args=(--steps "$steps" --warmup "$steps" --verify-steps "$steps" "${gpu_verify_common[@]}"
        ${gpu_verify_flags[$name]} --train-data "$data/kjv_train.bin" --val-data "$data/kjv_val.bin")
}
