#!/usr/bin/python3
"""A self-contained PyTorch GPT-2, the reference zshard is checked and timed against.

Why it exists: zshard claims to train GPT-2 exactly as PyTorch / Hugging Face do. Hugging Face
transformers is not a dependency, so the model is written here in plain torch, with the Hugging Face
parameter names and the Conv1D (in, out) weight layouts, so its state dict is a file zshard loads
with --init-from.

Modes:
  parity  trains a small GPT-2 for a few AdamW steps in float32 on one CPU thread, trains zshard-train
          from the same weights and tokens with the same hyperparameters, and compares the per-step
          losses (exit 0 when every step agrees within --rtol, else 1). --np N runs zshard-train on N
          ranks under mpirun (--strategy picks its strategy); the torch side is always one process.
          Both sides are also measured against this model trained one precision up (float64: the exact
          losses, which tell zshard's distance from the model apart from torch's own float32 rounding;
          float32 under --precision bf16).
          --precision bf16 compares mixed precision on both sides (bf16 parameters and gradients, fp32
          master and AdamW; torch's matrix products accumulated in fp32 unless --bf16-gemm native) and
          also prints torch's bf16 against its fp32 run: bf16's own effect, the scale of the comparison
          (benchmarks/RESULTS.md has the tolerance and why).
          --lora-rank R (--lora-alpha, --lora-targets) trains LoRA adapters with PEFT's semantics and
          every other parameter frozen, --freeze freezes parameters by name, both as zshard-train's
          flags of those names; --runs compares several zshard-train runs (ranks, strategy, shard
          group) with one torch run.
  loss    loads a safetensors weights file (a zshard-export of a zshard checkpoint, say) into the model
          without LoRA and prints as JSON its mean token loss on --batches batches of a token or text
          file from batch --step (by default the first; --batches N from 0 are what zshard-train's
          --eval-batches N evaluates on). The shapes come from the file; the heads, which it cannot
          tell, from --model or --heads.
  bench   times one training step (forward + backward + AdamW) on one CPU thread and prints JSON:
          wall-clock and process CPU time per step (the latter is less disturbed by other load).

The file formats, the batch order, the optimizer grouping and the parity and timing loops are shared
with the Llama peer (llama_torch.py) through peer_common.py.

Run it with the system interpreter (/usr/bin/python3), which is the one with torch installed.
"""

import argparse
import json
import math
import os
import sys

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# make_optimizer is imported from here by torch_ddp.py too.
from peer_common import (add_bench_flags, add_loss_flags, add_parity_flags, bench_report,  # noqa: E402,F401
                         loss_report, make_optimizer, mean_loss, one_thread, parity_case, parity_verdict,
                         read_safetensors, softmax_dtype)

# Named configs, as in models/gpt2_config.cpp: (layers, dim, heads, vocab, ctx).
CONFIGS = {
    "tiny": (2, 64, 4, 256, 128),
    "gpt2": (12, 768, 12, 50257, 1024),
    "gpt2-medium": (24, 1024, 16, 50257, 1024),
    "gpt2-large": (36, 1280, 20, 50257, 1024),
    "gpt2-xl": (48, 1600, 25, 50257, 1024),
}


class Conv1D(nn.Module):
    """Hugging Face's Conv1D: a linear layer whose weight is stored (in, out)."""

    weight_in_out = True  # tells peer_common.add_lora the layout

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
        return F.cross_entropy(logits.to(softmax_dtype(logits)).view(-1, logits.shape[-1]), targets.reshape(-1))


def model_from_args(args):
    """The --model config with any --layers/--dim/--heads/--vocab/--ctx override; returns (model, dims)."""
    dims = list(CONFIGS[args.model])
    for i, override in enumerate((args.layers, args.dim, args.heads, args.vocab, args.ctx)):
        if override:
            dims[i] = override
    model = GPT2(*dims)
    model.init_weights(args.seed)
    return model, dims


def model_from_weights(weights, heads):
    """The GPT-2 a weights file holds, its weights loaded, and its dims: layers, dim, vocab and ctx read
    from its shapes, the heads (which it cannot tell) given."""
    tensors = read_safetensors(weights)
    for name in ("wte.weight", "wpe.weight"):
        if name not in tensors:
            raise SystemExit(f"{weights}: no tensor {name} (not a GPT-2 weights file?)")
    vocab, dim = tensors["wte.weight"].shape
    ctx = tensors["wpe.weight"].shape[0]
    layers = 0
    while f"h.{layers}.ln_1.weight" in tensors:
        layers += 1
    if dim % heads:
        raise SystemExit(f"{weights}: dim {dim} is not a multiple of --heads {heads}")
    dims = (layers, dim, heads, vocab, ctx)
    model = GPT2(*dims)
    model.load_state_dict(tensors, strict=True)
    return model, dims


def cmd_parity(args):
    one_thread()
    cases = []
    for vocab in args.vocabs:
        dims = (args.layers, args.dim, args.heads, vocab, args.ctx)
        model = GPT2(*dims)
        model.init_weights(args.seed)
        flags = ["--model", "tiny"]
        for name, value in zip(("layers", "dim", "heads", "vocab", "ctx"), dims):
            flags += ["--" + name, value]
        title = f"layers {args.layers} dim {args.dim} heads {args.heads} vocab {vocab} ctx {args.ctx}"
        cases.append(parity_case(model, flags, title, vocab, args))
    return parity_verdict(cases, args.rtol, args.precision)


def cmd_loss(args):
    one_thread()
    model, dims = model_from_weights(args.weights, args.heads or CONFIGS[args.model][2])
    config = dict(zip(("layers", "dim", "heads", "vocab", "ctx"), dims))
    print(json.dumps(loss_report(mean_loss(model, config["vocab"], config["ctx"], args), config, args)))
    return 0


def cmd_bench(args):
    model, dims = model_from_args(args)
    config = dict(zip(("layers", "dim", "heads", "vocab", "ctx"), dims))
    print(json.dumps(bench_report(model, args.model, config, dims[3], args)))
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="mode", required=True)

    par = sub.add_parser("parity", help="compare per-step losses with zshard-train")
    add_parity_flags(par, vocabs=[512, 50257])
    par.set_defaults(func=cmd_parity, lora_targets="c_attn")  # zshard's and PEFT's default targets

    los = sub.add_parser("loss", help="mean loss of a weights file on batches of a token file, as JSON")
    add_loss_flags(los)
    los.add_argument("--model", default="tiny", choices=sorted(CONFIGS), help="config giving the heads")
    los.add_argument("--heads", type=int, default=0, help="override (0 = the config's)")
    los.set_defaults(func=cmd_loss)

    ben = sub.add_parser("bench", help="time one training step on one CPU thread")
    ben.add_argument("--model", default="tiny", choices=sorted(CONFIGS))
    ben.add_argument("--layers", type=int, default=0, help="override (0 = the config's)")
    ben.add_argument("--dim", type=int, default=0, help="override (0 = the config's)")
    ben.add_argument("--heads", type=int, default=0, help="override (0 = the config's)")
    ben.add_argument("--vocab", type=int, default=0, help="override (0 = the config's)")
    ben.add_argument("--ctx", type=int, default=0, help="override (0 = the config's)")
    add_bench_flags(ben)
    ben.set_defaults(func=cmd_bench)

    args = p.parse_args()
    sys.exit(args.func(args))


if __name__ == "__main__":
    main()
