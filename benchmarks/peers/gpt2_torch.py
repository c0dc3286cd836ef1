#!/usr/bin/python3
"""A self-contained PyTorch GPT-2, the reference zshard is checked and timed against.

Why it exists: zshard claims to train GPT-2 exactly as PyTorch / Hugging Face do. Hugging Face
transformers is not a dependency, so the model is written here in plain torch, with the Hugging Face
parameter names and the Conv1D (in, out) weight layouts, so its state dict is a file zshard loads
with --init-from.

Modes:
  parity  trains a small GPT-2 for a few AdamW steps in float32 on one CPU thread, trains zshard-train
          from the same weights and tokens with the same hyperparameters, and compares the per-step
          losses (exit 0 when every step agrees within --rtol, else 1).
  bench   times one training step (forward + backward + AdamW) on one CPU thread and prints JSON:
          wall-clock and process CPU time per step (the latter is less disturbed by other load).

Run it with the system interpreter (/usr/bin/python3), which is the one with torch installed.
"""

import argparse
import json
import math
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F
from torch import nn

# Named configs, as in models/gpt2_config.cpp: (layers, dim, heads, vocab, ctx).
CONFIGS = {
    "tiny": (2, 64, 4, 256, 128),
    "gpt2": (12, 768, 12, 50257, 1024),
    "gpt2-medium": (24, 1024, 16, 50257, 1024),
    "gpt2-large": (36, 1280, 20, 50257, 1024),
    "gpt2-xl": (48, 1600, 25, 50257, 1024),
}

LLMC_MAGIC = 20240520
LLMC_VERSION = 1
LLMC_HEADER_INTS = 256


class Conv1D(nn.Module):
    """Hugging Face's Conv1D: a linear layer whose weight is stored (in, out)."""

    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_in, n_out))
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x):
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(*x.shape[:-1], -1)


class Attention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.c_attn = Conv1D(dim, 3 * dim)
        self.c_proj = Conv1D(dim, dim)

    def forward(self, x):
        B, T, C = x.shape
        hd = C // self.heads
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, hd).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
        y = F.softmax(scores, dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.c_fc = Conv1D(dim, 4 * dim)
        self.c_proj = Conv1D(4 * dim, dim)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim, eps=1e-5)
        self.attn = Attention(dim, heads)
        self.ln_2 = nn.LayerNorm(dim, eps=1e-5)
        self.mlp = MLP(dim)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    """GPT-2 (pre-LN, tanh GELU, LayerNorm eps 1e-5, LM head tied to wte); state-dict names are the
    Hugging Face GPT2Model ones (wte.weight, h.0.attn.c_attn.weight, ...)."""

    def __init__(self, layers, dim, heads, vocab, ctx):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(ctx, dim)
        self.h = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim, eps=1e-5)

    def init_weights(self, seed):
        """Hugging Face init: matrices and embeddings N(0, 0.02), residual projections (c_proj weights)
        N(0, 0.02/sqrt(2*layers)), biases 0, LayerNorm gains 1."""
        gen = torch.Generator().manual_seed(seed)
        proj_std = 0.02 / math.sqrt(2 * len(self.h))
        with torch.no_grad():
            for name, p in self.named_parameters():
                if p.dim() == 2:
                    std = proj_std if name.endswith("c_proj.weight") else 0.02
                    p.normal_(0.0, std, generator=gen)
                elif name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name == "ln_f.weight":
                    p.fill_(1.0)
                else:
                    p.zero_()

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for block in self.h:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def model_from_args(args):
    """The --model config with any --layers/--dim/--heads/--vocab/--ctx override; returns (model, dims)."""
    dims = list(CONFIGS[args.model])
    for i, override in enumerate((args.layers, args.dim, args.heads, args.vocab, args.ctx)):
        if override:
            dims[i] = override
    model = GPT2(*dims)
    model.init_weights(args.seed)
    return model, dims


def make_optimizer(model, lr, wd, beta1, beta2, eps):
    """torch AdamW with zshard's grouping: weight decay on 2-D tensors (matrices, embeddings) only."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(beta1, beta2), eps=eps)


def write_safetensors(path, tensors):
    """Writes float32 tensors as safetensors: 8-byte LE header length, JSON header, raw data."""
    header, offset, blobs = {}, 0, []
    for name, t in tensors.items():
        data = t.detach().to(torch.float32).contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    header["__metadata__"] = {"format": "pt"}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # data starts 8-byte aligned, as the reference writer does
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for blob in blobs:
            f.write(blob)


def write_llmc_tokens(path, tokens):
    """Writes an llm.c token file: 256 int32 header (magic, version, count), then uint16 tokens."""
    header = [0] * LLMC_HEADER_INTS
    header[0], header[1], header[2] = LLMC_MAGIC, LLMC_VERSION, len(tokens)
    with open(path, "wb") as f:
        f.write(struct.pack(f"<{LLMC_HEADER_INTS}i", *header))
        f.write(struct.pack(f"<{len(tokens)}H", *tokens))


def batch_at(tokens, step, B, T):
    """zshard's batch order: sequence k of step s starts at token (s*B + k)*T, wrapping around."""
    n = len(tokens)
    inputs, targets = [], []
    for k in range(B):
        start = (step * B + k) * T
        inputs.append([tokens[(start + j) % n] for j in range(T)])
        targets.append([tokens[(start + j + 1) % n] for j in range(T)])
    return torch.tensor(inputs), torch.tensor(targets)


def torch_losses(model, tokens, args):
    opt = make_optimizer(model, args.lr, args.wd, args.beta1, args.beta2, args.eps)
    losses = []
    for step in range(args.steps):
        inputs, targets = batch_at(tokens, step, args.batch, args.seq)
        opt.zero_grad(set_to_none=True)
        loss = model(inputs, targets)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def zshard_losses(zshard_train, workdir, weights, data, dims, args):
    layers, dim, heads, vocab, ctx = dims
    log = os.path.join(workdir, "zshard_log.jsonl")
    cmd = [zshard_train, "--model", "tiny", "--layers", layers, "--dim", dim, "--heads", heads,
           "--vocab", vocab, "--ctx", ctx, "--init-from", weights, "--data", data,
           "--batch", args.batch, "--seq", args.seq, "--steps", args.steps, "--lr", args.lr,
           "--warmup", 0, "--lr-schedule", "constant", "--wd", args.wd, "--beta1", args.beta1,
           "--beta2", args.beta2, "--eps", args.eps, "--grad-clip", 0, "--log-json", log]
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    subprocess.run([str(c) for c in cmd], check=True, env=env, stdout=subprocess.DEVNULL)
    with open(log) as f:
        return [json.loads(line)["loss"] for line in f if line.strip()]


def parity_case(vocab, args):
    """One parity comparison at the given vocabulary size; returns the max relative loss difference."""
    dims = (args.layers, args.dim, args.heads, vocab, args.ctx)
    model = GPT2(*dims)
    model.init_weights(args.seed)
    # Tokens drawn from a small random subset of the vocabulary: the model can learn their frequencies,
    # so the loss falls over the steps and the comparison exercises the optimizer, not just the init.
    gen = torch.Generator().manual_seed(args.seed + 1)
    subset = torch.randperm(vocab, generator=gen)[:args.distinct]
    tokens = subset[torch.randint(0, len(subset), (args.tokens,), generator=gen)].tolist()
    with tempfile.TemporaryDirectory(prefix="zshard_parity_") as workdir:
        weights = os.path.join(workdir, "weights.safetensors")
        data = os.path.join(workdir, "tokens.bin")
        write_safetensors(weights, model.state_dict())
        write_llmc_tokens(data, tokens)
        z = zshard_losses(args.zshard_train, workdir, weights, data, dims, args)
    t = torch_losses(model, tokens, args)
    if len(z) != len(t):
        raise SystemExit(f"zshard logged {len(z)} steps, expected {len(t)}")
    print(f"layers {args.layers} dim {args.dim} heads {args.heads} vocab {vocab} ctx {args.ctx}, "
          f"batch {args.batch}x{args.seq}, {args.steps} AdamW steps")
    print(f"{'step':>4} {'torch loss':>12} {'zshard loss':>12} {'rel diff':>10}")
    worst = 0.0
    for i, (a, b) in enumerate(zip(t, z), start=1):
        rel = abs(a - b) / abs(a)
        worst = max(worst, rel)
        print(f"{i:>4} {a:>12.7f} {b:>12.7f} {rel:>10.2e}")
    print(f"max relative difference {worst:.2e} (tolerance {args.rtol:.0e})\n")
    return worst


def cmd_parity(args):
    torch.set_num_threads(1)
    worst = max(parity_case(v, args) for v in args.vocabs)
    ok = worst <= args.rtol
    print("PASS" if ok else "FAIL", f"max relative loss difference {worst:.2e}")
    return 0 if ok else 1


def cmd_bench(args):
    torch.set_num_threads(1)
    model, dims = model_from_args(args)
    opt = make_optimizer(model, 1e-4, 0.1, 0.9, 0.95, 1e-8)
    gen = torch.Generator().manual_seed(args.seed)
    inputs = torch.randint(0, dims[3], (args.batch, args.seq), generator=gen)
    targets = torch.randint(0, dims[3], (args.batch, args.seq), generator=gen)
    wall, cpu = [], []
    for _ in range(args.warmup + args.steps):
        t0, c0 = time.perf_counter(), time.process_time()
        opt.zero_grad(set_to_none=True)
        model(inputs, targets).backward()
        opt.step()
        wall.append((time.perf_counter() - t0) * 1e3)
        cpu.append((time.process_time() - c0) * 1e3)
    timed, timed_cpu = wall[args.warmup:], cpu[args.warmup:]
    print(json.dumps({"impl": "torch", "torch": torch.__version__, "threads": torch.get_num_threads(),
                      "model": args.model, "layers": dims[0], "dim": dims[1], "heads": dims[2],
                      "vocab": dims[3], "ctx": dims[4], "batch": args.batch, "seq": args.seq,
                      "warmup": args.warmup, "step_ms": timed, "median_ms": statistics.median(timed),
                      "step_cpu_ms": timed_cpu, "median_cpu_ms": statistics.median(timed_cpu)}))
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="mode", required=True)

    par = sub.add_parser("parity", help="compare per-step losses with zshard-train")
    par.add_argument("--zshard-train", required=True, help="path to the zshard-train binary")
    par.add_argument("--layers", type=int, default=2)
    par.add_argument("--dim", type=int, default=64)
    par.add_argument("--heads", type=int, default=4)
    par.add_argument("--ctx", type=int, default=64)
    par.add_argument("--vocabs", type=int, nargs="+", default=[512, 50257],
                     help="one comparison per vocabulary size")
    par.add_argument("--batch", type=int, default=4)
    par.add_argument("--seq", type=int, default=32)
    par.add_argument("--steps", type=int, default=10)
    par.add_argument("--tokens", type=int, default=4096, help="length of the random token file")
    par.add_argument("--distinct", type=int, default=32, help="distinct token ids in the token file")
    par.add_argument("--lr", type=float, default=1e-3)
    par.add_argument("--wd", type=float, default=0.1)
    par.add_argument("--beta1", type=float, default=0.9)
    par.add_argument("--beta2", type=float, default=0.95)
    par.add_argument("--eps", type=float, default=1e-8)
    par.add_argument("--seed", type=int, default=1234)
    par.add_argument("--rtol", type=float, default=1e-4, help="largest accepted relative loss difference")
    par.set_defaults(func=cmd_parity)

    ben = sub.add_parser("bench", help="time one training step on one CPU thread")
    ben.add_argument("--model", default="tiny", choices=sorted(CONFIGS))
    ben.add_argument("--layers", type=int, default=0, help="override (0 = the config's)")
    ben.add_argument("--dim", type=int, default=0, help="override (0 = the config's)")
    ben.add_argument("--heads", type=int, default=0, help="override (0 = the config's)")
    ben.add_argument("--vocab", type=int, default=0, help="override (0 = the config's)")
    ben.add_argument("--ctx", type=int, default=0, help="override (0 = the config's)")
    ben.add_argument("--batch", type=int, default=8)
    ben.add_argument("--seq", type=int, default=64)
    ben.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    ben.add_argument("--steps", type=int, default=3, help="timed steps")
    ben.add_argument("--seed", type=int, default=1337)
    ben.set_defaults(func=cmd_bench)

    args = p.parse_args()
    sys.exit(args.func(args))


if __name__ == "__main__":
    main()
