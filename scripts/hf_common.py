"""hf_common.py — what the checks against Hugging Face transformers share (scripts/hf_interop.py for Mixtral,
scripts/hf_families.py for Qwen3-MoE and OLMoE): token files, moe-train's sequences, running moe-train under mpirun."""
import os
import struct
import subprocess

import torch

MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1", "OMPI_MCA_btl_vader_single_copy_mechanism": "none",
           "OPENBLAS_NUM_THREADS": "1"}


def write_tokens(path, tokens):
    """llm.c token file: 256 little-endian int32 header (magic, version, count), then uint16 tokens."""
    header = [0] * 256
    header[0], header[1], header[2] = 20240520, 1, len(tokens)
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack(f"<{len(tokens)}H", *tokens))


def sequences(tokens, count, seq):
    """moe-train's sequences 0..count-1 of a token file (a step's batch, or the validation batches): windows of
    seq+1 tokens at multiples of seq, wrapping. (inputs, targets) as [count, seq] tensors."""
    windows = (len(tokens) - 1) // seq
    starts = [(i % windows) * seq for i in range(count)]
    inputs = torch.tensor([tokens[s:s + seq] for s in starts], dtype=torch.long)
    targets = torch.tensor([tokens[s + 1:s + seq + 1] for s in starts], dtype=torch.long)
    return inputs, targets


def run(cmd, what):
    """Runs a command; returns (ok, output). Output is echoed so the test log shows it, without the flag listing a
    successful training run prints."""
    print("$ " + " ".join(cmd), flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       env={**os.environ, **MPI_ENV})
    listing = lambda line: line == "configuration:\n" or line.startswith("  --")
    print("".join(l for l in p.stdout.splitlines(True) if not (p.returncode == 0 and listing(l))), end="", flush=True)
    if p.returncode != 0:
        print(f"FAIL: {what}: exit status {p.returncode}")
    return p.returncode == 0, p.stdout
