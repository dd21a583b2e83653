#!/bin/bash
# test_config_cli.sh MPIRUN MOE_TRAIN TEXT_TO_TOKENS EXPECT_FAILURE — moe-train's configuration as a user meets it,
# on 2 ranks (issue 16):
#  1. --init-from, --eval-only and --resume take the architecture from the checkpoint's config.json: no shape flag
#     is needed, and one that disagrees is refused naming both values; --init-from may train with another routing
#     policy (capacity factor, drop priority: issue 29), said in a note and recorded in what it saves; a checkpoint's
#     manifest records the machine, and a resume on other GEMM kernels says so (issue 48);
#  2. a model transformers' Mixtral cannot compute (here top-1 without renormalisation) is saved as
#     MoeTrainMixtralVariantForCausalLM with a note, and said so at start; top-1 renormalised is a Mixtral;
#  3. the metrics log opens with the run record (options, layout, versions, commit); steps carry the clock and
#     evaluations their duration;
#  4. --print-config writes JSON that --config reads back into the same run (bitwise the same losses); a bad key
#     is refused naming it; flags override the file;
#  5. (issue 25, R6) values derived from others stay "auto" in that file, and --print-config says which they are:
#     flags given beside --config re-derive them as on a fresh command line (--top-k 1 turns renormalisation off,
#     --heads 8 takes 8 kv heads, --steps 400 a warm-up of 40, --device cuda bf16), where main @ 203d493 kept the
#     values of the run that wrote the file;
#  6. (issue 29) threads against the CPUs a rank may run on: a note when a binding holds a lone rank to one core (with
#     `mpirun --bind-to none` as the fix), none without it, a warning when --threads exceed the CPUs.
#  7. (issue 48) an MOE_CPU_GEMM it does not know is refused, naming it.
#  8. (issue 49) layout flags are not inherited by --resume.
#  9. (issue 51) a Qwen3-MoE and a DeepSeek-V3 save under their own labels and names and resume at another layout
#     bitwise (the Qwen3-MoE at tp 2); the Qwen3-MoE is refused as another family (an OLMoE at --tp 2:
#     tests/test_tp_cli.sh).
# 10. (a probe of the command line, 2026-12-07) a shared expert in a model with no MoE layer is refused by name (its
#     config.json described a shared expert the weights did not hold); a model with no MoE layer trains with a note,
#     and so do options the others leave without effect (a note each, not a refusal: a sweep holds them fixed while
#     another option varies).
. "$(dirname "$0")/train_cli_common.sh"

# a model unlike the defaults in every architecture field
arch=(--layers 2 --d-model 32 --heads 4 --kv-heads 2 --d-ff 24 --vocab 256 --experts 4 --top-k 1 --renormalize 0
      --rope-theta 1e6 --norm-eps 1e-6 --moe-every 1 --tie-embeddings 1)
ck="$dir/ck" step2="$dir/ck/step-00000002"
trains "a top-1 model without renormalisation trains, with a note" \
    "^note: not a Mixtral \(top-1 gates not renormalised" "${arch[@]}" --checkpoint-dir "$ck" --log-file "$dir/m.jsonl"
grep -q '"architectures": \[\s*$' "$step2/config.json" && grep -q '"MoeTrainMixtralVariantForCausalLM"' "$step2/config.json" &&
    grep -q '"model_type": "moe_train_mixtral_variant"' "$step2/config.json" &&
    grep -q '"moe_train_note": "Not a Mixtral: top-1 gates not renormalised' "$step2/config.json" &&
    grep -q '"rms_norm_eps": 1e-6,' "$step2/config.json" && echo "ok: labelled as our variant, floats written short" ||
    fail_with_output "config.json of the top-1 model: $(cat "$step2/config.json")"

# 1. no shape flags: the same validation loss as the run's last evaluation
evaluates_as_trained() { # WHAT METRICS CHECKPOINT
    local want got
    want=$(grep -o '"val_loss":[0-9.e+-]*' "$2" | tail -n 1 | cut -d: -f2)
    if timeout 120 "$mpirun" -np 2 "$train" --seq-len 16 --batch 2 --eval-batches 1 --train-data "$dir/train.bin" \
            --val-data "$dir/val.bin" --init-from "$3" --eval-only 1 > "$dir/out.txt" 2>&1 &&
        got=$(sed -nE 's/^eval: val_loss ([0-9.]+) over.*/\1/p' "$dir/out.txt") && [ -n "$got" ] &&
        awk -v a="$got" -v b="$want" 'BEGIN { d = a - b; exit !(d < 5e-9 && d > -5e-9) }'; then
        echo "ok: $1: --eval-only --init-from with no shape flags: val_loss $got (the run's last: $want)"
    else
        fail_with_output "$1: --eval-only --init-from without shape flags (want val_loss $want)"
    fi
}
evaluates_as_trained "top-1" "$dir/m.jsonl" "$step2"
# sigmoid routing selects by score + bias: --init-from loads the biases too (6 steps at rate 0.05 move them)
trains "a sigmoid model trains" "^step     6" --score sigmoid --bias-update-rate 0.05 --steps 6 \
    --checkpoint-dir "$dir/cks" --log-file "$dir/s.jsonl"
evaluates_as_trained "sigmoid" "$dir/s.jsonl" "$dir/cks/step-00000006"
# the bias moves by the step's counts, all its micro-batches' (a probe, 2026-12-07: by the last one's alone), so 2
# micro-batches of 2 sequences train as 1 of 4 (without the aux and z losses, whose terms are per micro-batch)
balanced=(--score sigmoid --bias-update-rate 0.05 --steps 5 --aux-loss-coef 0 --z-loss-coef 0 --layers 2 --d-model 32
          --d-ff 48)
# inference routes without a capacity limit: the logits of one sequence (every data-parallel rank forwards a copy of
# it) are 1 rank's at 2 ranks (a probe, 2026-12-07: a capacity over all the copies made them, and the samples, depend
# on the world size)
trains "a capacity-limited run" "step-00000004 saved" --capacity-factor 0.5 --steps 4 --checkpoint-dir "$dir/ckcap"
for np in 1 2; do
    timeout 120 "$mpirun" -np $np "$train" --init-from "$dir/ckcap/step-00000004" --eval-only 1 --val-data \
        "$dir/val.bin" --eval-batches 1 --batch 2 --seq-len 16 --dump-logits "$dir/cap$np.logits" > "$dir/out.txt" 2>&1 ||
        fail_with_output "--dump-logits at $np rank(s)"
done
cmp -s "$dir/cap1.logits" "$dir/cap2.logits" && echo "ok: --dump-logits of a capacity-limited model: 2 ranks' are 1's" ||
    fail_with_output "--dump-logits of a capacity-limited model differ between 1 and 2 ranks"
step5_loss() { sed -n 's/^{"step":5,"loss":\([^,]*\),.*/\1/p' "$1"; }
trains "sigmoid, batch 4" "^step     5" "${balanced[@]}" --batch 4 --log-file "$dir/b4.jsonl"
trains "sigmoid, 2 micro-batches of 2" "^step     5" "${balanced[@]}" --batch 2 --micro-batches 2 \
    --log-file "$dir/b22.jsonl"
one=$(step5_loss "$dir/b4.jsonl") two=$(step5_loss "$dir/b22.jsonl")
[ -n "$one" ] && [ "$one" = "$two" ] && echo "ok: the bias moved by the step's counts: step 5's loss the same ($one)" ||
    fail_with_output "sigmoid: 2 micro-batches of 2 ($two) did not train as 1 of 4 ($one)"
# (the small run's flags disagree in d_model first; shapes agree with the checkpoint up to its RoPE base)
shapes=(--layers 2 --d-model 32 --heads 4 --d-ff 24)
refuses "--d-model 16 disagrees with .*config.json, whose hidden_size is 32" --init-from "$step2" --eval-only 1
refuses "--top-k 2 disagrees with .*config.json, whose num_experts_per_tok is 1" --init-from "$step2" "${shapes[@]}"
refuses "--rope-theta 10000 disagrees with .*step-00000002/config.json, whose rope_theta is 1000000" \
    --init-from "$step2" "${shapes[@]}" --top-k 1 --rope-theta 10000
refuses "--norm-eps 1e-05 disagrees with .*config.json, whose rms_norm_eps is 1e-0?6" --resume "$step2" --steps 3 \
    "${shapes[@]}" --top-k 1 --norm-eps 1e-5
# the routing policy under --resume: the saved run's, said as such (a probe, 2026-12-07: "defines the architecture")
refuses "--capacity-factor 1 disagrees with .*config.json, .*: a resume continues that run's routing policy" \
    --resume "$step2" --steps 3 "${shapes[@]}" --top-k 1 --capacity-factor 1
# --resume: the architecture from config.json, the rest from the saved run (its batch, seed, sequence length)
if timeout 120 "$mpirun" -np 2 "$train" --resume "$step2" --steps 3 --sample-tokens 0 --exchange-timeout 20 \
        > "$dir/out.txt" 2>&1 && grep -q "^resume: --steps 3 (the saved run had 2)" "$dir/out.txt" &&
    grep -q "^step     3" "$dir/out.txt"; then
    echo "ok: --resume with no other flags continues the run: $(grep '^resume: --steps' "$dir/out.txt")"
else
    fail_with_output "--resume without the run's flags"
fi
# the machine record (issue 48, train/machine.h): in the manifest; a resume on the same machine and build says
# nothing of it, one that runs other kernels (here OpenBLAS's Nehalem ones, which any x86-64 CPU runs, and the other
# bf16 GEMM mode) names what differs, and goes on
if grep -q '"machine"' "$step2/manifest.json" && grep -q '"gemm"' "$step2/manifest.json" &&
    ! grep -q "another machine or build" "$dir/out.txt"; then
    echo "ok: the manifest records the machine; a resume on the same one says nothing of it"
else
    fail_with_output "the manifest's machine record, or a note on a resume on the same machine: $(cat "$step2/manifest.json")"
fi
if OPENBLAS_CORETYPE=Nehalem MOE_BF16_GEMM=fp32 timeout 120 "$mpirun" -np 2 "$train" --resume "$step2" --steps 3 \
        --sample-tokens 0 --exchange-timeout 20 --checkpoint-dir "$dir/elsewhere" > "$dir/out.txt" 2>&1 &&
    grep -q "^note: --resume .*: this process computes with another machine or build" "$dir/out.txt" &&
    grep -q "^note:   openblas: saved .*, now .*core Nehalem" "$dir/out.txt" && grep -q "^step     3" "$dir/out.txt"
then
    echo "ok: a resume on other kernels says so and continues: $(grep '^note:   ' "$dir/out.txt" | tr '\n' ' ')"
else
    fail_with_output "a resume on other kernels: no note naming them, or it did not continue"
fi

# 2. top-1 renormalised (gate 1) is what Mixtral computes
trains "top-1 renormalised trains" "^step     2" --top-k 1 --renormalize 1 --checkpoint-dir "$dir/ck1"
grep -q '"MixtralForCausalLM"' "$dir/ck1/step-00000002/config.json" && ! grep -q moe_train_note "$dir/ck1/step-00000002/config.json" &&
    ! grep -q "^note: not a Mixtral" "$dir/out.txt" && echo "ok: top-1 renormalised is labelled MixtralForCausalLM" ||
    fail_with_output "top-1 renormalised is not labelled MixtralForCausalLM"
# --init-from with another routing policy for training (issue 29, part 4): fine-tuning a Mixtral with a capacity
# factor and drops by score is said in a note, trained with, and recorded (so the checkpoint is labelled our variant)
trains "--init-from a Mixtral, trained with a capacity factor" \
    "^note: --init-from .*: training with --capacity-factor 1.25 \(its config.json's moe_train.capacity_factor is 0\)" \
    --top-k 1 --renormalize 1 --init-from "$dir/ck1/step-00000002" --capacity-factor 1.25 --drop-priority score \
    --checkpoint-dir "$dir/ck_cf"
cf_config="$dir/ck_cf/step-00000002/config.json"
grep -q '^note: --init-from .*: training with --drop-priority "score"' "$dir/out.txt" &&
    grep -q '"capacity_factor": 1.25' "$cf_config" && grep -q '"drop_priority": "score"' "$cf_config" &&
    grep -q '"moe_train_note": "Not a Mixtral' "$cf_config" &&
    echo "ok: its checkpoint records the policy it trained with, labelled our variant" ||
    fail_with_output "--init-from with a capacity factor: the note or the saved policy is missing: $(cat "$cf_config")"

# 3. the metrics log
first=$(head -n 1 "$dir/m.jsonl")
for pattern in '^\{"record":"run","config":\{"layers":2,"d_model":32,' '"layout":\{"world_size":2,"ep":1,' \
               '"versions":\{"moe":"[^"]+","compiler":"[^"]+","cpu":"[^"]+ family [0-9]+ model [0-9]+[^"]*","cpu_target":"[^"]+","gemm":"([^"]+, isa [a-z0-9_]+ [^"]+|[^"]+, core [A-Za-z0-9]+ [^"]+)","openblas":"[^"]+, core [A-Za-z0-9]+","mpi":"[^"]+"' \
               '"git_commit":"([0-9a-f]{40}(-dirty)?|unknown|[^"]+-g[0-9a-f]{40}(-dirty)?)"' '"started":"20[0-9-]+T'; do
    [[ $first =~ $pattern ]] || fail_with_output "the run record lacks /$pattern/: $first"
done
steps=$(grep -c '^{"step":[0-9]*,.*"elapsed_s":[0-9.]*,"time":"20[0-9-]*T[0-9:.]*Z"' "$dir/m.jsonl")
[ "$steps" -eq 2 ] && grep -q '"val_loss":[0-9.e+-]*,"eval_ms":[0-9.]*' "$dir/m.jsonl" &&
    echo "ok: the metrics log: a run record, 2 clocked steps, a timed evaluation" ||
    fail_with_output "metrics: $(cat "$dir/m.jsonl")"

# 4. --print-config and --config
merge "${arch[@]}" --seed 7 --print-config
if "$mpirun" -np 1 "$train" "${merged[@]}" > "$dir/run.json" 2> "$dir/out.txt" && grep -q '^  "seed": 7,$' "$dir/run.json" &&
    ! grep -q '"print_config"' "$dir/run.json"; then
    echo "ok: --print-config wrote $(wc -l < "$dir/run.json") lines of JSON"
else
    fail_with_output "--print-config"
fi
# into a full disk: exit 2, said (a probe, 2026-12-07: exit 0 and an empty file)
"$train" "${merged[@]}" > /dev/full 2> "$dir/out.txt" && fail_with_output "--print-config > /dev/full: exit 0"
grep -q "print-config: the standard output cannot be written" "$dir/out.txt" ||
    fail_with_output "--print-config > /dev/full: not said"
timeout 120 "$mpirun" -np 2 "$train" --config "$dir/run.json" --log-file "$dir/a.jsonl" > "$dir/out.txt" 2>&1
merge "${arch[@]}" --seed 7 --log-file "$dir/b.jsonl"
timeout 120 "$mpirun" -np 2 "$train" "${merged[@]}" > "$dir/out.txt" 2>&1
losses() { grep -o '"step":[0-9]*,"loss":[0-9.e+-]*' "$1"; }
[ -n "$(losses "$dir/a.jsonl")" ] && [ "$(losses "$dir/a.jsonl")" = "$(losses "$dir/b.jsonl")" ] &&
    echo "ok: --config run.json reproduces the run: $(losses "$dir/a.jsonl" | tr '\n' ' ')" ||
    fail_with_output "--config run.json did not reproduce the run ($(losses "$dir/a.jsonl"), $(losses "$dir/b.jsonl"))"
trains "a flag overrides the config file" "^step     3" --config "$dir/run.json" --steps 3
sed 's/"seed": 7/"seeed": 7/' "$dir/run.json" > "$dir/typo.json"
refuses "typo.json: unknown key 'seeed'" --config "$dir/typo.json"
sed 's/"seed": 7/"seed": "seven"/' "$dir/run.json" > "$dir/type.json"
refuses "type.json: 'seed' must be an integer, not \"seven\"" --config "$dir/type.json"
sed 's/"beta2": 0.95/"beta2": 2/' "$dir/run.json" > "$dir/range.json"
refuses "range.json: 'beta2' expects a number in \[0, 0.999999\], got '2'" --config "$dir/range.json"
refuses "--config: .*missing.json: cannot open" --config "$dir/missing.json"
sed 's/"ep": 1,/"ep": 4,/' "$dir/run.json" > "$dir/ep4.json" # a combination the file makes (ep 4 on 2 ranks): named
refuses "--ep 4 must divide the number of ranks" --config "$dir/ep4.json"
refuses "the options include those of --config .*ep4.json" --config "$dir/ep4.json"

# 5. derived values
data=(--train-data "$dir/train.bin" --val-data "$dir/val.bin")
derived() { # FILE FLAGS...: --print-config into FILE.json, its note into FILE.txt
    local f=$1
    shift
    "$mpirun" -np 1 "$train" "${data[@]}" "$@" --print-config > "$f.json" 2> "$f.txt"
}
derived "$dir/auto" --steps 20 --heads 4 --d-model 32
for key in kv_heads renormalize precision min_lr warmup; do
    grep -q "^  \"$key\": \"auto\",\$" "$dir/auto.json" || fail_with_output "--print-config wrote $key as a value, not \"auto\""
done
grep -q 'derived, written "auto": kv_heads 4, renormalize 1, precision fp32, min_lr 0.0003, warmup 2' "$dir/auto.txt" &&
    echo "ok: --print-config says what it derived: $(cat "$dir/auto.txt")" ||
    fail_with_output "--print-config's note: $(cat "$dir/auto.txt")"
derived "$dir/again" --config "$dir/auto.json" --steps 400 --top-k 1 --heads 8 --lr 1e-4
grep -q 'kv_heads 8, renormalize 0, precision fp32, min_lr 1e-05, warmup 40' "$dir/again.txt" &&
    echo "ok: flags beside --config re-derive: $(cat "$dir/again.txt")" ||
    fail_with_output "flags beside --config did not re-derive: $(cat "$dir/again.txt")"
derived "$dir/cuda" --config "$dir/auto.json" --device cuda && grep -q 'precision bf16' "$dir/cuda.txt" &&
    echo "ok: --device cuda beside --config derives bf16" || fail_with_output "--device cuda beside --config: $(cat "$dir/cuda.txt")"

# 6. (issue 29, part 2) threads and CPUs: a lone rank bound to one core (Open MPI's default) runs 1 thread and says how
#    to lift the binding; --bind-to none takes every CPU; --threads beyond the CPUs a rank may run on is warned about
threads_run() { # NAME MPIRUN_FLAGS... -- MOE_TRAIN_FLAGS...: one step on 1 rank, its output in $dir/NAME.txt
    local name=$1 launch=()
    shift
    while [ "$1" != -- ]; do launch+=("$1"); shift; done
    shift
    merge --steps 1 --eval-batches 1 "$@"
    "$mpirun" -np 1 "${launch[@]}" "$train" "${merged[@]}" > "$dir/$name.txt" 2>&1 ||
        { cp "$dir/$name.txt" "$dir/out.txt"; fail_with_output "$name: moe-train failed"; }
}
cpus=$(getconf _NPROCESSORS_ONLN) # what moe-train counts (online CPUs)
threads_run oversubscribed --bind-to none -- --threads $((cpus + 1))
grep -q "^warning: --threads $((cpus + 1)) on each of 1 rank(s) of a node of $cpus CPUs: .* give --threads $cpus" \
    "$dir/oversubscribed.txt" && echo "ok: $(grep '^warning: --threads' "$dir/oversubscribed.txt")" ||
    fail_with_output "--threads $((cpus + 1)) on $cpus CPUs: no warning"
threads_run unbound --bind-to none --
grep -q "^world 1 ranks x $cpus threads" "$dir/unbound.txt" &&
    ! grep -q "^note: this rank may run on" "$dir/unbound.txt" &&
    echo "ok: --bind-to none: $(grep -o '^world 1 ranks x [0-9]* threads' "$dir/unbound.txt"), no note" ||
    fail_with_output "--bind-to none: not $cpus threads, or a binding note"
if [ "$cpus" -gt 1 ]; then
    threads_run bound --bind-to core --
    grep -q "^note: this rank may run on 1 of the node's $cpus CPUs .*--bind-to none" "$dir/bound.txt" &&
        grep -q "^world 1 ranks x 1 threads" "$dir/bound.txt" &&
        echo "ok: bound to a core: $(grep '^note: this rank' "$dir/bound.txt" | cut -c 1-100)..." ||
        fail_with_output "a rank bound to one core: no note naming --bind-to none"
    threads_run bound_asked --bind-to core -- --threads 2
    grep -q "^warning: --threads 2, but this rank may run on 1 of the node's $cpus CPUs.*--bind-to none" \
        "$dir/bound_asked.txt" && echo "ok: --threads 2 on one bound core: warned" ||
        fail_with_output "--threads 2 on one bound core: no warning"
fi

# 7. (issue 48) the GEMM library by MOE_CPU_GEMM: a name it does not know refused before training, naming it
MOE_CPU_GEMM=mkl refuses "MOE_CPU_GEMM=mkl is neither onednn nor openblas" --steps 1
# a bad MOE_WAIT_POLICY on one rank alone: every rank stops, the rank named, within seconds (a probe, 2026-12-07: the
# others waited in another collective until the start-up alarm, the reason unsaid)
merge --steps 1
"$expect_failure" "rank 1: the wait policy: MOE_WAIT_POLICY='xyz'" 30 "$mpirun" -np 1 "$train" "${merged[@]}" : \
    -np 1 -x MOE_WAIT_POLICY=xyz "$train" "${merged[@]}" > "$dir/out.txt" 2>&1 &&
    echo "ok: one rank's MOE_WAIT_POLICY=xyz stopped the job, named" || fail_with_output "one rank's MOE_WAIT_POLICY"

# 8. (issue 49, 4) layout flags (--pp, --virtual-stages, --tp, --ep, --zero, --threads) are not inherited by
# --resume: a pp 2 x V 2 checkpoint resumed with no layout flag trains at pp 1 (it said "--virtual-stages 2 needs --pp 2")
# and continues the uninterrupted run's bits, saying what changed; a --tp 2 one resumes at --pp 2 (it said "--tp 2
# must divide the ranks of a stage (1)"); --tp-shards stays (the same bits), and a --tp it does not divide is
# refused naming the saved run as its source and the flag that changes it
losses() { sed -n 's/^{"step":\([0-9]*\),"loss":\([^,]*\),.*/\1 \2/p' "$1"; }
trains "a run at --pp 2 --virtual-stages 2" "^step     4" --layers 4 --micro-batches 2 --pp 2 --virtual-stages 2 \
    --steps 4 --checkpoint-dir "$dir/lay" --checkpoint-interval 2 --log-file "$dir/lay.jsonl"
trains "its step 2 resumed with no layout flag, at pp 1" \
    "^resume: --virtual-stages 1 \(the saved run had 2; layout flags are not inherited: this is the default\)" \
    --resume "$dir/lay/step-00000002" --steps 4 --layers 4 --log-file "$dir/lay_resumed.jsonl" \
    --checkpoint-dir "$dir/lay_resumed"
grep -q "^resume: --pp 1 (the saved run had 2; layout flags are not inherited" "$dir/out.txt" &&
    [ "$(losses "$dir/lay_resumed.jsonl")" = "$(losses "$dir/lay.jsonl" | sed -n '3,$p')" ] &&
    echo "ok: steps 3 and 4 at pp 1 bitwise the pp 2 x V 2 run's: $(losses "$dir/lay_resumed.jsonl" | tr '\n' ' ')" ||
    fail_with_output "the resume at pp 1: no note of --pp, or losses $(losses "$dir/lay_resumed.jsonl" | tr '\n' ' ') \
against $(losses "$dir/lay.jsonl" | tr '\n' ' ')"
trains "a run at --tp 2" "^step     2" --tp 2 --layers 2 --checkpoint-dir "$dir/tp2"
trains "a --tp 2 checkpoint resumed at --pp 2 (tp not inherited)" "^resume: --tp 1 \(the saved run had 2" \
    --resume "$dir/tp2/step-00000002" --steps 3 --pp 2 --layers 2
trains "a run at --tp-shards 1" "^step     2" --tp-shards 1 --checkpoint-dir "$dir/shards1"
refuses "--tp 2 does not divide --tp-shards 1, the fixed pieces .* that the saved run trained with .*give --tp-shards 2" \
    --resume "$dir/shards1/step-00000002" --steps 3 --tp 2
grep -q "^moe-train: (from the saved run, as --resume keeps what is not given: .*--tp-shards 1" "$dir/out.txt" ||
    fail_with_output "the refusal does not list the options the saved run gave"

# 9. (issue 51) a Qwen3-MoE (q/k norms per head, a head_dim of its own) trains at --pp 2 and saves under its own label
# and names; its step 2 resumed at pp 1 and tp 2 continues the run's bits; --init-from it as another family is refused
# by name; a DeepSeek-V3 the same from pp 1 to ep 2
# family_saves_and_resumes NAME LABEL PP LAYOUT GREP... -- FLAGS...: FLAGS at --pp PP train 4 steps saving at 2,
# whose config.json says LABEL and whose model.safetensors holds every GREP name; step 2 resumed with FLAGS at pp 1 and
# LAYOUT (a flag and its value: "--ep 2") gives steps 3 and 4's losses bitwise (the run: $dir/NAME.jsonl, its step 2:
# $dir/NAME/step-00000002)
family_saves_and_resumes() {
    local name=$1 label=$2 pp=$3 layout names=() step
    read -ra layout <<< "$4"
    shift 4
    while [ "$1" != "--" ]; do names+=("$1"); shift; done
    shift
    trains "a $label at --pp $pp" "^step     4" "$@" --pp "$pp" --steps 4 --checkpoint-dir "$dir/$name" --checkpoint-interval 2 \
        --log-file "$dir/$name.jsonl"
    step="$dir/$name/step-00000002"
    grep -q "\"$label\"" "$step/config.json" || fail_with_output "$name: not labelled $label: $(cat "$step/config.json")"
    for n in "${names[@]}"; do
        grep -aq "$n" "$step/model.safetensors" || fail_with_output "$name: no tensor $n in its model.safetensors"
    done
    echo "ok: labelled $label, its tensors named as transformers names them"
    trains "its step 2 resumed at pp 1, ${layout[*]}" "^step     4" --resume "$step" --steps 4 "$@" "${layout[@]}" \
        --log-file "$dir/${name}_resumed.jsonl" --checkpoint-dir "$dir/${name}_resumed"
    [ "$(losses "$dir/${name}_resumed.jsonl")" = "$(losses "$dir/$name.jsonl" | sed -n '3,$p')" ] &&
        echo "ok: $name's steps 3 and 4 at ${layout[*]} bitwise the run's: $(losses "$dir/${name}_resumed.jsonl" | tr '\n' ' ')" ||
        fail_with_output "the $name resume: losses $(losses "$dir/${name}_resumed.jsonl" | tr '\n' ' ') against \
$(losses "$dir/$name.jsonl" | tr '\n' ' ')"
}
qwen=(--family qwen3_moe --head-dim 12 --layers 2 --top-k 4 --renormalize 1 --tp-shards 2)
family_saves_and_resumes qwen Qwen3MoeForCausalLM 2 "--tp 2" model.layers.1.self_attn.q_norm.weight \
    model.layers.0.mlp.experts.3.down_proj.weight -- "${qwen[@]}"
grep -q '"head_dim": 12' "$dir/qwen/step-00000002/config.json" &&
    grep -q '"norm_topk_prob": true' "$dir/qwen/step-00000002/config.json" ||
    fail_with_output "the Qwen3-MoE's head_dim or norm_topk_prob: $(cat "$dir/qwen/step-00000002/config.json")"
refuses "--family olmoe disagrees with .*config.json, whose moe_train.family is \"qwen3_moe\"" \
    --init-from "$dir/qwen/step-00000002" --family olmoe --eval-only 1
# a DeepSeek-V3 (MLA, sigmoid scores with their bias, groups, shared experts, a dense first layer), its selection
# biases among the weights (what transformers reads)
family_saves_and_resumes deepseek DeepseekV3ForCausalLM 1 "--ep 2" model.layers.1.mlp.gate.e_score_correction_bias \
    model.layers.1.mlp.shared_experts.down_proj.weight -- --family deepseek_v3 --layers 2 --heads 4 --kv-heads 4 \
    --head-dim 24 --kv-lora-rank 16 --qk-rope-dim 8 --v-head-dim 12 --score sigmoid --bias-update-rate 0.01 \
    --experts 8 --top-k 4 --expert-groups 4 --topk-groups 2 --routed-scaling 2.5 --first-dense-layers 1 \
    --shared-d-ff 32 --norm-eps 1e-6
grep -q '"n_shared_experts": 2' "$dir/deepseek/step-00000002/config.json" ||
    fail_with_output "the DeepSeek-V3's n_shared_experts: $(cat "$dir/deepseek/step-00000002/config.json")"
# --family alone says the model (a probe, 2026-12-07: V2 renormalised its gates and V3 scored by softmax unless told,
# both saved as our variant, which transformers cannot load)
for v in 2 3; do
    trains "--family deepseek_v$v's defaults" "^step +1 " --family deepseek_v$v --heads 2 --head-dim 12 \
        --qk-rope-dim 4 --v-head-dim 6 --kv-lora-rank 16 --shared-d-ff 16 --steps 1 --checkpoint-dir "$dir/defaults-v$v"
    grep -q "not a DeepseekV" "$dir/out.txt" && fail_with_output "--family deepseek_v$v: not its transformers class"
    grep -q "\"DeepseekV${v}ForCausalLM\"" "$dir/defaults-v$v/step-00000001/config.json" ||
        fail_with_output "--family deepseek_v$v: saved as another class"
done

# 10. options without effect
refuses "a shared expert \(--shared-d-ff\) runs beside the routed experts of the MoE layers" --experts 1 --top-k 1 \
    --shared-d-ff 16
trains "a model with no MoE layer trains, with a note" "^note: no layer is an MoE layer \(4 experts, --moe-every 3" \
    --layers 2 --moe-every 3
trains "options the others leave without effect, a note each" "^note: --drop-priority has no effect" \
    --dense-d-ff 24 --drop-priority score --max-skipped-steps 3 --shards 2 --world-invariant 0 --adam-eps 1e-30 \
    --checkpoint-interval 1
for note in "--dense-d-ff 24 has no effect" "--max-skipped-steps has no effect without --skip-nonfinite 1" \
    "--shards 2 has no effect with --world-invariant 0" "--adam-eps 1e-30: where a weight's gradients are below" \
    "no --checkpoint-dir: nothing is saved, and --checkpoint-interval"; do
    grep -q -- "^note: $note" "$dir/out.txt" && echo "ok: note: $note" || fail_with_output "no note '$note'"
done

finish test_config_cli
