#!/bin/bash
# test_plan_cli.sh MOE_PLAN CONFIG_DIR — moe-plan's command line: bad flags and configs are refused with exit 2 and a
# message naming the flag or key; a valid run prints its report, --json parses and holds the exact counts, and
# --search ranks layouts best first and lists only ones that fit.
plan=$1 configs=$2
status=0
fail() { echo "FAIL: $*"; status=1; }

# expect_error WANT ARGS...: exit 2 and WANT in stderr
expect_error() {
    local want=$1
    shift
    local err
    err=$("$plan" "$@" 2>&1 >/dev/null)
    local rc=$?
    [ $rc -eq 2 ] || fail "moe-plan $* exited $rc, want 2"
    case $err in *"$want"*) ;; *) fail "moe-plan $*: message '$err' does not name '$want'" ;; esac
}
expect_error "--bogus" --bogus 1
expect_error "--ep" --ep 0
expect_error "--ep" --ep x
expect_error "--layers" --layers 4 --layers 5
expect_error "needs a value" --nodes
expect_error "--ep must divide" --ep 3
expect_error "--ep must divide the number of experts" --gpus-per-node 16 --ep 16
expect_error "dp x ep" --ep 2 --dp 2
expect_error "--global-batch" --global-batch 12
expect_error "--heads 3 must divide" --heads 3
# as moe-train refuses them (a probe: planned, and ranked by --search): --tp not dividing --seq-len; ZeRO-2 where the
# stage's ranks, its --tp ones included, do not divide the shards
expect_error "--tp must divide --seq-len" --tp 8 --heads 8 --seq-len 12
expect_error "--zero 2 needs moe-train's world-invariant sums" --pp 2 --tp 2 --zero 2 --micro-batch 1 --global-batch 8
out=$("$plan" --moe-every 8 --layers 4 2>&1)
case $out in
*"note: no layer is an MoE layer (--moe-every 8"*) ;;
*) fail "no note of a model without MoE layers" ;;
esac
expect_error "--layers cannot be combined" --hf-config "$configs/mixtral-8x7b.json" --layers 2
expect_error "no-such.json" --hf-config "$configs/no-such.json"
expect_error "leave out --ep" --search --ep 2
expect_error "--top needs --search" --top 3
expect_error "--ep" --ep=0
expect_error "--search takes no value" --search=1
[ "$("$plan" --ep=2 --json)" = "$("$plan" --ep 2 --json)" ] || fail "--ep=2 and --ep 2 plan differently"
# (a probe) ends of a pipeline without one, as moe-train refuses them; a skew no ep ranks can have
expect_error "--first-stage-layers and --last-stage-layers need a pipeline (--pp 2 or more)" --first-stage-layers 2
expect_error "--routing-skew is at most --ep" --ep 2 --routing-skew 5
expect_error "--search ranks layouts of at most 2^20 (1048576) GPUs, not 1048584" --search --nodes 131073
expect_error "--precision must be bf16 or fp32" --precision fp16
expect_error "--gemm-efficiency" --gemm-efficiency 1.5
expect_error "--dense-us-per-token" --dense-us-per-token 0
expect_error "--optimizer-ns-per-param" --optimizer-ns-per-param -1
expect_error "--zero expects an integer in [0, 2], got '3'" --zero 3
expect_error "--zero expects an integer in [0, 2], got 'two'" --zero two
expect_error "--zero 2 needs moe-train's world-invariant sums" --nodes 16 --zero 2   # 128 GPUs, 64 shards at most
expect_error "--zero 2 needs moe-train's world-invariant sums" --gpus-per-node 6 --zero 2
expect_error "--shards 3 must be 0 or a power of two" --shards 3
expect_error "--shards 32 must be 0 or a power of two that the 64 GPUs divide" --nodes 8 --shards 32
expect_error "--shards must divide GPUs x --micro-batch" --nodes 2 --shards 32
expect_error "--zero 2 needs moe-train's world-invariant sums" --zero 2 --shards 0
"$plan" --nodes 16 --zero 2 --shards 128 > /dev/null || fail "--zero 2 on 128 GPUs with --shards 128 refused"

out=$("$plan" --hf-config "$configs/qwen3-30b-a3b.json" --nodes 2 --ep 16 --micro-batch 2) || fail "a valid run failed"
case $out in *"total 30532122624"*"active 3353032704"*) ;; *) fail "report lacks the exact counts: $out" ;; esac
case $out in *"cannot train"*) fail "Qwen3-MoE is trainable (q/k norms, its own head_dim), yet noted: $out" ;; esac
"$plan" --hf-config "$configs/qwen3-30b-a3b.json" --nodes 2 --tp 4 > /dev/null ||
    fail "Qwen3-30B-A3B at --tp 4 (its 4 kv heads split) refused"
# at --tp 8 each of its 4 kv heads is on 2 GPUs, its per-head q/k norms too (moe-train runs them at any tp): planned
# with the norms' all-to-alls, and --search tries it (on 32 GPUs some tp 8 layouts fit)
out_tp8=$("$plan" --hf-config "$configs/qwen3-30b-a3b.json" --nodes 2 --tp 8) || fail "Qwen3-30B-A3B at --tp 8 refused"
case $out_tp8 in *"tp 8 (with sequence parallelism)"*"(and the q/k norms' all-to-alls)"*) ;;
    *) fail "Qwen3-30B-A3B at --tp 8: its layout or the norms' all-to-alls: $out_tp8" ;; esac
"$plan" --hf-config "$configs/qwen3-30b-a3b.json" --nodes 4 --search --top 100000 --json |
    python3 -c 'import json, sys; L = json.load(sys.stdin)["layouts"]; assert any(l["tp"] == 8 for l in L), len(L)' ||
    fail "Qwen3-30B-A3B --search on 32 GPUs failed, or lists no layout of tp 8"
# DeepSeek-V3's 61 layers in a pipeline: uneven ends (the stages between ceil(61 / pp) layers each); on 512 GPUs
# the search's best is such a pipeline (on 2048 too: docs/SCALING.md), and a fixed pp 16 runs with the ends given
"$plan" --hf-config "$configs/deepseek-v3.json" --nodes 64 --global-batch 4096 --search --top 1 --json |
    python3 -c 'import json, sys; L = json.load(sys.stdin)["layouts"]; b = L[0]
assert b["pp"] > 1 and b["first_stage_layers"] + b["last_stage_layers"] > 0, b' ||
    fail "DeepSeek-V3 --search on 512 GPUs: no pipeline with uneven ends at the top"
expect_error "or --first-stage-layers / --last-stage-layers give the ends theirs" \
    --hf-config "$configs/deepseek-v3.json" --nodes 256 --pp 16 --ep 64 --global-batch 16384
out_v3_pp=$("$plan" --hf-config "$configs/deepseek-v3.json" --nodes 256 --pp 16 --ep 64 --global-batch 16384 \
    --first-stage-layers 1 --last-stage-layers 4 --zero 1 --recompute full) ||
    fail "DeepSeek-V3 at pp 16, 1 + 4 refused"
case $out_v3_pp in *"pp 16 x 1 virtual stage (layers: first stage 1, last 4)"*"fits"*) ;;
    *) fail "DeepSeek-V3 at pp 16 with uneven ends: $out_v3_pp" ;; esac
# multi-head latent attention at tp 2 (models/mla.c): q_b, kv_b and o split by heads, q_a and kv_a whole; its latents
# move instead of ln1, so its tensor-parallel traffic differs from the same shape's plain attention
out_v3_tp2=$("$plan" --hf-config "$configs/deepseek-v3.json" --nodes 32 --ep 32 --tp 2 --json) ||
    fail "DeepSeek-V3 at --tp 2 refused"
python3 - "$out_v3_tp2" <<'PY' || fail "DeepSeek-V3 at --tp 2: $out_v3_tp2"
import json, sys
d = json.loads(sys.argv[1])
p = d["prediction"]
assert p["tp"] == 2, p
assert p["bytes_sent_per_step"]["tp"] > 0, p["bytes_sent_per_step"]
PY
out_v3=$("$plan" --hf-config "$configs/deepseek-v3.json" --nodes 32 --ep 32) || fail "DeepSeek-V3 refused"
case $out_v3 in *"total 671026404352"*"active 37552282624"*) ;; *) fail "DeepSeek-V3's counts: $out_v3" ;; esac
case $out_v3 in *"cannot train"*) fail "DeepSeek-V3 noted as untrainable: $out_v3" ;; esac
case $out in *"7 peers on its node, "*" to 8 on others"*) ;; *) fail "ep 16 on 2 nodes of 8: want 7 peers on, 8 off" ;; esac

json=$("$plan" --hf-config "$configs/qwen3-30b-a3b.json" --nodes 8 --seq-len 1024 --global-batch 512 --search --top 5 \
    --json) || fail "--search --json failed"
python3 - "$json" <<'PY' || status=1
import json, sys
d = json.loads(sys.argv[1])
p = d["model"]["params"]
assert p["total"] == 30532122624 and p["active"] == 3353032704, p
assert d["model"]["unsupported"] == [], d["model"]["unsupported"]  # head_dim and q/k norms: trainable (issue 51)
L = d["layouts"]
assert all(4 % l["tp"] == 0 for l in L), [l["tp"] for l in L]  # each head's q/k norms: tp divides the 4 kv heads
assert 0 < len(L) <= 5 and d["layouts_fit"] >= len(L), (len(L), d["layouts_fit"])
tps = [l["tokens_per_s_serial"] for l in L]
assert tps == sorted(tps, reverse=True), tps
for l in L:
    assert l["fits"] and l["memory_bytes"]["total"] <= 80e9, l
    assert l["pp"] * l["ep"] * l["dp"] * l["tp"] == 64 and 128 % l["ep"] == 0 and l["seconds"]["step_overlap"] <= l["seconds"]["step_serial"], l
PY
# ZeRO-2: without a pipeline or tensor parallelism Mixtral 8x7B at S 4096 on 64 GPUs fits only with it (best layout
# ZeRO-2, reduced by reduce-scatter, less gradient memory than whole gradients); on 128 GPUs the world-invariant sums
# are off and the search has none of it (pipelines and tensor parallelism, which leave fewer GPUs reading distinct
# sequences, are left out here); tensor parallelism lets ZeRO-1 fit 64 GPUs without a pipeline
big=$(mktemp)  # every layout of 128 GPUs: too long for an argument
trap 'rm -f "$big"' EXIT
big64=$(mktemp)
trap 'rm -f "$big" "$big64"' EXIT
"$plan" --hf-config "$configs/mixtral-8x7b.json" --nodes 8 --search --top 100000 --json > "$big64" &&
    "$plan" --hf-config "$configs/mixtral-8x7b.json" --nodes 16 --gpu-memory 2000 --search --top 100000 --json \
        > "$big" || fail "--search for ZeRO-2 failed"
python3 - "$big64" "$big" <<'PY' || status=1
import json, sys
d, d128 = (json.load(open(a)) for a in sys.argv[1:3])
L = [l for l in d["layouts"] if l["pp"] == 1 and l["tp"] == 1]
assert L and all(l["zero"] == 2 and l["gradient_reduction"] == "reduce-scatter" for l in L), [(l["zero"], l["ep"]) for l in L]
assert L[0]["memory_bytes"]["gradients"] < L[0]["memory_bytes"]["masters"], L[0]["memory_bytes"]
assert any(l["pp"] == 1 and l["tp"] > 1 and l["zero"] == 1 for l in d["layouts"]), "no tensor-parallel ZeRO-1 layout fits"
flat = [l for l in d128["layouts"] if l["pp"] == 1 and l["tp"] == 1]
zeros = {l["zero"] for l in flat}
assert zeros == {0, 1} and d128["layouts_fit"] == d128["layouts_tried"] == len(d128["layouts"]), (zeros, d128["layouts_tried"])
assert all(l["gradient_reduction"] == "all-reduce" for l in flat)
PY
out=$("$plan" --gpus-per-node 8 --ep 2 --zero 2 --global-batch 16) || fail "a ZeRO-2 run failed"
# the layout in moe-train's words (a probe: per-GPU micro-batches and a global batch, never translated): --batch is
# the micro-batch of all 8 data ranks, --micro-batches the 16 / 8 of them a step
want="as moe-train flags (with the model's): mpirun -np 8 moe-train --ep 2 --zero 2 --batch 8 --micro-batches 2"
want="$want --seq-len 128 --precision bf16 --attention fused --recompute none"
case $out in *"$want"*) ;; *) fail "no moe-train flags of the layout: $out" ;; esac
case $out in *"ZeRO-2,"*"ZeRO-2 gradients (GiB): shard"*"gradient reduce-scatter per micro-batch, x 2:"*"ZeRO-2 parameter all-gather"*) ;;
    *) fail "the ZeRO-2 report lacks its layout, gradients or traffic: $out" ;; esac

# routing: a log where experts 0-3 get 3 rows each and 4-7 one: the busiest EP rank has 1.5x the mean at ep 2, 4
# and 8 and 1 at ep 1 (--search gives each ep its own); bad logs and flag pairs are refused by name
routing=$(mktemp)
trap 'rm -f "$big" "$big64" "$routing"' EXIT
echo '{"record":"run"}' > "$routing"
for step in 1 2; do
    echo "{\"step\":$step,\"expert_tokens\":[{\"layer\":0,\"tokens\":[3,3,3,3,1,1,1,1]}]}" >> "$routing"
done
expect_error "give one" --routing-from "$routing" --routing-skew 2
expect_error "no-such.jsonl" --routing-from "$configs/no-such.jsonl"
expect_error "--routing-skew" --routing-skew 0.5
expect_error "routes over 8 experts, the model has 4" --routing-from "$routing" --experts 4
expect_error "not JSON" --routing-from "$configs/mixtral-8x7b.json"
"$plan" --gpus-per-node 8 --global-batch 8 --routing-from "$routing" --search --top 100000 --json > "$big" ||
    fail "--search with --routing-from failed"
python3 - "$big" <<'PY' || status=1
import json, sys
skew = {l["ep"]: l["routing_skew"] for l in json.load(open(sys.argv[1]))["layouts"] if l["pp"] == 1}
# ep 2: 12 of 16 rows over the mean 8; ep 4: 6 / 4; ep 8: 3 / 2; ep 1: 1
assert skew == {1: 1.0, 2: 1.5, 4: 1.5, 8: 1.5}, skew
PY
json=$("$plan" --gpus-per-node 2 --ep 2 --micro-batch 2 --json) && skewed=$("$plan" --gpus-per-node 2 --ep 2 \
    --micro-batch 2 --routing-skew 1.5 --json) || fail "a run with --routing-skew failed"
python3 - "$json" "$skewed" <<'PY' || status=1
import json, sys
even, skewed = (json.loads(a)["prediction"] for a in sys.argv[1:3])
assert even["routing_skew"] == 1 and skewed["routing_skew"] == 1.5, (even, skewed)
e, s = even["seconds"], skewed["seconds"]
assert s["compute_moe"] > e["compute_moe"] and s["alltoall"] > e["alltoall"], (e, s)
assert s["compute_dense"] == e["compute_dense"] and s["allreduce"] == e["allreduce"], (e, s)
PY

# scripts/plan_inputs.py, the arithmetic scripts/plan_vs_measured.sh feeds the planner: the fair-share skew on hand-
# worked cases, and Hockney's fit recovering the latency and bandwidth of exact timings (5 us + bytes to peers at
# 2 GB/s, 2 ranks)
inputs="$(dirname "$0")/../scripts/plan_inputs.py"
a2a=$(mktemp)
trap 'rm -f "$big" "$big64" "$routing" "$a2a"' EXIT
for size in 4096 65536 1048576 4194304; do
    python3 -c "print('{\"size_bytes\": %d, \"moe_us\": %.6f}' % ($size, 5 + $size / 2 / 2000))"
done > "$a2a"
python3 - "$inputs" "$a2a" <<'PY' || status=1
import subprocess, sys
run = lambda *a: [float(x) for x in subprocess.check_output([sys.executable, sys.argv[1], *a], text=True).split()]
assert abs(run("skew", "2.12", "4", "2")[0] - 1.3733333) < 1e-6  # others 0.6267: 0.6267 x 2 + 1.4933 over 2
assert run("skew", "4", "4", "2") == [2.0] and run("skew", "1", "4", "2") == [1.0]
assert run("skew", "1.37", "2", "2") == [1.37]  # a core each: the skew itself
lat, bw, near = run("alltoall", sys.argv[2], "2", "65536")
assert abs(lat - 5) < 1e-6 and abs(bw - 2) < 1e-6 and abs(near - (5 + 65536 / 4000)) < 1e-6, (lat, bw, near)
PY

# the CPU calibrations: the dense path at 20 µs per token over the 2 x 128 tokens of each of 2 GPUs, the optimizer
# at 1 ns per parameter updated (fp32, no ZeRO: 36 bytes each by the bandwidth count, so 1 ns x held parameters)
json=$("$plan" --precision fp32 --gpus-per-node 2 --ep 2 --micro-batch 2 --dense-us-per-token 20 \
    --optimizer-ns-per-param 1 --json) || fail "a run with --dense-us-per-token failed"
python3 - "$json" <<'PY' || status=1
import json, sys
d = json.loads(sys.argv[1])
s, p = d["prediction"]["seconds"], d["model"]["params"]
assert abs(s["compute_dense"] - 20e-6 * 256) < 1e-12, s
assert abs(s["compute"] - s["compute_dense"] - s["compute_moe"]) < 1e-12 and s["compute_moe"] > 0, s
assert abs(s["optimizer"] - 1e-9 * (p["dense"] + p["expert"] / 2)) < 1e-12, (s, p)
PY
# pipelines (--pp, --virtual-stages): refused up front by name; pp 1 is the report without a pipeline, number for
# number; Megatron's Mixtral layout reports its stage, its 4 (1 + 3/32) micro-batches in flight and its bubble 3/128
expect_error "--pp 3 must divide the 64 GPUs" --nodes 8 --pp 3
expect_error "--pp x --virtual-stages must divide the layers" --pp 4 --virtual-stages 2 --global-batch 32
expect_error "--virtual-stages needs --pp above 1" --virtual-stages 2
expect_error "at least --pp micro-batches" --nodes 2 --pp 4 --global-batch 8
expect_error "multiple of --pp" --pp 2 --virtual-stages 2 --global-batch 12
expect_error "--ep must divide the GPUs of a pipeline stage" --pp 4 --ep 4 --global-batch 8
expect_error "--search tries every --ep, --pp" --search --pp 2
expect_error "--search tries every --ep, --pp" --search --virtual-stages 2
expect_error "--shards 2 must be 0 or a power of two that the 4 GPUs of a pipeline stage divide" --nodes 2 --pp 4 \
    --shards 2 --global-batch 16
base=$("$plan" --hf-config "$configs/mixtral-8x7b.json" --nodes 8 --ep 8 --zero 2 --recompute full --json) &&
    one=$("$plan" --hf-config "$configs/mixtral-8x7b.json" --nodes 8 --ep 8 --zero 2 --recompute full --pp 1 --json) &&
    mega=$("$plan" --hf-config "$configs/mixtral-8x7b.json" --nodes 8 --pp 4 --virtual-stages 8 --ep 8 \
        --global-batch 256 --json) || fail "a pipeline run failed"
python3 - "$base" "$one" "$mega" <<'PY' || status=1
import json, sys
base, one, mega = (json.loads(a)["prediction"] for a in sys.argv[1:4])
assert base == one and one["pp"] == 1 and one["bubble_fraction"] == 0 and one["seconds"]["bubble"] == 0, (base, one)
assert mega["pp"] == 4 and mega["virtual_stages"] == 8 and mega["dp"] == 2 and mega["accum_steps"] == 16, mega
assert mega["memory_stage"] == 0 and mega["in_flight"] == 4 * (1 + 3 / 32), mega
assert mega["bubble_fraction"] == 3 / (8 * 16), mega
s = mega["seconds"]
pipelined = s["compute"] + s["alltoall"] + s["control"] + s["p2p"]
assert abs(s["bubble"] - 3 / 128 * pipelined) < 1e-8 * pipelined, s  # JSON keeps 10 digits
PY
out=$("$plan" --hf-config "$configs/mixtral-8x7b.json" --nodes 8 --pp 4 --virtual-stages 8 --ep 8 --global-batch 256) ||
    fail "a pipeline report failed"
case $out in *"pp 4 x 8 virtual stages, ep 8, dp 2"*"pipeline: the largest stage is 0 of 0..3 (8 layers"*"bubble"*) ;;
    *) fail "the pipeline report lacks its layout or stage: $out" ;; esac

# tensor parallelism (--tp): refused up front by name; tp 1 is the report without it, number for number; tp 2 reports
# its layout, collectives and time, and halves the tokens every GPU holds
expect_error "--tp 3 must divide the 8 GPUs of a pipeline stage" --tp 3
expect_error "--tp must be a power of two" --gpus-per-node 6 --tp 6 --experts 6
expect_error "--tp must divide --gpus-per-node" --gpus-per-node 4 --nodes 2 --tp 8 --heads 8
expect_error "--tp must divide the attention heads" --tp 8
expect_error "--tp must divide the vocabulary" --tp 2 --heads 2 --vocab 255
expect_error "pp x dp x ep x tp" --tp 2 --heads 2 --ep 2 --dp 4
expect_error "--search tries every --ep, --pp, --virtual-stages, --tp" --search --tp 2
one=$("$plan" --hf-config "$configs/mixtral-8x7b.json" --nodes 2 --ep 4 --json) &&
    tp1=$("$plan" --hf-config "$configs/mixtral-8x7b.json" --nodes 2 --ep 4 --tp 1 --json) &&
    tp2=$("$plan" --hf-config "$configs/mixtral-8x7b.json" --nodes 2 --ep 4 --tp 2 --json) || fail "a --tp run failed"
python3 - "$one" "$tp1" "$tp2" <<'PY' || status=1
import json, sys
one, tp1, tp2 = (json.loads(a)["prediction"] for a in sys.argv[1:4])
assert one == tp1 and tp1["tp"] == 1 and tp1["seconds"]["tp"] == 0, (one, tp1)
assert tp2["tp"] == 2 and tp2["dp"] == 2 and tp2["expert_dp"] == 4 and tp2["global_batch"] == 8, tp2
assert tp2["bytes_sent_per_step"]["tp"] > 0 and tp2["seconds"]["tp"] > 0, tp2
assert abs(2 * tp2["memory_bytes"]["activations"] - one["memory_bytes"]["activations"]) < 1e-6 * one["memory_bytes"]["activations"]
assert tp2["memory_bytes"]["masters"] < one["memory_bytes"]["masters"], (tp2["memory_bytes"], one["memory_bytes"])
PY
out=$("$plan" --hf-config "$configs/mixtral-8x7b.json" --nodes 2 --ep 4 --tp 2) || fail "a --tp report failed"
case $out in *"tp 2 (with sequence parallelism), ep 4, dp 2"*"tensor-parallel all-gathers and reduce-scatters"*"tensor-parallel collectives"*) ;;
    *) fail "the --tp report lacks its layout or collectives: $out" ;; esac
# OLMoE-1B-7B (q/k norms over the whole projections): exact counts, planned at --tp 2 with the norms' all-to-alls, and
# --search tries tp > 1 for it (moe-train runs its norms at any tp)
out=$("$plan" --hf-config "$configs/olmoe-1b-7b.json" --nodes 1 --tp 2) || fail "OLMoE-1B-7B at --tp 2 refused"
case $out in *"total 6919161856"*"active 1282017280"*"(and the q/k norms' all-to-alls)"*) ;;
    *) fail "OLMoE-1B-7B at --tp 2: its counts or the norms' all-to-alls: $out" ;; esac
"$plan" --hf-config "$configs/olmoe-1b-7b.json" --nodes 1 --search --top 1000 --json |
    python3 -c 'import json, sys; L = json.load(sys.stdin)["layouts"]; assert any(l["tp"] > 1 for l in L), len(L)' ||
    fail "OLMoE-1B-7B --search failed, or lists no layout of tp > 1"

# config.json edits (a probe, 2026-12-07): shapes past int64's counts refused (they wrapped to negative parameters),
# DeepSeek's topk_group past n_group refused, and what moe-train refuses by key planned with a note naming the key
edited=$(mktemp -d)
trap 'rm -rf "$edited"' EXIT
edit_config() { # BASE OUT KEY JSON_VALUE
    python3 -c 'import json, sys; c = json.load(open(sys.argv[1])); c[sys.argv[3]] = json.loads(sys.argv[4]); \
json.dump(c, open(sys.argv[2], "w"))' "$configs/$1" "$edited/$2" "$3" "$4"
}
edit_config mixtral-8x7b.json huge.json hidden_size 1099511627776
edit_config deepseek-v3.json groups.json topk_group 20
edit_config mixtral-8x7b.json bias.json attention_bias true
edit_config olmoe-1b-7b.json clip.json clip_qkv 8.0
edit_config mixtral-8x7b.json factor.json rope_scaling '{"factor": 4.0}'
edit_config qwen3-30b-a3b.json linear.json rope_scaling '{"rope_type": "linear", "factor": 2.0}'
expect_error "more than 2^50 parameters" --hf-config "$edited/huge.json"
expect_error "topk_group is 20, outside [1, 8]" --hf-config "$edited/groups.json"
# the same keys and words as moe-train's refusals (checkpoint/hf_unsupported.c: one list for both)
for c in bias:attention_bias clip:clip_qkv "factor:rope_scaling has a factor but no rope_type" \
    'linear:rope_scaling.rope_type must be "default" or "yarn"'; do
    out=$("$plan" --hf-config "$edited/${c%%:*}.json") || fail "${c%%:*}.json refused"
    case $out in *"note: moe-train cannot train this model as it is: ${c#*:}"*) ;;
        *) fail "${c%%:*}.json: no note naming ${c#*:}: $out" ;; esac
done

# absent keys read as moe-train and transformers read them (a probe, 2026-12-07: DeepSeek's absent n_shared_experts,
# first_k_dense_replace and n_group were 0, 0 and 1, and transformers 5's num_local_experts of a Qwen3-MoE was
# "missing")
rename_keys() { # BASE OUT OLD=NEW... (NEW empty: the key dropped)
    python3 -c 'import json, sys
c = json.load(open(sys.argv[1]))
for edit in sys.argv[3:]:
    old, new = edit.split("=")
    value = c.pop(old)
    if new: c[new] = value
json.dump(c, open(sys.argv[2], "w"))' "$configs/$1" "$edited/$2" "${@:3}"
}
totals() { "$plan" --hf-config "$1" | grep -o 'parameters: total [0-9]*'; }
rename_keys deepseek-v3.json ds3-defaults.json first_k_dense_replace= n_shared_experts= n_group= topk_group= \
    q_lora_rank=
rename_keys qwen3-30b-a3b.json qwen3-local.json num_experts=num_local_experts
edit_config qwen3-30b-a3b.json qwen3-both.json num_local_experts 64
for c in deepseek-v3.json:ds3-defaults.json qwen3-30b-a3b.json:qwen3-local.json; do
    want=$(totals "$configs/${c%%:*}") have=$(totals "$edited/${c#*:}")
    [ -n "$want" ] && [ "$have" = "$want" ] || fail "${c#*:}: $have, the published file's $want"
done
expect_error "num_experts 128 and num_local_experts 64 disagree" --hf-config "$edited/qwen3-both.json"
# more absent keys, each against the file that gives transformers' default (mutation testing, 2026-12-07: a changed
# default went unseen): Mixtral's num_key_value_heads (= heads), DeepSeek-V2's n_shared_experts (2), V3's n_group (8)
rename_keys mixtral-8x7b.json mixtral-no-kv.json num_key_value_heads=
edit_config mixtral-8x7b.json mixtral-kv32.json num_key_value_heads 32
python3 -c 'import json, sys; c = json.load(open(sys.argv[1])); c["model_type"] = "deepseek_v2"; c.pop("n_shared_experts")
json.dump(c, open(sys.argv[2], "w")); c["n_shared_experts"] = 2; json.dump(c, open(sys.argv[3], "w"))' \
    "$configs/deepseek-v3.json" "$edited/v2-no-shared.json" "$edited/v2-shared2.json"
for c in mixtral-kv32.json:mixtral-no-kv.json v2-shared2.json:v2-no-shared.json; do
    want=$(totals "$edited/${c%%:*}") have=$(totals "$edited/${c#*:}")
    [ -n "$want" ] && [ "$have" = "$want" ] || fail "${c#*:}: $have, with the default given $want"
done
python3 -c 'import json, sys; c = json.load(open(sys.argv[1])); c["n_routed_experts"] = 12; c.pop("n_group")
c["num_experts_per_tok"] = 2; c["topk_group"] = 1; json.dump(c, open(sys.argv[2], "w"))' \
    "$configs/deepseek-v3.json" "$edited/v3-12.json"
expect_error "n_group 8 does not divide the 12 routed experts" --hf-config "$edited/v3-12.json"

[ $status -eq 0 ] && echo "ok: moe-plan refuses bad input by name; report, --json and --search hold"
exit $status
