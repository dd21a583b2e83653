#!/usr/bin/env bash
# gpu_check.sh — the one command for a GPU machine (docs/GPU.md): builds for the GPU it finds, runs the gpu test
# suite, two --verify-steps training runs checked step by step against the CPU fp32 reference, and the GPU
# benchmarks, and writes one report.
#   scripts/gpu_check.sh [--out DIR] [--bundle DIR] [--more] [--only PHASES] [--budget SECONDS]
#                        [--rehearse | --rehearse-cpu]
# --out DIR      where the report goes (default: BUILD/gpu_check): report.md (markdown for docs/BENCHMARKS.md and
#                docs/GPU.md), phases.tsv (each phase: seconds, status), logs/PHASE.log, logs.tar.gz (all logs)
# --bundle DIR   take Open MPI, jansson, OpenBLAS, pkg-config and the token files from DIR (scripts/gpu_bundle.sh,
#                made where apt works and carried here), unpacked into BUILD/bundle-prefix. Without the flag:
#                the machine's own libraries when pkg-config finds them (a cluster's modules, or apt's packages),
#                else .gpu-bundle/ when it exists, else apt-get installs them (scripts/setup_lib.sh)
# --more         the second run: what does not fit the first run's budget (the larger benchmark shapes, the
#                longer training benchmark, the pinned cuBLASLt GEMM against cuBLAS); builds too (quick when BUILD is
#                there), skips the suite and the verify runs
# --only PHASES  a comma-separated list of the mode's phases to run after the build (e.g. suite,train: a rerun of
#                what failed); the others are reported as skipped
# --budget S     the whole run's seconds (default 480 for the first run, 540 for --more): each phase has its own
#                limit, cut to what is left; a phase that would start with under 15 s left is not run
# --rehearse     no GPU needed: every phase that does not need one, as on a GPU machine (bundle, configure,
#                build for sm_90 — only the programs the phases run: moe-train, the benchmarks, the gpu suite's
#                programs, which is where the bundle's libraries are linked —, report), the gpu suite (which skips),
#                the verify runs on the CPU in bf16 against the same fp32 reference (2 ranks, 3 steps each: the
#                path, not the GPU's 40; scripts/gpu_verify_runs.sh says why), the benchmarks' flag
#                checks (--dry-run); for the tests. Each phase gets 4x its limit (a rehearsal shares its CPU with the
#                rest of scripts/test.sh), still cut to the budget. Run it (~5 minutes on 2 cores) before a GPU
#                machine's first call whenever the build or the bundle changed since the last GPU run
# --rehearse-cpu --rehearse without the CUDA compile: configures as a GPU machine would (nvcc, cuBLAS and NCCL found
#                beside the bundle), builds moe-train and moe-text-to-tokens against the bundle, runs one verify run;
#                the phases of the CUDA programs (the gpu suite, the benchmarks' flag checks) are skipped. What the
#                test command rehearses (tests/test_gpu_check_bundle.sh): the main build compiles and links the same
#                CUDA sources against the same Debian packages' headers and libraries every run, and the rehearsal's
#                second CUDA compile took ~130 of its ~210 CPU-s (docs/BENCHMARKS.md, "Lanes in turns")
# BUILD is MOE_BUILD_DIR (default build-gpu, beside build/ so that neither disturbs the other). MOE_COMMIT names the
# commit in the report (for a copy of the tree; else git's HEAD).
# NCCL: the toolkit's, else the system's, else the nvidia-nccl-cu13 pip package beside python3 (scripts/bundle_env.sh),
# else none (the report says so; the tests then expect the MPI-staged transport).
# Exit: 0 every phase passed; 1 a phase failed, ran out of time or was not run (the report says which);
# 2 usage; 77 no GPU (nvidia-smi lists none) and no --rehearse.
set -uo pipefail
export LC_ALL=C.UTF-8 # a decimal point in awk and printf whatever the user's locale (de_DE's comma broke them)
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

out="" bundle="" mode=first budget="" rehearse=0 rehearse_cuda=1 only="" listing=0
while [ $# -gt 0 ]; do
    case $1 in
    --out | --bundle | --budget | --only) # a value each (usage: exit 2, as the header says)
        [ $# -ge 2 ] && [ -n "$2" ] || { echo "gpu_check: $1 needs a value (see --help)" >&2; exit 2; }
        case $1 in --out) out=$2 ;; --bundle) bundle=$2 ;; --budget) budget=$2 ;; --only) only=$2 ;; esac
        shift 2 ;;
    --more) mode=more; shift ;;
    --rehearse) rehearse=1; shift ;;
    --rehearse-cpu) rehearse=1 rehearse_cuda=0; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "gpu_check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
[ -n "$budget" ] || budget=$([ $mode = more ] && echo 540 || echo 480)
[[ $budget =~ ^[0-9]+$ ]] || { echo "gpu_check: --budget takes whole seconds, not '$budget'" >&2; exit 2; }
build="${MOE_BUILD_DIR:-$root/build-gpu}"
mkdir -p "$build" && build=$(cd "$build" && pwd)
export MOE_BUILD_DIR="$build" # the benchmark scripts' build
out="${out:-$build/gpu_check}"
source "$root/scripts/dir_guard.sh"
source "$root/scripts/bounded.sh"
moe_replaceable "$out" phases.tsv report.md || exit 2 # its logs/ is made anew: a report of before, or nothing
rm -rf "$out/logs" && mkdir -p "$out/logs" && out=$(cd "$out" && pwd) || exit 2
logs="$out/logs"
start=$(date +%s)
deadline=$((start + budget))
printf 'phase\tseconds\tstatus\n' > "$out/phases.tsv"

# ---- the GPU ----
source "$root/scripts/setup_lib.sh"
moe_build_env
if [ $rehearse = 1 ]; then
    gpus="none: a rehearsal on the CPU (--rehearse)" ngpu=0 arch=90
else
    gpus=$(nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader 2>/dev/null)
    if [ -z "$gpus" ]; then
        echo "gpu_check: no GPU here (nvidia-smi lists none); nothing to check (--rehearse runs the rest)"
        exit 77
    fi
    ngpu=$(printf '%s\n' "$gpus" | wc -l)
    # SASS for the GPUs found (compute capability 9.0 -> 90), nothing else: a third of the compile time
    arch=$(printf '%s\n' "$gpus" | awk -F', *' '{ gsub(/\./, "", $4); print $4 }' | sort -u | paste -sd, -)
fi
# after the GPU's check: a machine without a GPU exits 77 (nothing to check), toolkit or not
if ! command -v nvcc > /dev/null; then
    echo "gpu_check: nvcc is not on PATH (nor in /usr/local/cuda/bin): put the CUDA toolkit's bin/ on PATH" >&2
    exit 2
fi

# ---- phases ----
# phase NAME LIMIT CMD...: runs CMD with its output in logs/NAME.log, at most LIMIT seconds (and never past the
# budget); one line in phases.tsv. Returns CMD's status (124: out of time; 3: not run, the budget was spent).
failed=0
now_ms() { echo $(($(date +%s%N) / 1000000)); }
since() { # T0_MS -> seconds since, to a tenth
    local d=$(($(now_ms) - $1))
    printf '%d.%d' $((d / 1000)) $((d % 1000 / 100))
}
record() { # NAME SECONDS STATUS
    [ $listing = 1 ] && { echo "$1"; return 0; }
    printf '%s\t%s\t%s\n' "$1" "$2" "$3" >> "$out/phases.tsv"
    printf 'gpu_check: %-18s %6ss  %s\n' "$1" "$2" "$3"
    case $3 in ok | "skipped (rehearsal)" | "skipped (no GPU)" | "skipped (--only)") ;; *) failed=1 ;; esac
}
phase() {
    [ $listing = 1 ] && { echo "$1"; return 0; }
    local name=$1 limit=$2
    shift 2
    [ $rehearse = 1 ] && limit=$((limit * 4)) # a rehearsal's CPU is shared with whatever else runs (--rehearse)
    case $name in configure | build | data) ;; *)
        if [ -n "$only" ] && [[ ",$only," != *",$name,"* ]]; then
            record "$name" 0 "skipped (--only)"
            return 0
        fi ;;
    esac
    local left=$((deadline - $(date +%s) - 5))
    if [ $left -lt 15 ]; then
        record "$name" 0 "not run: the ${budget}-second budget was spent"
        return 3
    fi
    [ "$limit" -le $left ] || limit=$left
    local t0 rc status
    t0=$(now_ms)
    moe_bounded "$limit" "$@" > "$logs/$name.log" 2>&1 # Ctrl-C stops the phase and the run (scripts/bounded.sh)
    rc=$?
    case $rc in
    0) status=ok ;;
    124 | 137) status="out of time (${limit} s)" ;;
    77) status=$([ $rehearse = 1 ] && echo "skipped (rehearsal)" || echo "skipped (no GPU)") ;;
    *) status="FAILED (exit $rc)" ;;
    esac
    record "$name" "$(since "$t0")" "$status"
    return $rc
}
# timed NAME FUNCTION...: a step that changes this shell's environment (no time limit of its own)
timed() {
    local name=$1 t0 rc
    shift
    t0=$(now_ms)
    "$@" > "$logs/$name.log" 2>&1
    rc=$?
    record "$name" "$(since "$t0")" "$([ $rc = 0 ] && echo ok || echo "FAILED (exit $rc)")"
    return $rc
}
finish() { # writes the report, packs the logs, exits
    python3 "$root/scripts/gpu_report.py" "$out" > "$out/report.md" 2> "$logs/report.log" ||
        { echo "gpu_check: the report could not be written ($logs/report.log)" >&2; failed=1; }
    tar -czf "$out/logs.tar.gz" -C "$out" logs
    cat "$out/report.md"
    echo "gpu_check: report $out/report.md, logs $logs (and logs.tar.gz)"
    exit $failed
}

gpu_only() { # NAME LIMIT CMD...: a benchmark that needs torch or a whole training run: not in a rehearsal
    if [ $rehearse = 1 ]; then record "$1" 0 "skipped (rehearsal)"; else phase "$@"; fi
}
cuda_built() { # NAME LIMIT CMD...: a CUDA program of the build (rehearsed with --rehearse, not --rehearse-cpu)
    if [ $rehearse_cuda = 0 ]; then record "$1" 0 "skipped (rehearsal)"; else phase "$@"; fi
}
# the mode's phases after the build, in order (listing=1: only their names, one a line, for --only's check)
mode_phases() {
    if [ $mode = first ]; then
        # 1. each CUDA op against its CPU twin, the transports, the layer, two steps of moe-train
        cuda_built suite 240 meson test -C "$build" --suite gpu --print-errorlogs --num-processes 4 "${suite_flags[@]}"
        # 2. training checked step by step against the CPU fp32 reference, one rank per GPU
        source "$root/scripts/gpu_verify_runs.sh"
        # a rehearsal shows the path (3 steps: the comparison of every step runs at least twice; test_verify_cli holds
        # the CPU bf16 agreement over more)
        verify_steps=$([ $rehearse = 1 ] && echo 3 || echo "$gpu_verify_steps")
        for name in "${gpu_verify_names[@]}"; do
            # --rehearse-cpu (the test command's rehearsal) shows the bundle's path with one run: the capacity run,
            # which has micro-batches too (the dropless run takes the same path)
            if [ $rehearse_cuda = 0 ] && [ "$name" != capacity ]; then
                record "verify_$name" 0 "skipped (rehearsal)"
                continue
            fi
            gpu_verify_command "$name" "$data" "$verify_steps"
            phase "verify_$name" 120 mpirun -np $ranks "$build/moe-train" "${device[@]}" --ep $ranks \
                "${gpu_verify_args[@]}"
        done
        # 3. benchmarks, the goals' first (docs/GPU.md): the fused attention (the tensor-core flash kernels under bf16)
        #    beside SDPA's flash and cuDNN backends at issue 50's two shapes, training MFU, grouped GEMM vs dense,
        #    permute vs copy, the layer vs PyTorch
        cuda_built attention 30 "$build/bench/bench_attention_gpu" "${dry[@]}"
        gpu_only attention_sdpa 90 python3 "$root/bench/bench_attention_torch_gpu.py" \
            --ours "$build/bench/bench_attention_gpu"
        gpu_only train 200 bash "$root/bench/bench_train_gpu.sh" --torch --steps 30 --data "$data"
        # the same model with every product one pinned cuBLASLt call (dense, router, experts: issue 50, item 2)
        gpu_only train_lt 150 env MOE_LINEAR_GEMM=lt bash "$root/bench/bench_train_gpu.sh" --steps 20 --data "$data"
        gpu_only train_mixtral 200 bash "$root/bench/bench_train_gpu.sh" --model mixtral --torch --steps 20 \
            --data "$data"
        # training bitwise across layouts on the GPU (a rehearsal's CPU runs it as test_gpu_layouts_cpu)
        gpu_only layouts 150 bash "$root/scripts/gpu_layouts.sh"
        # where a step's GPU time goes, kernel by kernel (Nsight Compute; skipped where the machine has no ncu)
        gpu_only profile 150 bash "$root/bench/profile_train_gpu.sh" --steps 3 --data "$data" --out "$logs/profile"
        cuda_built grouped_gemm 60 "$build/bench/bench_grouped_gemm" "${dry[@]}"
        cuda_built permute 45 "$build/bench/bench_permute" "${dry[@]}"
        cuda_built layer 60 "$build/bench/bench_moe_layer_gpu" --layout-invariant 0 "${dry[@]}"
        gpu_only layer_torch 90 python3 "$root/bench/bench_moe_layer_torch_gpu.py"
        cuda_built layer_invariant 60 "$build/bench/bench_moe_layer_gpu" --layout-invariant 1 "${dry[@]}"
        cuda_built layer_invariant_lt 60 env MOE_LINEAR_GEMM=lt "$build/bench/bench_moe_layer_gpu" \
            --layout-invariant 1 "${dry[@]}"
    else
        # the second run: other shapes (Qwen3-30B-A3B's experts: 128 of d_ff 768 at d 2048, top-8), longer training
        qwen=(--experts 128 --top-k 8 --d-model 2048 --d-ff 768)
        # first the short ones (seconds each), so that the budget cannot cut them:
        # the dense linears' pinned batch-invariant cuBLASLt GEMM against unconstrained cuBLAS at the 1.2B model's
        # and Mixtral 8x7B's training shapes (issue 50, item 2: >= 90%); a few seconds of GPU time
        cuda_built gemm_lt 60 "$build/bench/bench_gemm_lt" "${dry[@]}"
        # the flash dK/dV kernel with one shared-memory stage instead of two (two blocks per SM at head_dim 128
        # instead of one: kernels/attention_flash.cu), against the first run's attention phase
        cuda_built attention_dkv1 30 env MOE_FLASH_DKV_STAGES=1 "$build/bench/bench_attention_gpu" "${dry[@]}"
        gpu_only train_long 240 bash "$root/bench/bench_train_gpu.sh" --steps 100 --data "$data"
        # the first run's train_lt with its weights cast to bf16 at every call instead of kept from step to step
        # (kernels/linear.h, "Kept weights"): what keeping them saves
        gpu_only train_lt_cast 150 env MOE_LINEAR_GEMM=lt MOE_LINEAR_KEEP_WEIGHTS=0 \
            bash "$root/bench/bench_train_gpu.sh" --steps 20 --data "$data"
        cuda_built grouped_gemm_small 45 "$build/bench/bench_grouped_gemm" --experts 8 --rows 4096 "${dry[@]}"
        cuda_built grouped_gemm_large 60 "$build/bench/bench_grouped_gemm" --experts 8 --rows 65536 "${dry[@]}"
        cuda_built grouped_gemm_qwen 60 "$build/bench/bench_grouped_gemm" --experts 128 --d-model 2048 --d-ff 768 \
            --rows 131072 "${dry[@]}"
        cuda_built permute_qwen 45 "$build/bench/bench_permute" --experts 128 --top-k 8 --d-model 2048 "${dry[@]}"
        cuda_built layer_qwen 60 "$build/bench/bench_moe_layer_gpu" --layout-invariant 0 "${qwen[@]}" "${dry[@]}"
        gpu_only layer_torch_qwen 90 python3 "$root/bench/bench_moe_layer_torch_gpu.py" "${qwen[@]}"
    fi
}
# --only's names against the mode's phases before anything is built (a misspelt one ran nothing, exit 0, and then,
# checked at the end, still cost the configure and build phases: minutes of a GPU machine's time)
if [ -n "$only" ]; then
    known=$(set +u; listing=1; mode_phases)
    for name in ${only//,/ }; do
        grep -qx -- "$name" <<< "$known" ||
            { echo "gpu_check: --only names '$name', not a phase of this mode (see --help)" >&2; exit 2; }
    done
fi

# ---- what the build needs: the machine's own, the bundle's, or apt's ----
system_has_deps() {
    command -v mpirun && command -v pkg-config && pkg-config --exists jansson openblas &&
        { pkg-config --exists ompi-c || pkg-config --exists mpi || command -v mpicc; }
}
if [ -z "$bundle" ] && ! system_has_deps > /dev/null 2>&1 && [ -f "$root/.gpu-bundle/debian-packages.tar.gz" ]; then
    bundle="$root/.gpu-bundle"
fi
source "$root/scripts/bundle_env.sh"
if [ -n "$bundle" ]; then
    bundle=$(cd "$bundle" 2>/dev/null && pwd) || { echo "gpu_check: no bundle folder $bundle" >&2; exit 2; }
    deps="the bundle $bundle"
    data="$bundle/data"
    timed bundle moe_bundle_activate "$bundle" "$build/bundle-prefix" || finish
    nccl_prefix="$build/bundle-prefix"
else
    if system_has_deps > /dev/null 2>&1; then
        deps="the machine's own (pkg-config)"
    else
        deps="apt-get"
        timed packages moe_install_packages "${moe_build_packages[@]}" bible-kjv || finish
    fi
    data="$root/data"
    nccl_prefix="$build/nccl-prefix"
fi
nccl_dir=$(moe_nccl_dir "$nccl_prefix")
if [ -n "$nccl_dir" ]; then nccl="$nccl_dir"
elif [ -f "$(dirname "$(dirname "$(command -v nvcc)")")/include/nccl.h" ]; then nccl="the CUDA toolkit's"
else nccl="none found: the MPI-staged transport only"
fi
{
    echo "mode: $mode$([ $rehearse = 1 ] && echo ", rehearsal")$([ $rehearse_cuda = 0 ] && echo " without CUDA")"
    echo "gpus: $gpus"
    echo "gpu_arch: $arch"
    echo "dependencies: $deps"
    echo "nccl: $nccl"
    echo "data: $data"
    echo "cores: $(getconf _NPROCESSORS_ONLN)"
    if [ -n "${MOE_COMMIT:-}" ]; then # named by the sender (a copy of the tree, whose .git may be older)
        echo "commit: $MOE_COMMIT"
    elif git -C "$root" rev-parse --short HEAD > /dev/null 2>&1; then
        echo "commit: $(git -C "$root" rev-parse --short HEAD)$(git -C "$root" diff --quiet HEAD || echo " (with uncommitted changes)")"
    else
        echo "commit: unknown"
    fi
    echo "nvcc: $(nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
    echo "python: $(python3 -c 'import sys; print(sys.version.split()[0])' 2>/dev/null)"
    echo "torch: $(python3 -c 'import torch; print(torch.__version__)' 2>/dev/null || echo none)"
    echo "budget_s: $budget"
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
} > "$out/env.txt"

# ---- configure and build ----
meson_args=(--buildtype=release -Dcuda=enabled "-Dgpu_arch=$arch")
[ -n "$nccl_dir" ] && meson_args+=("-Dnccl_dir=$nccl_dir")
if [ -f "$build/build.ninja" ]; then
    configure_how=(--reconfigure)
else # nvcc's dependency files: a rerun after a fix to a header rebuilds what includes it
    mapfile -t configure_how < <(moe_cuda_native_file "$build")
fi
phase configure 120 meson setup "${configure_how[@]}" "$build" "$root" "${meson_args[@]}" || finish
# a rehearsal builds what its phases run (on 2 shared cores the whole project's second build was its longest phase);
# then the suite must not rebuild the rest
build_targets=() suite_flags=()
if [ $rehearse = 1 ]; then
    read -ra build_targets <<< "$(meson introspect --targets "$build" | python3 -c '
import json, sys
cpu = {"moe-train", "moe-text-to-tokens"}
# what the phases of the CUDA programs run (with_gpu: the launcher of the gpu suite, itself C)
cuda_phases = {"moe_train_cuda", "bench_grouped_gemm", "bench_permute", "bench_moe_layer_gpu", "bench_attention_gpu",
               "bench_gemm_lt", "with_gpu"}
with_cuda = sys.argv[1] == "1"
def wanted(name):
    return name in cpu or (with_cuda and (name in cuda_phases or name.startswith("test_gpu_")))
print(" ".join(sorted(t["name"] for t in json.load(sys.stdin) if wanted(t["name"]))))' $rehearse_cuda)"
    # an empty list would build everything, slowly and silently (a quote in the program above once did that)
    [ ${#build_targets[@]} -gt 0 ] || { record build 0 "FAILED (no targets selected for the rehearsal)"; finish; }
    suite_flags=(--no-rebuild)
fi
phase build 300 meson compile -C "$build" "${build_targets[@]}" || finish
libraries=("$build/moe-train")
[ $rehearse_cuda = 1 ] && libraries+=("$build/libmoe_train_cuda.so")
ldd "${libraries[@]}" > "$logs/libraries.log" 2>&1
# the token files: the bundle's, or prepared here (bible-kjv from apt, and this build's moe-text-to-tokens)
[ -f "$data/kjv_train.bin" ] || phase data 120 env MOE_BUILD_DIR="$build" bash "$root/scripts/prepare_data.sh" ||
    finish
data=$(cd "$data" && pwd)

source "$root/scripts/mpi_env.sh"
if [ $rehearse = 1 ]; then
    ranks=2 device=(--device cpu --precision bf16 --threads 1) dry=(--dry-run)
    # a rehearsal's 2 ranks share the 2 cores with the rest of scripts/test.sh, the case for sleeping, not yielding,
    # while a rank waits (alltoall/wait_policy.h): in-lane 259 -> ~185 s for the two (docs/BENCHMARKS.md)
    export MOE_WAIT_POLICY=passive
else
    ranks=1 # one rank per GPU: the largest power of two <= the GPUs, at most 8 (it divides the batch and experts)
    while [ $((ranks * 2)) -le "$ngpu" ] && [ $ranks -lt 8 ]; do ranks=$((ranks * 2)); done
    device=(--device cuda) dry=()
fi

mode_phases
finish
