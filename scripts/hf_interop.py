#!/usr/bin/python3
"""hf_interop.py — checkpoints move between moe-train and Hugging Face transformers (MixtralForCausalLM).

Proves two directions on a tiny model (vocab 256, d 64, 2 layers, 4 heads / 2 kv heads, 4 experts, top-2):
  A. ours -> HF: moe-train trains 20 steps on 2 ranks and saves a checkpoint; transformers loads the
     directory as MixtralForCausalLM and gives the same logits on validation sequence 0 (moe-train
     --dump-logits) and the same mean cross-entropy over the eval sequences as moe-train --eval-only.
  B. HF -> ours: random MixtralConfig models saved with save_pretrained (safetensors, float32) load in
     moe-train with --init-from and no shape flags (the architecture comes from config.json) and give the same
     eval loss as transformers on the same sequences: the top-2 model above (rope_theta 1e4), a top-1 one (Mixtral
     renormalises its one gate to 1) and one with rope_theta 1e6 and rms_norm_eps 1e-6.
  C. A model transformers cannot compute (top-1 without renormalisation) is saved by moe-train as
     MoeTrainMixtralVariantForCausalLM: transformers refuses to load it instead of computing another function.
  D. HF bf16 -> ours: the top-2 model saved by transformers in bfloat16 (model.to(torch.bfloat16)); moe-train
     widens the BF16 tensors to fp32 exactly, as transformers does loading it with torch_dtype=float32.
  E. HF shards -> ours: the float32 top-2 model saved with save_pretrained(max_shard_size="100KB") (shards + index).
  F. ours (bf16, sharded) -> HF: moe-train saves with --save-dtype bf16 --save-shard-size 100KB; transformers
     loads the directory and gives moe-train --eval-only's loss on it.
Tolerances: logits max|diff| <= 1e-4 * max|logit| + 1e-5; loss relative difference <= 1e-5 (every comparison
computes in fp32 from the same weights on both sides: the bf16 ones are exact in fp32).

Run (Debian's python3 with python3-torch and transformers, e.g. 4.40.2; scripts/test.sh installs it):
  /usr/bin/python3 scripts/hf_interop.py --moe-train build/moe-train --mpirun mpirun --workdir /tmp/hf
or as the meson test: meson test -C build test_hf_interop -v
Exit: 0 all comparisons pass, 1 one fails (or moe-train refuses a file), 77 transformers unavailable.
"""
import argparse
import os
import random
import re
import shutil
import struct
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local directories only; nothing is downloaded
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

try:
    import torch
    import torch.nn.functional as F
    import transformers
    from transformers import MixtralConfig, MixtralForCausalLM
    from hf_common import run, sequences, write_tokens
except Exception as e:  # ImportError, or a transformers too old to have Mixtral
    print(f"SKIP: transformers with MixtralForCausalLM is not importable under {sys.executable}: {e!r}")
    sys.exit(77)

VOCAB, SEQ, BATCH, EVAL_BATCHES, THETA, EPS = 256, 32, 4, 2, 10000.0, 1e-5
MODEL = dict(layers=2, d_model=64, heads=4, kv_heads=2, d_ff=96, experts=4, top_k=2)
MODEL_FLAGS = ["--layers", "2", "--d-model", "64", "--heads", "4", "--kv-heads", "2", "--d-ff", "96",
               "--experts", "4", "--top-k", "2", "--seq-len", str(SEQ), "--vocab", str(VOCAB),
               "--rope-theta", str(THETA), "--tie-embeddings", "0", "--batch", str(BATCH)]
LOGIT_RTOL, LOGIT_ATOL, LOSS_RTOL = 1e-4, 1e-5, 1e-5
def synthetic_text(n, seed):
    """Bytes of text-like sentences from a small word list: structure for a tiny model to learn."""
    rng = random.Random(seed)
    words = ["and", "the", "lord", "said", "unto", "moses", "of", "israel", "in", "that", "day", "light",
             "was", "good", "earth", "waters", "god", "created", "heaven", "behold"]
    out = bytearray()
    while len(out) < n:
        sentence = " ".join(rng.choice(words) for _ in range(rng.randint(3, 9)))
        out += (sentence[0].upper() + sentence[1:] + rng.choice([".", ",", ";", ":"]) + "\n").encode()
    return list(out[:n])


def eval_sequences(tokens, count):
    """moe-train's validation sequences 0..count-1 (hf_common.sequences)."""
    return sequences(tokens, count, SEQ)


def ours_eval(args, data, init_from, dump=None):
    """moe-train --eval-only on 2 ranks, the architecture from init_from's config.json (no shape flags); returns
    the printed val loss, or None when it failed."""
    cmd = [args.mpirun, "-np", "2", args.moe_train, "--seq-len", str(SEQ), "--batch", str(BATCH), *data,
           "--init-from", init_from, "--eval-only", "1", "--eval-batches", str(EVAL_BATCHES)]
    if dump:
        cmd += ["--dump-logits", dump]
    ok, out = run(cmd, f"moe-train --eval-only --init-from {init_from}")
    m = re.search(r"eval: val_loss ([0-9.eE+-]+) over (\d+) tokens", out)
    if ok and not m:
        print("FAIL: moe-train printed no 'eval: val_loss X over N tokens' line")
    if ok and m and int(m.group(2)) != EVAL_BATCHES * BATCH * SEQ:
        print(f"FAIL: moe-train evaluated {m.group(2)} tokens, expected {EVAL_BATCHES * BATCH * SEQ}")
        return None
    return float(m.group(1)) if ok and m else None


def hf_eval(model, inputs, targets):
    """(logits [count, S, V] float64, mean next-token cross-entropy) of transformers on the sequences."""
    with torch.no_grad():
        logits = model(input_ids=inputs).logits.double()
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1), reduction="mean").item()
    return logits, loss


def load_hf(path):
    kwargs = dict(torch_dtype=torch.float32)
    try:
        return MixtralForCausalLM.from_pretrained(path, attn_implementation="eager", **kwargs).eval()
    except TypeError:  # transformers before attn_implementation: eager is the only one
        return MixtralForCausalLM.from_pretrained(path, **kwargs).eval()


def loss_check(name, ours, hf, results):
    rel = abs(ours - hf) / abs(hf)
    ok = rel <= LOSS_RTOL
    print(f"{name}: moe-train val_loss {ours:.9f}  transformers {hf:.9f}  rel diff {rel:.2e}  "
          f"(tolerance {LOSS_RTOL:.0e})  {'ok' if ok else 'FAIL'}")
    results.append((name, ok))


def part_a(args, w, data, val, results):
    print("== A. ours -> Hugging Face: train 20 steps with moe-train, load as MixtralForCausalLM ==")
    ckpt = os.path.join(w, "ckpt")
    ok, _ = run([args.mpirun, "-np", "2", args.moe_train, *MODEL_FLAGS, *data, "--steps", "20", "--warmup", "2",
                 "--eval-interval", "0", "--eval-batches", "1", "--sample-tokens", "0",
                 "--checkpoint-dir", ckpt], "moe-train training run")
    step_dir = os.path.join(ckpt, "step-00000020")
    dump = os.path.join(w, "ours.f32")
    ours = ours_eval(args, data, step_dir, dump) if ok else None
    if ours is None:
        results.append(("A: moe-train train + eval", False))
        return
    model = load_hf(step_dir)
    inputs, targets = eval_sequences(val, EVAL_BATCHES * BATCH)
    logits, hf_loss = hf_eval(model, inputs, targets)
    with open(dump, "rb") as f:
        raw = f.read()
    if len(raw) != SEQ * VOCAB * 4:
        print(f"FAIL: {dump} has {len(raw)} bytes, expected {SEQ * VOCAB * 4} (float32 [{SEQ}, {VOCAB}])")
        results.append(("A: logits", False))
    else:
        ours_logits = torch.tensor(struct.unpack(f"<{SEQ * VOCAB}f", raw), dtype=torch.float64).reshape(SEQ, VOCAB)
        diff = (ours_logits - logits[0]).abs().max().item()
        scale = logits[0].abs().max().item()
        ok = diff <= LOGIT_RTOL * scale + LOGIT_ATOL
        print(f"A logits (validation sequence 0, [{SEQ}, {VOCAB}]): max|diff| {diff:.3e}  max|logit| {scale:.3f}  "
              f"tolerance {LOGIT_RTOL * scale + LOGIT_ATOL:.3e}  {'ok' if ok else 'FAIL'}")
        results.append(("A: logits", ok))
    loss_check("A loss", ours, hf_loss, results)


def part_b(args, w, data, val, results, name, top_k, theta, eps):
    print(f"== B. Hugging Face -> ours: random MixtralConfig model ({name}), moe-train --init-from ==")
    model = hf_model(top_k, theta, eps)
    hf_save_then_ours(args, w, data, val, results, f"B {name}", f"hf_model_{name}",
                      lambda d: model.save_pretrained(d, safe_serialization=True))


def hf_model(top_k=MODEL["top_k"], theta=THETA, eps=EPS, seed=1234):
    config = MixtralConfig(vocab_size=VOCAB, hidden_size=MODEL["d_model"], intermediate_size=MODEL["d_ff"],
                           num_hidden_layers=MODEL["layers"], num_attention_heads=MODEL["heads"],
                           num_key_value_heads=MODEL["kv_heads"], num_local_experts=MODEL["experts"],
                           num_experts_per_tok=top_k, max_position_embeddings=4 * SEQ,
                           rope_theta=theta, rms_norm_eps=eps, tie_word_embeddings=False, sliding_window=None,
                           hidden_act="silu", torch_dtype="float32")
    torch.manual_seed(seed)
    config.initializer_range = 0.1  # larger than the default 0.02 so that the routing is not near-uniform
    model = MixtralForCausalLM(config).float().eval()
    with torch.no_grad():  # norms start at 1 in transformers; random gains check that they load too
        for pname, p in model.named_parameters():
            if pname.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    return model


def hf_save_then_ours(args, w, data, val, results, name, subdir, save):
    """save(dir) writes a transformers directory; moe-train --init-from it must give transformers' loss on it."""
    hf_dir = os.path.join(w, subdir)
    save(hf_dir)
    print(f"saved {hf_dir}: {sorted(os.listdir(hf_dir))}")
    inputs, targets = eval_sequences(val, EVAL_BATCHES * BATCH)
    _, hf_loss = hf_eval(load_hf(hf_dir), inputs, targets)
    ours = ours_eval(args, data, hf_dir)
    if ours is None:
        print(f"FAIL: moe-train did not load {hf_dir} (its message is above)")
        results.append((f"{name}: moe-train --init-from the transformers directory", False))
        return
    loss_check(f"{name} loss", ours, hf_loss, results)


def part_c(args, w, data, results):
    print("== C. a model Mixtral cannot compute (top-1, not renormalised) is not labelled MixtralForCausalLM ==")
    ckpt = os.path.join(w, "ckpt_top1")
    flags = list(MODEL_FLAGS)
    flags[flags.index("--top-k") + 1] = "1"
    ok, _ = run([args.mpirun, "-np", "2", args.moe_train, *flags, *data, "--renormalize", "0", "--steps", "2",
                 "--warmup", "1", "--eval-batches", "1", "--sample-tokens", "0", "--checkpoint-dir", ckpt],
                "moe-train top-1 training run")
    if not ok:
        results.append(("C: moe-train top-1 run", False))
        return
    step_dir = os.path.join(ckpt, "step-00000002")
    try:
        transformers.AutoModelForCausalLM.from_pretrained(step_dir, torch_dtype=torch.float32)
        print("FAIL: transformers loaded a top-1 model without renormalisation as a Mixtral")
        refused = False
    except (ValueError, KeyError, OSError) as e:
        print(f"transformers refuses it: {type(e).__name__}: {str(e).splitlines()[0]}")
        refused = True
    results.append(("C: a variant checkpoint is refused by transformers", refused))


def part_d_e(args, w, data, val, results):
    print("== D. Hugging Face bf16 -> ours; E. Hugging Face shards -> ours ==")
    model = hf_model()
    hf_save_then_ours(args, w, data, val, results, "D bf16", "hf_model_bf16",
                      lambda d: model.to(torch.bfloat16).save_pretrained(d, safe_serialization=True))
    model = hf_model()

    def sharded(d):
        model.save_pretrained(d, safe_serialization=True, max_shard_size="100KB")
        if not os.path.exists(os.path.join(d, "model.safetensors.index.json")):
            raise RuntimeError(f"transformers wrote no index in {d}: {os.listdir(d)}")
    hf_save_then_ours(args, w, data, val, results, "E shards", "hf_model_shards", sharded)


def part_f(args, w, data, val, results):
    print("== F. ours (bf16 export, shards of 100KB) -> Hugging Face ==")
    ckpt = os.path.join(w, "ckpt_bf16")
    ok, _ = run([args.mpirun, "-np", "2", args.moe_train, *MODEL_FLAGS, *data, "--steps", "5", "--warmup", "1",
                 "--eval-interval", "0", "--eval-batches", "1", "--sample-tokens", "0", "--checkpoint-dir", ckpt,
                 "--save-dtype", "bf16", "--save-shard-size", "100KB"], "moe-train bf16 sharded save")
    step_dir = os.path.join(ckpt, "step-00000005")
    ours = ours_eval(args, data, step_dir) if ok else None
    shards = [f for f in os.listdir(step_dir) if f.startswith("model-")] if ok else []
    if ours is None or len(shards) < 2:
        print(f"FAIL: no bf16 sharded checkpoint to compare (files: {shards})")
        results.append(("F: moe-train bf16 sharded save", False))
        return
    inputs, targets = eval_sequences(val, EVAL_BATCHES * BATCH)
    _, hf_loss = hf_eval(load_hf(step_dir), inputs, targets)
    loss_check(f"F loss ({len(shards)} shards)", ours, hf_loss, results)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--moe-train", required=True)
    ap.add_argument("--mpirun", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    torch.set_num_threads(2)
    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, transformers {transformers.__version__}")
    w = os.path.abspath(args.workdir)
    shutil.rmtree(w, ignore_errors=True)  # a fresh directory: no checkpoint of an earlier run is reused
    os.makedirs(w)
    train = synthetic_text(6000, seed=1)
    val = synthetic_text(EVAL_BATCHES * BATCH * SEQ + 64, seed=2)
    write_tokens(os.path.join(w, "train.bin"), train)
    write_tokens(os.path.join(w, "val.bin"), val)
    data = ["--train-data", os.path.join(w, "train.bin"), "--val-data", os.path.join(w, "val.bin")]
    results = []
    part_a(args, w, data, val, results)
    part_b(args, w, data, val, results, "top2", MODEL["top_k"], THETA, EPS)
    part_b(args, w, data, val, results, "top1", 1, THETA, EPS)
    part_b(args, w, data, val, results, "theta1e6", MODEL["top_k"], 1e6, 1e-6)
    part_c(args, w, data, results)
    part_d_e(args, w, data, val, results)
    part_f(args, w, data, val, results)
    print("== summary ==")
    for name, ok in results:
        print(f"  {'ok  ' if ok else 'FAIL'}  {name}")
    passed = all(ok for _, ok in results)
    print("hf_interop: " + ("all comparisons pass" if passed else "FAILED"))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
