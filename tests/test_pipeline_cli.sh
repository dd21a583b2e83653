#!/usr/bin/env bash
# test_pipeline_cli.sh MPIRUN MOE_TRAIN TEXT_TO_TOKENS EXPECT_FAILURE — moe-train's pipeline parallelism (--pp, issue
# 27) as a user meets it: a 4-layer model with capacity drops and 4 micro-batches, 6 steps with two evaluations, a
# sample and checkpoints at steps 3 and 6, on 1 rank, then in pipelines of 2 stages (2 ranks), 2 stages x ep 2 (4
# ranks), 4 stages (4 ranks), 2 stages of 2 virtual stages each (the interleaved schedule, 2 ranks), 2 stages x 2 data-parallel ranks with ZeRO-1 and sigmoid routing (its selection
# biases in the training state), and 2 x 2 with tied embeddings and ZeRO-2 (the first and the last stage each hold the
# embedding; 1F1B and interleaved), uneven stages (--first-stage-layers, --last-stage-layers: 1 + 2 + 1 layers on 3
# ranks, 1 + 3 on 2, its step 3 resumed as 3 + 1), each against its own 1-rank run: every step's metrics (loss, aux
# and z losses, gradient norm, drops, expert counts, validation loss; everything but the timings), the sampled text
# and both checkpoints' model.safetensors and train_state.safetensors are the 1-rank run's, byte for byte. Step 3 of the 2-stage run
# resumed in 4 stages and on 1 rank, and step 3 of the 1-rank run resumed in 2 stages, continue to the same metrics
# and step-6 files. Routing traces recorded in pipelines (pp 2, pp 2 x ep 2, pp 2 x 2 virtual stages: each stage writes
# its layers' records) are the 1-rank run's byte for byte; replayed in pp 2 x 2 virtual stages the 1-rank run's trace
# gives that run, and another run's trace other losses. The grid is printed at start. Bad pipeline flags are refused
# up front. Every run reads its data shuffled (--shuffle 1, issue 52: a permutation of the global window index).
source "$(dirname "$0")/train_cli_common.sh"

small=(--layers 4 --d-model 16 --heads 2 --kv-heads 2 --d-ff 16 --seq-len 16 --experts 4 --top-k 2 --batch 8
       --micro-batches 4 --capacity-factor 1.0 --steps 6 --warmup 1 --eval-batches 1 --eval-interval 3
       --sample-tokens 12 --exchange-timeout 60 --train-data "$dir/train.bin" --val-data "$dir/val.bin" --shuffle 1)

run() { # NAME RANKS FLAGS...: trains, checkpoints into $dir/NAME, metrics into $dir/NAME.jsonl, output into $dir/NAME.txt
    local name=$1 np=$2
    shift 2
    merge --log-file "$dir/$name.jsonl" --checkpoint-dir "$dir/$name" --checkpoint-interval 3 "$@"
    if ! timeout 300 "$mpirun" -np "$np" "$train" "${merged[@]}" > "$dir/$name.txt" 2>&1; then
        cp "$dir/$name.txt" "$dir/out.txt"
        fail_with_output "$name: moe-train on $np ranks failed"
    fi
}

metrics() { # the step records without their timings
    grep '"step"' "$1" | sed -E 's/"(ms|tokens_per_s|elapsed_s|time|eval_ms)":("[^"]*"|[-0-9.e+]+),?//g'
}

sample() { sed -n '/^sample/,$p' "$1"; }

same_files() { # NAME REFERENCE STEP: the step's checkpoint files are byte for byte the reference's
    local f
    for f in model.safetensors train_state.safetensors; do
        cmp -s "$dir/$1/step-0000000$3/$f" "$dir/$2/step-0000000$3/$f" || { echo "step $3's $f"; return 1; }
    done
}

same_run() { # WHAT NAME REFERENCE [STEPS]: the NAME run's metrics (STEPS records, 6 by default), sample and step-6
    local what=$1 a=$2 b=$3 n=${4:-6} bad # checkpoint (and step 3's, for a whole run) are the reference's
    if [ "$(metrics "$dir/$a.jsonl" | wc -l)" -ne "$n" ] ||
        ! cmp -s <(metrics "$dir/$a.jsonl") <(metrics "$dir/$b.jsonl" | tail -n "$n"); then
        echo "FAIL: $what: the metrics differ from $b's"
        diff <(metrics "$dir/$a.jsonl") <(metrics "$dir/$b.jsonl" | tail -n "$n") | head -n 6
        failures=$((failures + 1))
    elif [ -z "$(sample "$dir/$a.txt")" ] || ! cmp -s <(sample "$dir/$a.txt") <(sample "$dir/$b.txt"); then
        echo "FAIL: $what: the sample differs from $b's"
        failures=$((failures + 1))
    elif ! bad=$(same_files "$a" "$b" 6) || { [ "$n" -eq 6 ] && ! bad=$(same_files "$a" "$b" 3); }; then
        echo "FAIL: $what: $bad differs from $b's"
        failures=$((failures + 1))
    else
        echo "ok: $what: $n steps' metrics, the validation losses, the sample and the checkpoints bitwise $b's"
    fi
}

shows() { # NAME PATTERN: the run's output has a line matching PATTERN
    if grep -Eq -e "$2" "$dir/$1.txt"; then
        echo "ok: $1 prints: $(grep -E -e "$2" "$dir/$1.txt" | head -n 1)"
    else
        cp "$dir/$1.txt" "$dir/out.txt"
        fail_with_output "$1: no line /$2/"
    fi
}

same_trace() { # NAME: the run's routing trace is byte for byte the 1-rank run's (a trace depends on no layout)
    if cmp -s "$dir/$1.trace" "$dir/one.trace"; then
        echo "ok: $1's routing trace is the 1-rank run's, byte for byte ($(stat -c %s "$dir/$1.trace") bytes)"
    else
        fail_with_output "$1: the routing trace differs from the 1-rank run's"
    fi
}

run one 1 --routing-trace-out "$dir/one.trace"
run pp2 2 --pp 2 --routing-trace-out "$dir/pp2.trace"
run pp2ep2 4 --pp 2 --ep 2 --routing-trace-out "$dir/pp2ep2.trace"
run pp4 4 --pp 4
run pp2v2 2 --pp 2 --virtual-stages 2 --routing-trace-out "$dir/pp2v2.trace"
same_run "pp 2 on 2 ranks" pp2 one
same_run "pp 2 x ep 2 on 4 ranks" pp2ep2 one
same_run "pp 4 on 4 ranks" pp4 one
same_run "pp 2 x 2 virtual stages (interleaved) on 2 ranks" pp2v2 one
shows pp2ep2 "^grid: 4 ranks = pp 2 x \\(tp 1 x dp 2 \\| ep 2 x edp 1\\)"
shows pp4 "pp 4 x ep 1 x expert-data-parallel 1; .* \(1 chunk\(s\) of 1 layers from layer 0, 4 forwards of each in flight\)"
shows pp2v2 "\(2 chunk\(s\) of 1 layers from layer 0, [0-9] forwards of each in flight\)"
shows pp2v2 "^pipeline: 2 stages x 4 micro-batches \(interleaved 1F1B\).*\(p - 1\) / \(V m\) = 12.5%"
for name in pp2 pp2ep2 pp2v2; do same_trace $name; done
# replay: the 1-rank run's trace in an interleaved pipeline gives that run; another run's trace (other weights, other
# routes) gives other losses, so the replay drives the routing
run pp2v2_replay 2 --pp 2 --virtual-stages 2 --routing-trace-in "$dir/one.trace"
same_run "pp 2 x 2 virtual stages replaying the 1-rank run's trace" pp2v2_replay one
run seed2 1 --seed 2 --routing-trace-out "$dir/seed2.trace"
run pp2_replay_seed2 2 --pp 2 --routing-trace-in "$dir/seed2.trace"
if ! cmp -s <(metrics "$dir/pp2_replay_seed2.jsonl") <(metrics "$dir/one.jsonl") &&
    grep -q '"step"' "$dir/pp2_replay_seed2.jsonl"; then
    echo "ok: pp 2 replaying another run's trace trains differently from the 1-rank run"
else
    fail_with_output "pp 2 replaying another run's trace gave the 1-rank run's metrics (or none): the replay is not used"
fi

run pp2_resumed_pp4 4 --pp 4 --resume "$dir/pp2/step-00000003"
run pp2_resumed_one 1 --pp 1 --resume "$dir/pp2/step-00000003"
run one_resumed_pp2 2 --pp 2 --resume "$dir/one/step-00000003"
# uneven stages (--first-stage-layers, --last-stage-layers: Megatron's ends): 1 + 2 + 1 layers on 3 ranks, 1 + 3 on
# 2; the latter's step 3 resumed as 3 + 1
run pp3ends 3 --pp 3 --first-stage-layers 1 --last-stage-layers 1
run pp2first1 2 --pp 2 --first-stage-layers 1
run pp2first1_resumed_last1 2 --pp 2 --last-stage-layers 1 --resume "$dir/pp2first1/step-00000003"
same_run "pp 3 of 1, 2 and 1 layers on 3 ranks" pp3ends one
same_run "pp 2 of 1 and 3 layers on 2 ranks" pp2first1 one
same_run "its step 3 resumed in pp 2 of 3 and 1 layers" pp2first1_resumed_last1 one 3
shows pp3ends "\(1 chunk\(s\) of 1 layers from layer 0, 3 forwards of each in flight\)"
same_run "step 3 of pp 2 resumed in pp 4" pp2_resumed_pp4 one 3
same_run "step 3 of pp 2 resumed on 1 rank" pp2_resumed_one one 3
same_run "step 3 of 1 rank resumed in pp 2" one_resumed_pp2 one 3

sigmoid=(--score sigmoid --bias-update-rate 0.01 --drop-priority score --zero 1)
run sigmoid1 1 "${sigmoid[@]}"
run sigmoid_pp2dp2 4 --pp 2 "${sigmoid[@]}"
same_run "pp 2 x dp 2 on 4 ranks, sigmoid routing, ZeRO-1" sigmoid_pp2dp2 sigmoid1

tied=(--tie-embeddings 1 --zero 2)
run tied1 1 "${tied[@]}"
run tied_pp2dp2 4 --pp 2 "${tied[@]}"
run tied_pp2v2dp2 4 --pp 2 --virtual-stages 2 "${tied[@]}"
same_run "pp 2 x dp 2 on 4 ranks, tied embeddings, ZeRO-2" tied_pp2dp2 tied1
same_run "pp 2 x 2 virtual stages x dp 2 on 4 ranks, tied embeddings, ZeRO-2" tied_pp2v2dp2 tied1

# the schedules as data: stage 1 of 2 with 4 micro-batches warms up with none and keeps one forward in flight
merge --pp 2 --micro-batches 4 --print-schedule
if timeout 60 "$mpirun" -np 2 "$train" "${merged[@]}" > "$dir/out.txt" 2>&1 &&
    grep -q "^stage 1 of 2 (1 virtual stage(s) each, 4 micro-batches): 16 steps, at most 1 forwards in flight" \
        "$dir/out.txt" && [ "$(sed -n '/^stage 1 of 2/{n;p;}' "$dir/out.txt")" = "recv act mb 0 chunk 0 <- 0" ]; then
    echo "ok: --print-schedule: $(grep -c '^stage' "$dir/out.txt") stages, e.g. $(grep '^stage 1' "$dir/out.txt")"
else
    fail_with_output "--print-schedule"
fi

refuses "--pp 3 must divide the number of ranks \(2\)" --pp 3
refuses "--pp 2 x --virtual-stages 1 = 2 stages must divide --layers 3" --pp 2 --layers 3
refuses "--virtual-stages 2 needs --pp 2 or more" --virtual-stages 2
refuses "--first-stage-layers 2, --last-stage-layers 1 with --pp 2, --virtual-stages 1 and --layers 4: the first and \
last stages' layers must leave" --pp 2 --first-stage-layers 2 --last-stage-layers 1
refuses "the first and last stages' layers are for one chunk a stage" --pp 2 --virtual-stages 2 --first-stage-layers 1
refuses "the first and last stages' layers need a pipeline" --first-stage-layers 1
refuses "--micro-batches 3 must be a multiple of --pp 2" --pp 2 --virtual-stages 2 --micro-batches 3 --layers 4
refuses "--pp 2 x --virtual-stages 4 = 8 stages must divide --layers 4" --pp 2 --virtual-stages 4
refuses "--ep 2 must divide the number of ranks of a pipeline stage \(1\)" --pp 2 --layers 2 --ep 2
finish test_pipeline_cli
