#!/usr/bin/python3
"""bench_train_torch.py — moe-train's default model trained by Hugging Face transformers' MixtralForCausalLM
on the CPU, as the PyTorch reference point for moe-train's tokens/s.

The model is moe-train's default (models/model_config.c, train/options.c): vocab 256 (bytes), 4 layers,
d_model 128, 4 heads and 4 key/value heads, d_ff 256, 8 SwiGLU experts top-2 in every layer (softmax router,
the k gates renormalised), RoPE theta 10000, RMSNorm eps 1e-5, untied embeddings, sequences of 128 tokens,
router aux-loss coefficient 0.01 with output_router_logits=True so that the aux loss is trained. Weights
from transformers' own initialisation (normal, std 0.02) after torch.manual_seed(--seed).

Training is moe-train's step: AdamW (torch.optim.AdamW, lr 3e-3, betas (0.9, 0.95), eps 1e-8, weight decay
0.1 on every tensor but the RMSNorm gains, as moe-train), the global gradient norm clipped to 1.0, one
micro-batch of --batch sequences. The learning rate is constant (moe-train warms up and decays it; the
schedule costs nothing). The batch of step s (from 1) is moe-train's: the sequences (s-1)*batch ..
s*batch-1 of the token file, sequence i being the window of seq_len+1 tokens at i*seq_len (wrapping at the
end), inputs its first seq_len tokens, targets its last seq_len. The loss is the mean next-token
cross-entropy over those batch*seq_len targets plus 0.01 * transformers' aux loss; it is computed here from
the logits, because transformers' own loss (labels=) shifts the labels inside and drops each sequence's
last position. The aux loss is transformers' load_balancing_loss_func: one Switch-style loss over the
router logits of all layers concatenated, whose fractions count each of the k choices apart, so it is k (2)
at perfect balance (moe-train sums one loss per layer, each 1 at balance); moe-train's router z-loss
(coefficient 0.001) has no counterpart in transformers and is left out.

--precision bf16 runs the forward and the loss under torch.autocast('cpu', dtype=torch.bfloat16) and the
backward outside it, as PyTorch recommends: every GEMM (attention, router and LM head included) takes bf16
inputs; weights, gradients and AdamW state stay float32. The router logits are then bf16: transformers'
MoE block takes its softmax in float32, but its aux loss takes the softmax of the bf16 logits (on the CPU,
autocast leaves softmax in bf16).

A timed step is: take the batch, forward, loss, backward, clip, AdamW step, zero_grad (set_to_none), timed
with time.perf_counter; the first --warmup of the --steps steps are not timed. Prints every step's loss and
time, then tokens/s (batch * seq_len / step time: median and best over the timed steps) and a last line
"json: {...}".

--threads sets torch.set_num_threads (OpenMP: torch's own kernels and oneDNN, which does the bf16 GEMMs) and
also OPENBLAS_NUM_THREADS, before torch is imported: Debian's torch does its float32 GEMMs in OpenBLAS
(BLAS_INFO=generic), whose thread count torch.set_num_threads does not change, so without it they would run
on whatever OPENBLAS_NUM_THREADS the shell has (scripts/mpi_env.sh sets 1) or on every core.

Run with Debian's python (python3-torch; transformers from pip, e.g. 4.40.2):
    /usr/bin/python3 bench/bench_train_torch.py [--train-data data/kjv_train.bin --steps 30 --warmup 3
        --threads <os.cpu_count()> --batch 16 --seq-len 128 --precision fp32 --seed 1337]
Exit: 0 done, 2 a usage error, 1 a bad token file, 77 transformers (with Mixtral) not importable.
"""
import argparse
import json
import os
import statistics
import sys
import time

from bench_args import int_in  # bench/, the script's own directory

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the model is built from a config: nothing to download
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# moe-train's defaults (models/model_config.c moe_model_config_default, train/options.c set_defaults,
# moe/config.c moe_config_default)
MODEL = dict(vocab=256, layers=4, d_model=128, heads=4, kv_heads=4, d_ff=256, experts=8, top_k=2,
             rope_theta=10000.0, rms_norm_eps=1e-5, tie_embeddings=False, aux_loss_coef=0.01)
ADAMW = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
CLIP = 1.0
TOKEN_MAGIC, TOKEN_VERSION, HEADER_INTS = 20240520, 1, 256


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--train-data", default="data/kjv_train.bin",
                   help="llm.c token file (default: %(default)s, made by scripts/prepare_data.sh)")
    p.add_argument("--steps", type=int_in(1, 1 << 30), default=30,
                   help="optimizer steps in all, the --warmup ones included, as moe-train's --steps "
                        "(default: %(default)s)")
    p.add_argument("--warmup", type=int_in(0, 1 << 30), default=3,
                   help="first steps left untimed (default: %(default)s)")
    p.add_argument("--threads", type=int_in(1, 4096), default=os.cpu_count() or 1,
                   help="torch.set_num_threads, and OPENBLAS_NUM_THREADS before torch is loaded "
                        "(default: os.cpu_count() = %(default)s)")
    p.add_argument("--batch", type=int_in(1, 1 << 20), default=16,
                   help="sequences per step, one micro-batch (default: %(default)s, moe-train's --batch)")
    p.add_argument("--seq-len", type=int_in(1, 1 << 16), default=128,
                   help="tokens per sequence (default: %(default)s)")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                   help="fp32, or bf16: forward and loss under torch.autocast('cpu', dtype=torch.bfloat16) "
                        "(default: %(default)s)")
    p.add_argument("--seed", type=int_in(0, 2147483647), default=1337,
                   help="torch.manual_seed before the weights are made (default: %(default)s, moe-train's)")
    a = p.parse_args()  # argparse prints the error and exits with status 2
    if a.warmup >= a.steps:
        p.error(f"--warmup {a.warmup} leaves no timed step of --steps {a.steps}")
    if a.batch * a.seq_len > 1 << 24:
        p.error("--batch * --seq-len over 16M tokens per step")
    return a


def load_tokens(path, vocab, seq_len):
    """The tokens of an llm.c file (256 int32 header: magic, version, count; then uint16 tokens) as int64;
    exits 1 with the reason when the file is not one."""
    def bad(why):
        sys.exit(f"bench_train_torch.py: {path}: {why}")
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        bad(f"cannot read: {e.strerror}")
    if len(raw) < 4 * HEADER_INTS:
        bad(f"truncated: {len(raw)} bytes, shorter than the {4 * HEADER_INTS}-byte header")
    header = np.frombuffer(raw, dtype="<i4", count=HEADER_INTS)
    if header[0] != TOKEN_MAGIC:
        bad(f"wrong magic {header[0]} (expected {TOKEN_MAGIC}): not an llm.c token file")
    if header[1] != TOKEN_VERSION:
        bad(f"unsupported version {header[1]} (expected {TOKEN_VERSION})")
    n = int(header[2])
    if n < 0 or len(raw) != 4 * HEADER_INTS + 2 * n:
        bad(f"the header announces {n} tokens but the file holds {len(raw) - 4 * HEADER_INTS} bytes of tokens")
    if n < seq_len + 1:
        bad(f"only {n} tokens, fewer than one sequence of {seq_len} + 1")
    tokens = np.frombuffer(raw, dtype="<u2", offset=4 * HEADER_INTS, count=n)
    if int(tokens.max()) >= vocab:
        i = int(np.argmax(tokens >= vocab))
        bad(f"token {int(tokens[i])} at position {i} is outside the vocabulary (size {vocab})")
    return torch.from_numpy(tokens.astype(np.int64))


def batch_of(tokens, step, batch, seq_len, offsets):
    """moe-train's batch of step `step` (from 1): windows (step-1)*batch + i, i < batch, of seq_len+1 tokens
    at multiples of seq_len, wrapping at the end -> (inputs, targets), int64 [batch, seq_len] each."""
    windows = (tokens.numel() - 1) // seq_len
    first = (torch.arange(batch) + (step - 1) * batch) % windows
    seqs = tokens[(first * seq_len).unsqueeze(1) + offsets]  # [batch, seq_len + 1]
    return seqs[:, :-1], seqs[:, 1:]


def build_model(a):
    m = MODEL
    kwargs = dict(vocab_size=m["vocab"], hidden_size=m["d_model"], intermediate_size=m["d_ff"],
                  num_hidden_layers=m["layers"], num_attention_heads=m["heads"], num_key_value_heads=m["kv_heads"],
                  max_position_embeddings=a.seq_len, rms_norm_eps=m["rms_norm_eps"], rope_theta=m["rope_theta"],
                  tie_word_embeddings=m["tie_embeddings"], sliding_window=None, attention_dropout=0.0,
                  hidden_act="silu", num_local_experts=m["experts"], num_experts_per_tok=m["top_k"],
                  output_router_logits=True, router_aux_loss_coef=m["aux_loss_coef"], router_jitter_noise=0.0,
                  use_cache=False, torch_dtype="float32")
    config = MixtralConfig(**kwargs)
    torch.manual_seed(a.seed)
    model = MixtralForCausalLM(config).float().train()
    return model


def param_groups(model):
    """AdamW's groups as moe-train's: weight decay on every tensor but the RMSNorm gains."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if name.endswith("norm.weight") else decay).append(p)
    return [{"params": decay, "weight_decay": ADAMW["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}]


def count_params(model, top_k, experts):
    """total, dense (everything outside the experts: embeddings, attention, norms, routers, LM head),
    expert, and active per token (dense + k/E of the experts), as moe-train prints them."""
    expert = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    total = sum(p.numel() for p in model.parameters())
    return {"total": total, "dense": total - expert, "expert": expert,
            "active": total - expert + expert * top_k // experts}


def main(a):
    torch.set_num_threads(a.threads)
    print(f"torch {torch.__version__}  transformers {transformers.__version__}  threads={torch.get_num_threads()} "
          f"(interop {torch.get_num_interop_threads()}, OPENBLAS_NUM_THREADS={os.environ['OPENBLAS_NUM_THREADS']})"
          f"  python {sys.version.split()[0]}  cpu_count={os.cpu_count()}")
    tokens = load_tokens(a.train_data, MODEL["vocab"], a.seq_len)
    model = build_model(a)
    attn = getattr(model.config, "_attn_implementation", "eager")  # transformers' choice: eager without sdpa
    params = count_params(model, MODEL["top_k"], MODEL["experts"])
    optimizer = torch.optim.AdamW(param_groups(model), lr=ADAMW["lr"], betas=ADAMW["betas"], eps=ADAMW["eps"])
    foreach = optimizer.defaults.get("foreach")  # None: torch's default, one tensor at a time on the CPU
    B, S, coef = a.batch, a.seq_len, MODEL["aux_loss_coef"]
    print(f"model: MixtralForCausalLM vocab={MODEL['vocab']} layers={MODEL['layers']} d={MODEL['d_model']} "
          f"heads={MODEL['heads']}/{MODEL['kv_heads']} d_ff={MODEL['d_ff']} E={MODEL['experts']} k={MODEL['top_k']} "
          f"seq_len={S} rope_theta={MODEL['rope_theta']:g} eps={MODEL['rms_norm_eps']:g} "
          f"tied={MODEL['tie_embeddings']} aux_coef={coef:g} attention={attn}")
    print(f"parameters: {params['dense']} dense + {params['expert']} expert = {params['total']} "
          f"({params['active']} active per token)")
    print(f"train: {a.train_data} ({tokens.numel()} tokens)  batch={B} x {S} = {B * S} tokens/step  "
          f"steps={a.steps} (warmup {a.warmup} untimed)  precision={a.precision}  seed={a.seed}")
    print(f"optimizer: AdamW lr={ADAMW['lr']:g} betas={ADAMW['betas']} eps={ADAMW['eps']:g} "
          f"weight_decay={ADAMW['weight_decay']:g} (not on norms) foreach={foreach}  clip={CLIP:g}  constant lr")

    offsets = torch.arange(S + 1)
    bf16 = a.precision == "bf16"
    times = {"step": [], "forward": [], "backward": [], "optimizer": []}
    first_loss = last_loss = None
    for step in range(1, a.steps + 1):
        t0 = time.perf_counter()
        inputs, targets = batch_of(tokens, step, B, S, offsets)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = model(input_ids=inputs, use_cache=False, output_router_logits=True, return_dict=True)
            ce = F.cross_entropy(out.logits.reshape(-1, out.logits.shape[-1]).float(), targets.reshape(-1))
            loss = ce + coef * out.aux_loss
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        t3 = time.perf_counter()
        timed = step > a.warmup
        if timed:
            for name, v in (("step", t3 - t0), ("forward", t1 - t0), ("backward", t2 - t1), ("optimizer", t3 - t2)):
                times[name].append(v * 1e3)
        last_loss = loss.item()
        first_loss = last_loss if first_loss is None else first_loss
        print(f"step {step:5d} | loss {last_loss:.4f} | ce {ce.item():.4f} | aux {out.aux_loss.item():.4f} | "
              f"norm {float(norm):.3f} | {(t3 - t0) * 1e3:7.1f} ms | {B * S / (t3 - t0):8.0f} tok/s"
              + ("" if timed else "  (warm-up, untimed)"), flush=True)

    med, best = statistics.median(times["step"]), min(times["step"])
    n = len(times["step"])
    print(f"step     : median {med:8.2f} ms  min {best:8.2f} ms  over {n} timed steps")
    for name in ("forward", "backward", "optimizer"):
        print(f"  {name:9s}: median {statistics.median(times[name]):8.2f} ms")
    print(f"tokens/s : median {B * S / med * 1e3:.0f}  best {B * S / best * 1e3:.0f}")
    rec = {"bench": "train_torch", "torch": torch.__version__, "transformers": transformers.__version__,
           "threads": torch.get_num_threads(), "openblas_threads": int(os.environ["OPENBLAS_NUM_THREADS"]),
           "model": "MixtralForCausalLM", "attention": attn,
           "vocab": MODEL["vocab"], "layers": MODEL["layers"], "d_model": MODEL["d_model"], "heads": MODEL["heads"],
           "kv_heads": MODEL["kv_heads"], "d_ff": MODEL["d_ff"], "experts": MODEL["experts"],
           "top_k": MODEL["top_k"], "rope_theta": MODEL["rope_theta"], "rms_norm_eps": MODEL["rms_norm_eps"],
           "tie_embeddings": MODEL["tie_embeddings"], "aux_loss_coef": coef, "batch": B, "seq_len": S,
           "tokens_per_step": B * S, "precision": a.precision, "steps": a.steps, "warmup": a.warmup,
           "timed_steps": n, "seed": a.seed, "train_data": a.train_data, "params": params,
           "optimizer": {"name": "AdamW", "lr": ADAMW["lr"], "betas": list(ADAMW["betas"]), "eps": ADAMW["eps"],
                         "weight_decay": ADAMW["weight_decay"], "foreach": foreach, "clip": CLIP},
           "loss_first": round(first_loss, 6), "loss_last": round(last_loss, 6)}
    for name, v in times.items():
        rec[f"{name}_ms"] = {"median": round(statistics.median(v), 4), "min": round(min(v), 4)}
    rec["tokens_per_s"] = {"median": round(B * S / med * 1e3, 1), "best": round(B * S / best * 1e3, 1)}
    print("json: " + json.dumps(rec, separators=(",", ":")))


if __name__ == "__main__":
    args = parse_args()  # before torch is loaded: --help and usage errors need none of it
    os.environ["OPENBLAS_NUM_THREADS"] = str(args.threads)  # read once, when torch loads OpenBLAS
    try:
        import numpy as np
        import torch
        import torch.nn.functional as F
        import transformers
        from transformers import MixtralConfig, MixtralForCausalLM
    except Exception as e:  # ImportError, or a transformers too old to have Mixtral
        print(f"SKIP: bench_train_torch.py needs torch, numpy and transformers with MixtralForCausalLM under "
              f"{sys.executable}: {e!r}")
        sys.exit(77)
    main(args)
