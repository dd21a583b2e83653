#!/usr/bin/python3
"""hf_families.py — the model families beside Mixtral (models/model.h: Qwen3-MoE, OLMoE, Qwen2-MoE) against Hugging Face
transformers, both ways, on small random models (vocab 256, d 64, 2 layers, 4 heads / 2 kv heads, 8 experts, top-4).

For each family:
  A. HF -> ours: a random Qwen3MoeForCausalLM / OlmoeForCausalLM / Qwen2MoeForCausalLM (the q/k norms' weights and
     Qwen2-MoE's biases randomised too; Qwen3's head_dim 24, not d / heads; Qwen2-MoE's gated shared expert) saved with save_pretrained (safetensors, float32) loads in moe-train with --init-from
     and no shape flags, and gives transformers' logits on validation sequence 0 and its eval loss.
  B. Gradients: moe-train trains one step from that directory with AdamW at lr 10 and eps 10, no weight decay, no
     clipping, no aux or z loss; step 1 of AdamW moves each weight by u = lr g / (|g| + eps) exactly, so the saved
     weights give every gradient back, g = u eps / (lr - |u|), which must equal transformers' (loss.backward() of the
     mean cross-entropy over the same batch).
  C. ours -> HF: moe-train trains 10 steps of the family from scratch and saves; transformers loads the directory
     (AutoModelForCausalLM) and gives moe-train --eval-only's logits and loss.
Qwen3-MoE runs twice: top-4 renormalised (norm_topk_prob) and a model with a dense layer between MoE layers
(decoder_sparse_step 2, the dense layer's intermediate_size 80 beside the experts' 48); OLMoE runs top-4 without renormalisation; Qwen2-MoE top-4 without, both ways.
DeepSeek-V3: multi-head latent attention with a q latent (kv_lora_rank 16, q_lora_rank 24, qk_nope 16 + rope 8, v 12),
RoPE's rows interleaved as DeepSeek's checkpoints have them (moe-train reorders them on load; its own files say
rope_interleave false), sigmoid scores with a random e_score_correction_bias, 4 groups of which 2 are chosen, routed
scaling 2.5, 2 shared experts, the first layer dense; ours -> HF with 3 layers after 10 steps that moved the biases.
YaRN (rope_parameters of rope_type yarn): DeepSeek-V3 with the released model's factor 40 over 4096 positions, but
mscale 1 and mscale_all_dim 0.8 (cos/sin times m(40, 1) / m(40, 0.8), MLA's softmax scale times m(40, 0.8)^2; the
released 1 and 1 would leave the first at 1), and Qwen3-MoE with factor 4 over 64 positions (its correction range
[0, 3] inside head_dim 24; cos/sin times m(4, 1)), each A and B, and C with moe-train's --yarn-* flags.
FP8 (DeepSeek-V3's released format): the random DeepSeek-V3's saved projections quantized by torch (float8_e4m3fn,
a float32 scale per 16 x 8 block, amax / 448, partial blocks at the edges) with quantization_config; moe-train
--init-from those files gives the logits transformers gives from the F32 weights they mean (torch's dequantization).
Tolerances (fp32 on both sides): logits max|diff| <= 1e-4 max|logit| + 1e-5; loss relative difference <= 1e-5;
gradients max|diff| <= 2e-3 max|g| + 1e-6 per tensor (the recovery divides the update's fp32 rounding by lr).

Needs transformers >= 4.51 (Qwen3-MoE), which needs torch >= 2: scripts/hf_env.sh makes that environment.
Run: scripts/hf_env.sh --python scripts/hf_families.py --moe-train build/moe-train --mpirun mpirun --workdir /tmp/f
or the meson test: meson test -C build --suite families
Exit: 0 all comparisons pass, 1 one fails, 77 transformers with these families is not importable.
"""
import argparse
import json
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
    from transformers import (AutoModelForCausalLM, DeepseekV2Config, DeepseekV3Config, OlmoeConfig, Qwen2MoeConfig,
                              Qwen3MoeConfig)
    from safetensors.torch import load_file, save_file
    from hf_common import run, sequences, write_tokens
except Exception as e:  # ImportError, or a transformers without these families
    print(f"SKIP: transformers with Qwen3-MoE, OLMoE and Qwen2-MoE is not importable under {sys.executable}: {e!r}")
    sys.exit(77)

VOCAB, SEQ, BATCH, EVAL_BATCHES = 256, 32, 4, 2
SHAPE = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             num_experts=8, num_experts_per_tok=4, tie_word_embeddings=False, max_position_embeddings=SEQ)
LOGIT_RTOL, LOGIT_ATOL, LOSS_RTOL, GRAD_RTOL, GRAD_ATOL = 1e-4, 1e-5, 1e-5, 2e-3, 1e-6
LR, EPS = 10.0, 10.0
def ours_eval(args, data, init_from, dump):
    """moe-train --eval-only on 2 ranks (the architecture from init_from's config.json): (loss, logits [S, V])."""
    ok, out = run([args.mpirun, "-np", "2", args.moe_train, "--seq-len", str(SEQ), "--batch", str(BATCH), *data,
                   "--init-from", init_from, "--eval-only", "1", "--eval-batches", str(EVAL_BATCHES),
                   "--dump-logits", dump], f"moe-train --eval-only --init-from {init_from}")
    m = re.search(r"eval: val_loss ([0-9.eE+-]+) over (\d+) tokens", out)
    if not ok or not m:
        return None, None
    logits = torch.tensor(struct.unpack(f"<{SEQ * VOCAB}f", open(dump, "rb").read())).view(SEQ, VOCAB).double()
    return float(m.group(1)), logits


def hf_eval(model, inputs, targets):
    with torch.no_grad():
        logits = model(input_ids=inputs).logits.double()
    return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1)).item(), logits


def compare_eval(name, args, data, val, directory, model, results):
    inputs, targets = sequences(val, EVAL_BATCHES * BATCH, SEQ)
    hf_loss, hf_logits = hf_eval(model, inputs, targets)
    loss, logits = ours_eval(args, data, directory, os.path.join(args.workdir, "logits.bin"))
    if loss is None:
        results.append((f"{name}: moe-train --eval-only", False))
        return
    diff, scale = (logits - hf_logits[0]).abs().max().item(), hf_logits[0].abs().max().item()
    rel = abs(loss - hf_loss) / abs(hf_loss)
    print(f"{name}: logits max|diff| {diff:.3e} (max|logit| {scale:.3f}); loss moe-train {loss:.9f} transformers "
          f"{hf_loss:.9f} rel {rel:.2e}")
    results.append((f"{name}: logits", diff <= LOGIT_RTOL * scale + LOGIT_ATOL))
    results.append((f"{name}: loss", rel <= LOSS_RTOL))


YARN = {"deepseek_v3": dict(rope_type="yarn", rope_theta=1e4, factor=40.0, original_max_position_embeddings=4096,
                             beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=0.8),
        "deepseek_v2": dict(rope_type="yarn", rope_theta=1e4, factor=40.0, original_max_position_embeddings=4096,
                            beta_fast=32.0, beta_slow=1.0, mscale=0.707, mscale_all_dim=0.707),  # V2-Lite's
        "qwen3_moe": dict(rope_type="yarn", rope_theta=1e6, factor=4.0, original_max_position_embeddings=64)}


def family_config(family, dense_every=1, yarn=False):
    config = family_config_plain(family, dense_every)
    if yarn:  # the context YaRN extends to, as released configs have it (transformers warns otherwise)
        config.rope_parameters = dict(YARN[family])
        config.max_position_embeddings = int(YARN[family]["factor"] * YARN[family]["original_max_position_embeddings"])
    return config


def family_config_plain(family, dense_every):
    if family.startswith("deepseek_v2"):  # V2-Lite's form: q_proj, softmax greedy top-k, routed scaling; "_groups":
        # the full V2's: a q latent, group_limited_greedy (by each group's best)
        groups = family == "deepseek_v2_groups"
        shape = {**SHAPE, "num_key_value_heads": SHAPE["num_attention_heads"]}
        del shape["num_experts"]
        return DeepseekV2Config(**shape, n_routed_experts=8, moe_intermediate_size=48, intermediate_size=80,
                                n_shared_experts=2, routed_scaling_factor=16.0 if groups else 1.5,
                                first_k_dense_replace=1, topk_method="group_limited_greedy" if groups else "greedy",
                                n_group=4 if groups else None, topk_group=2 if groups else None, kv_lora_rank=16,
                                q_lora_rank=24 if groups else None, qk_rope_head_dim=8, qk_nope_head_dim=16,
                                v_head_dim=12, rope_theta=1e4, rms_norm_eps=1e-6, pad_token_id=None,
                                bos_token_id=None, eos_token_id=None)
    if family == "deepseek_v3":  # MLA with a q latent, 2 shared experts, 4 groups of 2 choose 2, the first layer dense
        shape = {**SHAPE, "num_key_value_heads": SHAPE["num_attention_heads"]}
        del shape["num_experts"]
        return DeepseekV3Config(**shape, n_routed_experts=8, moe_intermediate_size=48, intermediate_size=80,
                                n_shared_experts=2, n_group=4, topk_group=2, routed_scaling_factor=2.5,
                                first_k_dense_replace=1, norm_topk_prob=True, kv_lora_rank=16, q_lora_rank=24,
                                qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=12, rope_interleave=True,
                                num_mtp_layers=0, rope_theta=1e4, rms_norm_eps=1e-6, pad_token_id=None,
                                bos_token_id=None, eos_token_id=None)
    if family == "qwen2_moe":
        return Qwen2MoeConfig(**SHAPE, moe_intermediate_size=48, intermediate_size=80, shared_expert_intermediate_size=40,
                              norm_topk_prob=False, decoder_sparse_step=dense_every, rope_theta=1e4, rms_norm_eps=1e-6)
    if family == "qwen3_moe":
        return Qwen3MoeConfig(**SHAPE, head_dim=24, moe_intermediate_size=48, intermediate_size=80,
                              norm_topk_prob=True, decoder_sparse_step=dense_every, rope_theta=1e6, rms_norm_eps=1e-6)
    return OlmoeConfig(**SHAPE, intermediate_size=48, norm_topk_prob=False, rope_theta=1e4, rms_norm_eps=1e-5,
                       pad_token_id=None, bos_token_id=None, eos_token_id=None)


def random_model(family, dense_every=1, yarn=False, seed=1234):
    torch.manual_seed(seed)
    config = family_config(family, dense_every, yarn)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").float()
    if yarn:  # the rotary embedding took YaRN's frequencies (and where its mscales differ, its amplitude)
        rotary = model.model.rotary_emb
        assert rotary.rope_type == "yarn", rotary.rope_type
        assert family == "deepseek_v2" or rotary.attention_scaling != 1.0, rotary.attention_scaling
    with torch.no_grad():  # norms away from 1 and biases from 0 (as transformers starts them a wrong one would go unseen)
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.3 * torch.randn_like(p))
            if name.endswith(".bias"):
                p.copy_(0.3 * torch.randn_like(p))
        for name, b in model.named_buffers():  # DeepSeek's selection bias: enough to change some choices
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.1 * torch.randn_like(b))
    return model.eval()


def rope_rows_deinterleaved(config, name, value):
    """value with DeepSeek's interleaved RoPE rows (q's per head, k's in kv_a_proj_with_mqa) in rotate-half's order,
    as moe-train holds and saves them (its config.json says rope_interleave false)."""
    if not getattr(config, "rope_interleave", False):
        return value
    rope = config.qk_rope_head_dim
    if name.endswith(("self_attn.q_b_proj.weight", "self_attn.q_proj.weight")):
        blocks, first = config.num_attention_heads, config.qk_nope_head_dim
    elif name.endswith("self_attn.kv_a_proj_with_mqa.weight"):
        blocks, first = 1, config.kv_lora_rank
    else:
        return value
    v = value.clone().view(blocks, first + rope, -1)
    v[:, first:] = torch.cat([value.view(blocks, first + rope, -1)[:, first::2],
                              value.view(blocks, first + rope, -1)[:, first + 1::2]], dim=1)
    return v.view(value.shape)


def per_expert_gradients(model, directory):
    """{saved name: gradient} of every parameter, in the names save_pretrained wrote into directory (transformers 5
    holds the experts fused, [E, 2F, d] and [E, d, F]; checked against the saved tensors)."""
    saved = load_file(os.path.join(directory, "model.safetensors"))
    out = {}
    for name, p in model.named_parameters():
        if name in saved:
            assert torch.equal(saved[name], p.detach()), f"{name}: saved tensor differs from the parameter"
            out[name] = p.grad.detach().clone()
            continue
        m = re.fullmatch(r"(.*\.mlp\.experts)\.(gate_up_proj|down_proj)", name)
        assert m, f"{name}: not among the saved tensors and not a fused expert tensor"
        for e in range(p.shape[0]):
            prefix = f"{m.group(1)}.{e}."
            if m.group(2) == "down_proj":
                parts = {"down_proj.weight": (p[e], p.grad[e])}
            else:
                half = p.shape[1] // 2
                parts = {"gate_proj.weight": (p[e, :half], p.grad[e, :half]),
                         "up_proj.weight": (p[e, half:], p.grad[e, half:])}
            for suffix, (value, grad) in parts.items():
                assert torch.equal(saved[prefix + suffix], value.detach()), f"{prefix + suffix}: fused layout differs"
                out[prefix + suffix] = grad.detach().clone()
    buffers = {k for k in saved if k.endswith("e_score_correction_bias")}  # not parameters: no gradient
    assert set(out) == set(saved) - buffers, sorted((set(saved) - buffers) ^ set(out))
    for k in buffers:
        del saved[k]
    return ({k: rope_rows_deinterleaved(model.config, k, g) for k, g in out.items()},
            {k: rope_rows_deinterleaved(model.config, k, v) for k, v in saved.items()})


def gradient_check(name, args, data, train, directory, model, results):
    inputs, targets = sequences(train, BATCH, SEQ)
    model.zero_grad()
    logits = model(input_ids=inputs).logits
    F.cross_entropy(logits.reshape(-1, VOCAB).float(), targets.reshape(-1)).backward()
    hf, before = per_expert_gradients(model, directory)
    ckpt = os.path.join(args.workdir, "grad-ckpt")
    shutil.rmtree(ckpt, ignore_errors=True)
    ok, _ = run([args.mpirun, "-np", "2", args.moe_train, "--seq-len", str(SEQ), "--batch", str(BATCH), *data,
                 "--init-from", directory, "--steps", "1", "--lr", str(LR), "--min-lr", str(LR), "--warmup", "0",
                 "--adam-eps", str(EPS), "--weight-decay", "0", "--clip", "0", "--aux-loss-coef", "0",
                 "--z-loss-coef", "0", "--eval-interval", "0", "--eval-batches", "1", "--sample-tokens", "0",
                 "--checkpoint-dir", ckpt], f"{name}: moe-train one step")
    if not ok:
        results.append((f"{name}: gradients (moe-train's step)", False))
        return
    after = load_file(os.path.join(ckpt, "step-00000001", "model.safetensors"))
    worst, passed = ("", 0.0), True
    for key, g in hf.items():
        u = (before[key].double() - after[key].double())
        ours = u * EPS / (LR - u.abs())
        diff, scale = (ours - g.double()).abs().max().item(), g.abs().max().item()
        if diff > GRAD_RTOL * scale + GRAD_ATOL:
            passed = False
            print(f"  {key}: max|diff| {diff:.3e} over max|g| {scale:.3e}")
        if scale > 0 and diff / scale > worst[1]:
            worst = (key, diff / scale)
    print(f"{name}: gradients of {len(hf)} tensors, worst max|diff| / max|g| {worst[1]:.2e} ({worst[0]})")
    results.append((f"{name}: gradients", passed))


def ours_to_hf(name, args, data, val, flags, results):
    ckpt = os.path.join(args.workdir, "ours-ckpt")
    shutil.rmtree(ckpt, ignore_errors=True)
    ok, _ = run([args.mpirun, "-np", "2", args.moe_train, *flags, "--vocab", str(VOCAB), "--seq-len", str(SEQ),
                 "--batch", str(BATCH), *data, "--steps", "10", "--warmup", "2", "--eval-interval", "0",
                 "--eval-batches", "1", "--sample-tokens", "0", "--checkpoint-dir", ckpt], f"{name}: moe-train run")
    if not ok:
        results.append((f"{name}: moe-train run", False))
        return
    directory = os.path.join(ckpt, "step-00000010")
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, attn_implementation="eager").eval()
    print(f"{name}: transformers loaded {type(model).__name__}")
    want = {"qwen3_moe": "Qwen3MoeForCausalLM", "olmoe": "OlmoeForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM",
            "deepseek_v3": "DeepseekV3ForCausalLM", "deepseek_v2": "DeepseekV2ForCausalLM"}
    results.append((f"{name}: transformers loads it", type(model).__name__ == want[flags[1]]))
    compare_eval(name, args, data, val, directory, model, results)


def fp8_check(args, data, val, results):
    """FP8 block-scaled weights (checkpoint/fp8.h) against torch's float8_e4m3fn and transformers."""
    model = random_model("deepseek_v3")
    f32_dir, fp8_dir, ref_dir = (os.path.join(args.workdir, f"fp8-{k}") for k in ("f32", "fp8", "ref"))
    model.save_pretrained(f32_dir, safe_serialization=True)
    saved = load_file(os.path.join(f32_dir, "model.safetensors"))
    b0, b1 = 16, 8
    quantized, meant = {}, {}
    for name, w in saved.items():
        if not (name.endswith("_proj.weight") and w.dim() == 2):
            quantized[name] = meant[name] = w
            continue
        rows, cols = w.shape
        grid = (-(-rows // b0), -(-cols // b1))
        padded = torch.zeros(grid[0] * b0, grid[1] * b1, dtype=torch.float32)
        padded[:rows, :cols] = w
        blocks = padded.view(grid[0], b0, grid[1], b1)
        scale = (blocks.abs().amax(dim=(1, 3)) / 448.0).float()
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        full = scale.repeat_interleave(b0, 0).repeat_interleave(b1, 1)[:rows, :cols]
        q = (w / full).clamp(-448, 448).to(torch.float8_e4m3fn)
        quantized[name], quantized[name + "_scale_inv"] = q, scale
        meant[name] = q.float() * full  # one float32 rounding of an exact product
    for d, tensors in ((fp8_dir, quantized), (ref_dir, meant)):
        os.makedirs(d, exist_ok=True)
        save_file(tensors, os.path.join(d, "model.safetensors"))
        config = json.load(open(os.path.join(f32_dir, "config.json")))
        if d == fp8_dir:
            config["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                             "weight_block_size": [b0, b1]}
        json.dump(config, open(os.path.join(d, "config.json"), "w"), indent=1)
    reference = AutoModelForCausalLM.from_pretrained(ref_dir, dtype=torch.float32, attn_implementation="eager").eval()
    changed = any(not torch.equal(meant[k], saved[k]) for k in saved)
    results.append(("FP8: the quantization changed the weights", changed))
    compare_eval("FP8 deepseek_v3 (block scales 16 x 8)", args, data, val, fp8_dir, reference, results)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--moe-train", required=True)
    ap.add_argument("--mpirun", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    rng = random.Random(5)
    train = [rng.randrange(VOCAB) for _ in range(40 * SEQ + 1)]
    val = [rng.randrange(VOCAB) for _ in range(EVAL_BATCHES * BATCH * SEQ + 1)]
    write_tokens(os.path.join(args.workdir, "train.bin"), train)
    write_tokens(os.path.join(args.workdir, "val.bin"), val)
    data = ["--train-data", os.path.join(args.workdir, "train.bin"), "--val-data", os.path.join(args.workdir, "val.bin")]
    results = []
    for family, dense_every, yarn in (("qwen3_moe", 1, 0), ("qwen3_moe", 2, 0), ("olmoe", 1, 0), ("qwen2_moe", 1, 0),
                                      ("qwen2_moe", 2, 0), ("deepseek_v3", 1, 0), ("deepseek_v3", 1, 1),
                                      ("qwen3_moe", 1, 1), ("deepseek_v2", 1, 1), ("deepseek_v2_groups", 1, 0)):
        name = f"{family}" + (f" (decoder_sparse_step {dense_every})" if dense_every > 1 else "") + \
            (" with YaRN" if yarn else "")
        print(f"== {name}: transformers -> moe-train, gradients ==")
        model = random_model(family, dense_every, yarn)
        directory = os.path.join(args.workdir, f"hf-{family}-{dense_every}-{yarn}")
        model.save_pretrained(directory, safe_serialization=True)
        compare_eval(f"A {name}", args, data, val, directory, model, results)
        gradient_check(f"B {name}", args, data, train, directory, model, results)
    shape = ["--layers", "2", "--d-model", "64", "--heads", "4", "--kv-heads", "2", "--d-ff", "48", "--experts", "8",
             "--top-k", "4"]
    print("== moe-train -> transformers ==")
    ours_to_hf("C qwen3_moe", args, data, val, ["--family", "qwen3_moe", "--head-dim", "24", "--renormalize", "1",
                                                 *shape], results)
    ours_to_hf("C olmoe", args, data, val, ["--family", "olmoe", "--renormalize", "0", *shape], results)
    ours_to_hf("C qwen2_moe", args, data, val, ["--family", "qwen2_moe", "--shared-d-ff", "40", "--renormalize", "0",
                                                 *shape], results)
    deepseek = ["--family", "deepseek_v3", "--layers", "3", "--d-model", "64", "--heads", "4", "--kv-heads", "4",
                "--d-ff", "48", "--experts", "8", "--top-k", "4", "--score", "sigmoid", "--renormalize", "1",
                "--expert-groups", "4", "--topk-groups", "2", "--routed-scaling", "2.5", "--first-dense-layers", "1",
                "--dense-d-ff", "80", "--shared-d-ff", "96", "--kv-lora-rank", "16", "--q-lora-rank", "24",
                "--head-dim", "24", "--qk-rope-dim", "8", "--v-head-dim", "12", "--norm-eps", "1e-6",
                "--bias-update-rate", "0.01"]
    ours_to_hf("C deepseek_v3", args, data, val, deepseek, results)
    ours_to_hf("C deepseek_v3 with YaRN", args, data, val,
               deepseek + ["--yarn-factor", "40", "--yarn-original-positions", "4096", "--yarn-mscale", "1",
                           "--yarn-mscale-all-dim", "0.8"], results)
    ours_to_hf("C deepseek_v2 (V2-Lite's form) with YaRN", args, data, val,
               ["--family", "deepseek_v2", "--layers", "3", "--d-model", "64", "--heads", "4", "--kv-heads", "4",
                "--d-ff", "48", "--experts", "8", "--top-k", "4", "--score", "softmax", "--renormalize", "0",
                "--routed-scaling", "1.5", "--first-dense-layers", "1", "--dense-d-ff", "80", "--shared-d-ff", "96",
                "--kv-lora-rank", "16", "--head-dim", "24", "--qk-rope-dim", "8", "--v-head-dim", "12",
                "--norm-eps", "1e-6", "--yarn-factor", "40", "--yarn-original-positions", "4096", "--yarn-mscale",
                "0.707", "--yarn-mscale-all-dim", "0.707"], results)
    ours_to_hf("C deepseek_v2 (the full V2's form: group_limited_greedy)", args, data, val,
               ["--family", "deepseek_v2", "--layers", "3", "--d-model", "64", "--heads", "4", "--kv-heads", "4",
                "--d-ff", "48", "--experts", "8", "--top-k", "4", "--score", "softmax", "--renormalize", "0",
                "--expert-groups", "4", "--topk-groups", "2", "--routed-scaling", "16", "--first-dense-layers", "1",
                "--dense-d-ff", "80", "--shared-d-ff", "96", "--kv-lora-rank", "16", "--q-lora-rank", "24",
                "--head-dim", "24", "--qk-rope-dim", "8", "--v-head-dim", "12"], results)
    ours_to_hf("C qwen3_moe with YaRN", args, data, val,
               ["--family", "qwen3_moe", "--head-dim", "24", "--renormalize", "1", "--rope-theta", "1e6",
                "--yarn-factor", "4", "--yarn-original-positions", "64", *shape], results)
    print("== FP8 ==")
    fp8_check(args, data, val, results)
    failed = [n for n, ok in results if not ok]
    print(f"{len(results) - len(failed)} of {len(results)} comparisons pass" + (f"; failed: {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
