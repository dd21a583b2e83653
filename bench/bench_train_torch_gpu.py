#!/usr/bin/env python3
"""bench_train_torch_gpu.py — the PyTorch peer of bench/bench_train_gpu.sh on the same GPU: Hugging Face transformers'
MixtralForCausalLM of the model moe-train trains there, trained the way a PyTorch user would train it fast.

The model from moe-train's flags (the same words: --layers --d-model --heads --kv-heads --d-ff --experts --top-k
--vocab --seq-len), untied embeddings, RoPE theta 10000, RMSNorm eps 1e-5, router aux-loss coefficient 0.01 (trained,
output_router_logits); transformers' own initialisation after torch.manual_seed(--seed). Training as moe-train's step
with --batch sequences in --micro-batches micro-batches: fp32 master weights, the forward and the loss under
torch.autocast(bfloat16) (every GEMM in bf16, as moe-train's bf16 precision), attention by SDPA
(attn_implementation="sdpa": FlashAttention-2 or cuDNN kernels inside PyTorch), activation checkpointing of every
decoder layer with --recompute full (transformers' gradient_checkpointing_enable), the global gradient norm clipped
to 1.0, torch.optim.AdamW(fused=True) with moe-train's betas (0.9, 0.95), eps 1e-8 and weight decay 0.1 (not on the
norms), --lr constant. The batches are moe-train's: windows of seq_len + 1 tokens at multiples of seq_len of the llm.c
token file (uint16), in order.

Timing: torch.cuda.synchronize() around each optimizer step (data copy, forward, backward, clip, AdamW, zero_grad),
the first --warmup steps untimed; tokens/s = batch * seq_len / the median step. Prints each step, then tokens/s,
and one line "json: {...}" (bench_train_gpu.sh --torch reads it). Exit 77 without a GPU or without transformers.

    python3 bench/bench_train_torch_gpu.py --train-data data/kjv_train.bin [--layers 16 --d-model 1024 --heads 16
        --kv-heads 8 --d-ff 2816 --experts 8 --top-k 2 --vocab 32000 --seq-len 1024 --batch 8 --micro-batches 2
        --lr 3e-4 --recompute none --steps 30 --warmup 10 --seed 1337]
"""
import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the model is built from a config: nothing to download
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

TOKEN_MAGIC, HEADER_INTS = 20240520, 256


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--train-data", required=True, help="llm.c token file (uint16 tokens)")
    for flag, default in (("--layers", 16), ("--d-model", 1024), ("--heads", 16), ("--kv-heads", 8),
                          ("--d-ff", 2816), ("--experts", 8), ("--top-k", 2), ("--vocab", 32000),
                          ("--seq-len", 1024), ("--batch", 8), ("--micro-batches", 2), ("--steps", 30),
                          ("--warmup", 10), ("--seed", 1337)):
        p.add_argument(flag, type=int, default=default, help=f"as moe-train's (default {default})")
    p.add_argument("--lr", type=float, default=3e-4, help="constant learning rate (default 3e-4)")
    p.add_argument("--recompute", choices=("none", "full"), default="none",
                   help="full: checkpoint every decoder layer (moe-train --recompute full)")
    a = p.parse_args()
    if a.batch % a.micro_batches:
        p.error("--micro-batches must divide --batch")
    if a.warmup >= a.steps:
        p.error("--warmup leaves no timed step")
    return a


def load_tokens(torch, path, vocab, seq_len):
    with open(path, "rb") as f:
        raw = f.read()
    header = torch.frombuffer(bytearray(raw[:4 * HEADER_INTS]), dtype=torch.int32)
    if int(header[0]) != TOKEN_MAGIC:
        sys.exit(f"bench_train_torch_gpu: {path}: not an llm.c token file (magic {int(header[0])})")
    n = int(header[2])
    tokens = torch.frombuffer(bytearray(raw[4 * HEADER_INTS:4 * HEADER_INTS + 2 * n]), dtype=torch.int16)
    tokens = tokens.to(torch.int64) & 0xFFFF
    if n < seq_len + 1 or int(tokens.max()) >= vocab:
        sys.exit(f"bench_train_torch_gpu: {path}: fewer than seq_len + 1 tokens, or a token past --vocab {vocab}")
    return tokens


def main():
    a = parse_args()
    try:
        import torch
        import torch.nn.functional as F
        import transformers
        from transformers import MixtralConfig, MixtralForCausalLM
    except ImportError as e:
        print(f"bench_train_torch_gpu: not run: {e}")
        sys.exit(77)
    if not torch.cuda.is_available():
        print("bench_train_torch_gpu: no CUDA device; nothing to measure")
        sys.exit(77)
    tokens = load_tokens(torch, a.train_data, a.vocab, a.seq_len)
    config = MixtralConfig(vocab_size=a.vocab, hidden_size=a.d_model, intermediate_size=a.d_ff,
                           num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
                           max_position_embeddings=a.seq_len, rms_norm_eps=1e-5, rope_theta=10000.0,
                           tie_word_embeddings=False, sliding_window=None, attention_dropout=0.0,
                           num_local_experts=a.experts, num_experts_per_tok=a.top_k, output_router_logits=True,
                           router_aux_loss_coef=0.01, router_jitter_noise=0.0, use_cache=False)
    config._attn_implementation = "sdpa"
    torch.manual_seed(a.seed)
    with torch.device("cuda"):
        model = MixtralForCausalLM(config).float().train()
    if a.recompute == "full":
        model.gradient_checkpointing_enable()
    decay = [p for n, p in model.named_parameters() if not n.endswith("norm.weight")]
    no_decay = [p for n, p in model.named_parameters() if n.endswith("norm.weight")]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    expert = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    total = sum(p.numel() for p in model.parameters())
    active = total - expert + expert * a.top_k // a.experts
    print(f"GPU: {torch.cuda.get_device_name(0)}; torch {torch.__version__}, transformers {transformers.__version__}")
    print(f"model: MixtralForCausalLM layers {a.layers} d {a.d_model} heads {a.heads}/{a.kv_heads} d_ff {a.d_ff} "
          f"E {a.experts} k {a.top_k} vocab {a.vocab} S {a.seq_len}; {total / 1e9:.3f}B parameters, "
          f"{active / 1e9:.3f}B active; attention {model.config._attn_implementation}; recompute {a.recompute}")
    micro = a.batch // a.micro_batches
    windows = (tokens.numel() - 1) // a.seq_len
    offsets = torch.arange(a.seq_len + 1)
    times, step_tokens = [], a.batch * a.seq_len
    for step in range(1, a.steps + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for mb in range(a.micro_batches):
            first = ((step - 1) * a.batch + mb * micro + torch.arange(micro)) % windows
            seqs = tokens[(first * a.seq_len).unsqueeze(1) + offsets].cuda(non_blocking=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = model(input_ids=seqs[:, :-1], use_cache=False, output_router_logits=True, return_dict=True)
                ce = F.cross_entropy(out.logits.reshape(-1, out.logits.shape[-1]).float(), seqs[:, 1:].reshape(-1))
                loss = (ce + 0.01 * out.aux_loss) / a.micro_batches
            loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        if step > a.warmup:
            times.append(dt)
        print(f"step {step:4d} | loss {loss.item() * a.micro_batches:.4f} | norm {float(norm):.3f} | "
              f"{dt * 1e3:8.1f} ms | {step_tokens / dt:8.0f} tok/s" + ("" if step > a.warmup else "  (untimed)"),
              flush=True)
    med = statistics.median(times)
    peak_gib = torch.cuda.max_memory_allocated() / 2**30
    print(f"tokens/s median {step_tokens / med:.0f} (steps {a.warmup + 1}-{a.steps}); peak memory {peak_gib:.1f} GiB")
    print("json: " + json.dumps({"bench": "train_torch_gpu", "gpu": torch.cuda.get_device_name(0),
                                 "torch": torch.__version__, "transformers": transformers.__version__,
                                 "layers": a.layers, "d_model": a.d_model, "seq_len": a.seq_len,
                                 "batch": a.batch, "micro_batches": a.micro_batches, "recompute": a.recompute,
                                 "params_total": total, "params_active": active, "tokens_per_s": step_tokens / med,
                                 "step_ms": med * 1e3, "peak_gib": peak_gib}))


if __name__ == "__main__":
    main()
