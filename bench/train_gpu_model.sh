# train_gpu_model.sh — sourced: the model of the GPU training benchmarks (bench_train_gpu.sh, whose header gives its
# size and FLOPs; profile_train_gpu.sh), as moe-train flags.
# train_gpu_model_flags LAYERS DATA_DIR [moe-train flags...] -> the array flags: the model with LAYERS layers and the
# token files DATA_DIR/kjv_{train,val}.bin, each of its flags dropped where the caller's flags give it (moe-train
# refuses a flag given twice), then the caller's flags.
train_gpu_model_flags() {
    local layers=$1 data=$2 i a
    shift 2
    local model=(--layers "$layers" --d-model 1024 --heads 16 --kv-heads 8 --d-ff 2816 --experts 8 --top-k 2
                 --vocab 32000 --seq-len 1024 --batch 8 --micro-batches 2 --train-data "$data/kjv_train.bin"
                 --val-data "$data/kjv_val.bin")
    local -A given=()
    for a in "$@"; do [[ $a == --* ]] && given[$a]=1; done
    flags=()
    for ((i = 0; i < ${#model[@]}; i += 2)); do
        [ -n "${given[${model[i]}]:-}" ] || flags+=("${model[i]}" "${model[i + 1]}")
    done
    flags+=("$@")
}
