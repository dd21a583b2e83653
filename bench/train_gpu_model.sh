# train_gpu_model.sh — sourced: the models of the GPU training benchmarks (bench_train_gpu.sh, whose header gives their
# sizes and FLOPs; profile_train_gpu.sh), as moe-train flags.
# train_gpu_model_flags MODEL LAYERS TRAIN VAL [moe-train flags...] -> the array flags: MODEL (1.2b or mixtral) with
# LAYERS layers and the token files TRAIN and VAL, each of its flags dropped where the caller's flags give it
# (moe-train refuses a flag given twice), then the caller's flags.
#   1.2b     d 1024, 16 heads / 8 kv, 8 experts of d_ff 2816, top-2, vocab 32000, S 1024, 16 sequences a step (2
#            micro-batches of 8), lr 3e-4 decaying to 3e-5 (moe-train's default 3e-3 is tuned for its 0.5M-parameter
#            default model)
#   mixtral  Mixtral 8x7B's layer shape: d 4096, 32 heads / 8 kv, 8 experts of d_ff 14336, top-2, vocab 32000, S 4096,
#            4 sequences a step (4 micro-batches of 1), --recompute full, lr 1e-4 decaying to 1e-5
train_gpu_model_flags() {
    local name=$1 layers=$2 train=$3 val=$4 i a
    shift 4
    local model
    case $name in
    1.2b) model=(--d-model 1024 --heads 16 --kv-heads 8 --d-ff 2816 --seq-len 1024 --batch 8 --micro-batches 2
                 --lr 3e-4 --min-lr 3e-5) ;;
    mixtral) model=(--d-model 4096 --heads 32 --kv-heads 8 --d-ff 14336 --seq-len 4096 --batch 4 --micro-batches 4
                    --recompute full --lr 1e-4 --min-lr 1e-5) ;;
    *) echo "train_gpu_model_flags: no model '$name' (1.2b or mixtral)" >&2; return 2 ;;
    esac
    model+=(--layers "$layers" --experts 8 --top-k 2 --vocab 32000 --train-data "$train" --val-data "$val")
    local -A given=()
    for a in "$@"; do [[ $a == --* ]] && given[$a]=1; done
    flags=()
    for ((i = 0; i < ${#model[@]}; i += 2)); do
        [ -n "${given[${model[i]}]:-}" ] || flags+=("${model[i]}" "${model[i + 1]}")
    done
    flags+=("$@")
}

# train_gpu_flag NAME: the value of moe-train flag NAME in the array flags (empty when absent)
train_gpu_flag() {
    local i
    for ((i = 0; i < ${#flags[@]} - 1; i++)); do [ "${flags[i]}" = "$1" ] && { echo "${flags[i + 1]}"; return; }; done
}
