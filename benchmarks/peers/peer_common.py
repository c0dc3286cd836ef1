"""What the CPU PyTorch peers (gpt2_torch.py, llama_torch.py) share, so that each model's parity, loss and
bench modes run the same step the same way: the file formats zshard reads (safetensors weights, llm.c token
files, text), zshard's batch order and AdamW parameter grouping, LoRA adapters and frozen parameters, the
parity loop against zshard-train, and the single-thread step timer.
"""

import argparse
import contextlib
import copy
import ctypes
import json
import os
import re
import statistics
import struct
import subprocess
import tempfile
import time

import numpy as np
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

LLMC_MAGIC = 20240520
LLMC_VERSION = 1
LLMC_HEADER_INTS = 256


def one_thread():
    """Runs torch on one CPU thread. torch.set_num_threads does not reach the BLAS: Debian's torch calls
    the system libblas.so.3, OpenBLAS with its own thread pool, which a bare run (no
    OPENBLAS_NUM_THREADS=1) would let use every core, so OpenBLAS is pinned to one thread too when it is
    the BLAS torch loaded."""
    torch.set_num_threads(1)
    for name in ("libblas.so.3", "libopenblas.so.0"):
        try:
            ctypes.CDLL(name, mode=os.RTLD_NOLOAD | os.RTLD_LAZY).openblas_set_num_threads(1)
        except (OSError, AttributeError):
            pass  # not loaded, or not OpenBLAS


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


def read_safetensors(path):
    """Reads a safetensors file of F32 tensors (what zshard-export and write_safetensors write) into a
    {name: float32 tensor} dict."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "F32":
            raise SystemExit(f"{path}: tensor {name} is {info['dtype']}, only F32 is read")
        begin, end = info["data_offsets"]
        count = int(np.prod(info["shape"], dtype=np.int64))
        if end - begin != 4 * count or end > len(data):
            raise SystemExit(f"{path}: tensor {name} has data_offsets {info['data_offsets']} for shape "
                             f"{info['shape']} in {len(data)} data bytes")
        array = np.frombuffer(data, dtype="<f4", count=count, offset=begin).reshape(info["shape"])
        tensors[name] = torch.from_numpy(array.astype(np.float32))  # a copy: the buffer is read-only
    return tensors


def write_llmc_tokens(path, tokens):
    """Writes an llm.c token file: 256 int32 header (magic, version, count), then uint16 tokens."""
    header = [0] * LLMC_HEADER_INTS
    header[0], header[1], header[2] = LLMC_MAGIC, LLMC_VERSION, len(tokens)
    with open(path, "wb") as f:
        f.write(struct.pack(f"<{LLMC_HEADER_INTS}i", *header))
        f.write(struct.pack(f"<{len(tokens)}H", *tokens))


def read_llmc_tokens(path):
    """The tokens of an llm.c token file, as a list of ints; checks the header and the length."""
    with open(path, "rb") as f:
        header = struct.unpack(f"<{LLMC_HEADER_INTS}i", f.read(4 * LLMC_HEADER_INTS))
        body = f.read()
    if header[0] != LLMC_MAGIC or header[1] != LLMC_VERSION:
        raise SystemExit(f"{path}: not an llm.c token file (magic {header[0]}, version {header[1]})")
    if len(body) != 2 * header[2]:
        raise SystemExit(f"{path}: header says {header[2]} tokens, the file holds {len(body) // 2}")
    return np.frombuffer(body, dtype="<u2").astype(np.int64).tolist()


def read_tokens(path):
    """The tokens of a data file as zshard-train reads --data and --eval-data: an llm.c token file (one that
    starts with its magic, or any name ending .bin), else a text file's bytes, one token each."""
    with open(path, "rb") as f:
        data = f.read()
    if path.endswith(".bin") or data[:4] == struct.pack("<i", LLMC_MAGIC):
        return read_llmc_tokens(path)
    if not data:
        raise SystemExit(f"{path}: is empty")
    return list(data)


def add_loss_flags(parser):
    """The flags every loss mode takes besides the model's: the weights file, the tokens and the batches."""
    parser.add_argument("--weights", required=True,
                        help="safetensors file (F32) with the Hugging Face names: a zshard-export, say")
    parser.add_argument("--data", required=True,
                        help="tokens, as zshard-train's --data: an llm.c .bin token file or a text file (its bytes)")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--step", type=int, default=0, help="the first batch, in zshard's order (0 = the first)")
    parser.add_argument("--batches", type=int, default=1,
                        help="the mean over this many batches from --step: with --step 0, zshard-train's "
                             "eval loss of --eval-batches N on --eval-data")


def mean_loss(model, vocab, ctx, args):
    """model's mean token loss over args.batches batches of args.data (batch args.batch x args.seq), from
    batch args.step in zshard's order; with step 0 what zshard-train's evaluation computes on the same
    --eval-data, --eval-batches, --batch and --seq (its batches hold alike many tokens: the mean of their
    means is the mean over their tokens)."""
    tokens = read_tokens(args.data)
    if max(tokens) >= vocab:
        raise SystemExit(f"{args.data}: token {max(tokens)} is outside the vocabulary of {vocab}")
    if args.seq > ctx:
        raise SystemExit(f"--seq {args.seq} exceeds the model's context {ctx}")
    if args.batches < 1:
        raise SystemExit(f"--batches must be at least 1, got {args.batches}")
    with torch.no_grad():
        losses = [model(*batch_at(tokens, args.step + k, args.batch, args.seq)).item() for k in range(args.batches)]
    return sum(losses) / len(losses)


def loss_report(loss, config, args):
    """The JSON record of a loss mode: the loss, where it was measured and the model's config."""
    return {"loss": loss, "weights": args.weights, "data": args.data, "step": args.step, "batches": args.batches,
            "batch": args.batch, "seq": args.seq, **config}


def make_optimizer(model, lr, wd, beta1, beta2, eps):
    """torch AdamW with zshard's grouping: weight decay on 2-D tensors (matrices, embeddings, LoRA's A and
    B) only; frozen parameters (requires_grad False) are not in it, as zshard keeps no state for them."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in trainable if p.dim() >= 2]
    no_decay = [p for p in trainable if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(beta1, beta2), eps=eps)


def name_matches(pattern, name):
    """zshard's --freeze match (shard/frozen_params.h): the whole name, '*' matching any run of characters."""
    return re.fullmatch(".*".join(map(re.escape, pattern.split("*"))), name) is not None


def freeze(model, patterns):
    """Freezes (requires_grad False) the parameters whose names a pattern matches, as zshard-train's --freeze
    does; a pattern that matches nothing is refused, as zshard refuses it."""
    named = dict(model.named_parameters())
    for pattern in patterns:
        hits = [name for name in named if name_matches(pattern, name)]
        if not hits:
            raise SystemExit(f"--freeze: '{pattern}' matches no parameter")
        for name in hits:
            named[name].requires_grad_(False)


def lora_forward_hook(module, inputs, output):
    """PEFT's LoRA forward: the layer's output plus (alpha/R) * (x A^T) B^T, without dropout."""
    return output + module.lora_B(module.lora_A(inputs[0])) * module.lora_scale


def add_lora(model, rank, alpha, targets, seed):
    """Adds LoRA adapters to the linear layers of model (nn.Linear, weight (out, in), and the modules marked
    weight_in_out, GPT-2's Conv1D) that a target names, with PEFT's semantics: a target names each layer
    whose name it ends at a dot (c_proj names attn.c_proj and mlp.c_proj); lora_A.weight (R, in) and
    lora_B.weight (out, R) are nn.Linear weights inside the layer, so their names are zshard's and PEFT's
    (h.0.attn.c_attn.lora_A.weight); every other parameter is frozen (PEFT's bias="none"). A is PEFT's
    Kaiming-uniform (within 1/sqrt(in)); B is drawn N(0, 0.02), not PEFT's zeros: with B zero, A's
    gradient is zero at the first step, and a comparison from a random B checks both gradients at once."""
    for p in model.parameters():
        p.requires_grad_(False)
    gen = torch.Generator().manual_seed(seed + 2)
    layers = {name: m for name, m in model.named_modules()
              if isinstance(m, nn.Linear) or getattr(m, "weight_in_out", False)}
    for target in targets.split(","):
        named = [name for name in layers if name == target or name.endswith("." + target)]
        if not named:
            raise SystemExit(f"--lora-targets: no layer '{target}' (layers: {', '.join(layers)})")
        for name in named:
            layer = layers[name]
            if hasattr(layer, "lora_A"):
                continue  # named by two targets (c_proj, attn.c_proj): one adapter, as in PEFT
            n_out, n_in = layer.weight.shape if isinstance(layer, nn.Linear) else reversed(layer.weight.shape)
            layer.lora_A = nn.Linear(n_in, rank, bias=False)
            layer.lora_B = nn.Linear(rank, n_out, bias=False)
            layer.lora_scale = alpha / rank
            with torch.no_grad():
                layer.lora_A.weight.uniform_(-1 / n_in ** 0.5, 1 / n_in ** 0.5, generator=gen)
                layer.lora_B.weight.normal_(0.0, 0.02, generator=gen)
            layer.register_forward_hook(lora_forward_hook)


def batch_at(tokens, step, B, T):
    """zshard's batch order: sequence k of step s starts at token (s*B + k)*T, wrapping around."""
    n = len(tokens)
    inputs, targets = [], []
    for k in range(B):
        start = (step * B + k) * T
        inputs.append([tokens[(start + j) % n] for j in range(T)])
        targets.append([tokens[(start + j + 1) % n] for j in range(T)])
    return torch.tensor(inputs), torch.tensor(targets)


def parity_tokens(vocab, args):
    """The parity token stream: args.tokens tokens drawn from args.distinct random ids below vocab. The
    model can learn their frequencies, so the loss falls over the steps and the comparison exercises the
    optimizer, not just the init."""
    gen = torch.Generator().manual_seed(args.seed + 1)
    subset = torch.randperm(vocab, generator=gen)[:args.distinct]
    return subset[torch.randint(0, len(subset), (args.tokens,), generator=gen)].tolist()


class Fp32Accumulation(TorchFunctionMode):
    """Matrix products of bf16 tensors computed in fp32 and rounded once to bf16, as cuBLAS and zshard's
    bf16 GEMMs compute them (fp32 accumulation). Debian's torch 1.13 accumulates its CPU bf16 products in
    bf16: a product over 50257 terms (GPT-2's head) comes out 30% off. Their backward runs in fp32 too
    (autograd goes through the casts)."""

    PRODUCTS = {"matmul", "__matmul__", "mm", "bmm", "addmm", "baddbmm", "linear"}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__name__", "") in self.PRODUCTS and any(
                isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16 for a in args):
            wide = [a.float() if isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16 else a for a in args]
            return func(*wide, **kwargs).bfloat16()
        return func(*args, **kwargs)


def torch_losses(model, tokens, args):
    """Trains model in place for args.steps AdamW steps (constant lr, as zshard-train is run; with
    args.grad_clip > 0 the trainable parameters' gradients clipped to that global norm, as zshard clips)
    and returns the loss of each step, computed before its update. With args.precision bf16, as zshard's
    mixed precision: model is the fp32 master that AdamW steps; each step computes in a bf16 copy of it
    (the master rounded to nearest even) whose bf16 gradients are widened onto the master; matrix products
    accumulate in fp32 (Fp32Accumulation) unless args.bf16_gemm is "native"."""
    opt = make_optimizer(model, args.lr, args.wd, args.beta1, args.beta2, args.eps)
    trainable = [p for p in model.parameters() if p.requires_grad]
    compute = copy.deepcopy(model).to(torch.bfloat16) if args.precision == "bf16" else model
    products = Fp32Accumulation() if compute is not model and args.bf16_gemm == "fp32" else contextlib.nullcontext()
    losses = []
    for step in range(args.steps):
        inputs, targets = batch_at(tokens, step, args.batch, args.seq)
        opt.zero_grad(set_to_none=True)
        if compute is not model:
            compute.zero_grad(set_to_none=True)
            with torch.no_grad():
                for c, m in zip(compute.parameters(), model.parameters()):
                    c.copy_(m)
        with products:
            loss = compute(inputs, targets)
            loss.backward()
        if compute is not model:
            for c, m in zip(compute.parameters(), model.parameters()):
                if m.requires_grad:
                    m.grad = c.grad.float()
        if args.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(trainable, args.grad_clip)
        opt.step()
        losses.append(loss.item())
    return losses


class ZshardRun:
    """How one zshard-train run is launched: ranks, strategy (None: zshard-train's default) and hybrid's
    shard group (None: not given)."""

    def __init__(self, np, strategy=None, shard_group=None):
        self.np, self.strategy, self.shard_group = np, strategy, shard_group

    @staticmethod
    def parse(text):
        """NP, NP:STRATEGY or NP:STRATEGY:SHARD_GROUP, as --runs takes them."""
        parts = text.split(":")
        try:
            if len(parts) > 3 or int(parts[0]) < 1 or (len(parts) == 3 and int(parts[2]) < 1):
                raise ValueError
            return ZshardRun(int(parts[0]), parts[1] if len(parts) > 1 else None,
                             int(parts[2]) if len(parts) == 3 else None)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not NP, NP:STRATEGY or NP:STRATEGY:SHARD_GROUP") from None

    def label(self):
        group = f" group {self.shard_group}" if self.shard_group else ""
        return f"np {self.np} {self.strategy or 'default'}{group}"


def zshard_losses(workdir, model_flags, weights, data, args, run):
    """Runs zshard-train (model_flags pick the model and its config) with the step torch_losses runs and
    args' LoRA and --freeze settings, on run's ranks and strategy (a ZshardRun; more than one rank: under
    mpirun, one thread per rank), and returns its per-step losses from --log-json."""
    log = os.path.join(workdir, f"zshard_log_{run.label().replace(' ', '_')}.jsonl")
    cmd = [args.zshard_train, *model_flags, "--init-from", weights, "--data", data,
           "--batch", args.batch, "--seq", args.seq, "--steps", args.steps, "--lr", args.lr,
           "--warmup", 0, "--lr-schedule", "constant", "--wd", args.wd, "--beta1", args.beta1,
           "--beta2", args.beta2, "--eps", args.eps, "--grad-clip", args.grad_clip, "--log-json", log]
    if args.lora_rank:
        cmd += ["--lora-rank", args.lora_rank, "--lora-alpha", args.lora_alpha, "--lora-targets", args.lora_targets]
    if args.freeze:
        cmd += ["--freeze", args.freeze]
    if run.strategy:
        cmd += ["--strategy", run.strategy]
    if run.shard_group:
        cmd += ["--shard-group", run.shard_group]
    if args.precision == "bf16":
        cmd += ["--param-dtype", "bf16"]
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    if run.np > 1:
        cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", run.np, *cmd]
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    subprocess.run([str(c) for c in cmd], check=True, env=env, stdout=subprocess.DEVNULL)
    with open(log) as f:
        return [json.loads(line)["loss"] for line in f if line.strip()]


def softmax_dtype(logits):
    """The dtype a softmax over these inputs computes in (the models' cross-entropy, Llama's attention):
    fp32 for fp32 and bf16 inputs, as zshard's kernels do; fp64 for fp64 inputs (the exact reference
    parity_case trains)."""
    return torch.float64 if logits.dtype == torch.float64 else torch.float32


def adapt(model, args):
    """Gives model args' LoRA adapters (--lora-rank) and frozen parameters (--freeze), as zshard-train is
    given them; returns a line saying which, or "" for neither."""
    what = []
    if args.lora_rank:
        add_lora(model, args.lora_rank, args.lora_alpha, args.lora_targets, args.seed)
        what.append(f"LoRA rank {args.lora_rank} alpha {args.lora_alpha:g} on {args.lora_targets}")
    if args.freeze:
        freeze(model, args.freeze.split(","))
        what.append(f"frozen {args.freeze}")
    if what:
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        what.append(f"{trainable} of {sum(p.numel() for p in model.parameters())} parameters trained")
    return ", ".join(what)


def parity_case(model, model_flags, title, vocab, args):
    """One parity comparison: adapts model (adapt), writes its weights and the parity tokens, trains model
    on them and then zshard-train once per run of args.runs (else the one run of --np and --strategy), and
    compares the per-step losses. It also trains a copy of model one precision up (fp64 for an fp32
    comparison: the exact losses, which both fp32 runs round; fp32 for bf16: bf16's own effect) and
    reports how far each side's losses are from it, so that a difference between torch and zshard can be
    told apart from torch's own rounding. A single run, or a run beyond the tolerance, prints its losses
    step by step; the others a line each. Returns, for each run, the max relative difference between torch
    and zshard and zshard's max relative distance from the wider run."""
    adaptation = adapt(model, args)
    tokens = parity_tokens(vocab, args)
    wider_name = "fp64" if args.precision == "fp32" else "fp32"
    wider_model = copy.deepcopy(model).double() if wider_name == "fp64" else copy.deepcopy(model)
    wider = torch_losses(wider_model, tokens, argparse.Namespace(**{**vars(args), "precision": "fp32"}))
    runs = args.runs or [ZshardRun(args.np, args.strategy)]
    clipped = f", gradients clipped to norm {args.grad_clip:g}" if args.grad_clip > 0 else ""
    print(f"{title}, batch {args.batch}x{args.seq}, {args.steps} AdamW steps, {args.precision}{clipped}"
          + (f"; {adaptation}" if adaptation else ""))
    off = f"off {wider_name}"
    results = []
    with tempfile.TemporaryDirectory(prefix="zshard_parity_") as workdir:
        weights = os.path.join(workdir, "weights.safetensors")
        data = os.path.join(workdir, "tokens.bin")
        write_safetensors(weights, model.state_dict())
        write_llmc_tokens(data, tokens)
        t = torch_losses(model, tokens, args)
        t_off = [abs(a - w) / abs(w) for a, w in zip(t, wider)]
        for run in runs:
            z = zshard_losses(workdir, model_flags, weights, data, args, run)
            if len(z) != len(t):
                raise SystemExit(f"zshard ({run.label()}) logged {len(z)} steps, expected {len(t)}")
            rel = [abs(a - b) / abs(a) for a, b in zip(t, z)]
            z_off = [abs(b - w) / abs(w) for b, w in zip(z, wider)]
            if len(runs) == 1 or max(rel) > args.rtol:
                print(f"zshard {run.label()}")
                print(f"{'step':>4} {'torch loss':>12} {'zshard loss':>12} {'rel diff':>10} {'torch ' + wider_name:>12}"
                      f" {'torch ' + off:>14} {'zshard ' + off:>15}")
                for i, row in enumerate(zip(t, z, rel, wider, t_off, z_off), start=1):
                    print(f"{i:>4} " + "{:>12.7f} {:>12.7f} {:>10.2e} {:>12.7f} {:>14.2e} {:>15.2e}".format(*row))
            print(f"zshard {run.label()}: max relative difference {max(rel):.2e} (tolerance {args.rtol:.0e}); "
                  f"against torch {wider_name}: torch {max(t_off):.2e}, zshard {max(z_off):.2e}")
            results.append((max(rel), max(z_off)))
    print()
    return results


def parity_verdict(cases, rtol, precision):
    """Prints PASS or FAIL over the cases' (parity_case's) per-run max relative differences; returns the
    exit status."""
    results = [run for case in cases for run in case]
    worst = max(diff for diff, _ in results)
    ok = worst <= rtol
    wider = "fp64" if precision == "fp32" else "fp32"
    print("PASS" if ok else "FAIL", f"max relative loss difference {worst:.2e}; zshard against torch {wider} "
          f"{max(off for _, off in results):.2e}")
    return 0 if ok else 1


def add_parity_flags(parser, vocabs):
    """The flags every parity mode takes: zshard-train and how to launch it, the shared shape (the model
    adds its own keys), the token stream, the step, LoRA and frozen parameters, and the tolerance."""
    parser.add_argument("--zshard-train", required=True, help="path to the zshard-train binary")
    parser.add_argument("--np", type=int, default=1, help="zshard-train ranks (> 1: run under mpirun)")
    parser.add_argument("--strategy", help="zshard-train --strategy (default: zshard-train's)")
    parser.add_argument("--runs", type=ZshardRun.parse, nargs="+",
                        help="zshard-train runs compared with the one torch run, each NP, NP:STRATEGY or "
                             "NP:STRATEGY:SHARD_GROUP (4:hybrid:2); replaces --np and --strategy")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--ctx", type=int, default=64)
    parser.add_argument("--vocabs", type=int, nargs="+", default=vocabs, help="one comparison per vocabulary size")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--tokens", type=int, default=4096, help="length of the random token file")
    parser.add_argument("--distinct", type=int, default=32, help="distinct token ids in the token file")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--wd", type=float, default=0.1)
    parser.add_argument("--beta1", type=float, default=0.9)
    parser.add_argument("--beta2", type=float, default=0.95)
    parser.add_argument("--eps", type=float, default=1e-8)
    parser.add_argument("--grad-clip", type=float, default=0.0,
                        help="clip the trainable gradients to this global norm (0: no clipping)")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--lora-rank", type=int, default=0,
                        help="LoRA adapters of this rank on --lora-targets, every other parameter frozen")
    parser.add_argument("--lora-alpha", type=float, default=8.0, help="the adapters' output scaled by alpha/rank")
    parser.add_argument("--lora-targets", help="layers to adapt, comma separated (PEFT's target_modules; "
                                               "default: the model's, as zshard-train's)")
    parser.add_argument("--freeze", help="parameters to freeze, comma separated, '*' matching any characters "
                                         "(zshard-train's --freeze)")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"],
                        help="bf16: bf16 parameters and gradients, fp32 master and AdamW, on both sides")
    parser.add_argument("--bf16-gemm", default="fp32", choices=["fp32", "native"],
                        help="torch's bf16 matrix products: accumulated in fp32 (as on a GPU), or torch's own "
                             "CPU kernels")
    parser.add_argument("--rtol", type=float, default=1e-4, help="largest accepted relative loss difference")


def add_bench_flags(parser):
    """The flags every bench mode takes besides the model's: the batch, the step counts and the seed."""
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    parser.add_argument("--steps", type=int, default=3, help="timed steps")
    parser.add_argument("--seed", type=int, default=1337)


def bench_report(model, model_name, config, vocab, args):
    """Times args.warmup + args.steps training steps (zero_grad, forward + backward, AdamW) of model on
    random tokens, on one thread; returns the JSON record: the config's keys, then the batch and the
    timed steps' wall-clock and process CPU times (the latter less disturbed by other load)."""
    one_thread()
    opt = make_optimizer(model, 1e-4, 0.1, 0.9, 0.95, 1e-8)
    gen = torch.Generator().manual_seed(args.seed)
    inputs = torch.randint(0, vocab, (args.batch, args.seq), generator=gen)
    targets = torch.randint(0, vocab, (args.batch, args.seq), generator=gen)
    wall, cpu = [], []
    for _ in range(args.warmup + args.steps):
        t0, c0 = time.perf_counter(), time.process_time()
        opt.zero_grad(set_to_none=True)
        model(inputs, targets).backward()
        opt.step()
        wall.append((time.perf_counter() - t0) * 1e3)
        cpu.append((time.process_time() - c0) * 1e3)
    timed, timed_cpu = wall[args.warmup:], cpu[args.warmup:]
    return {"impl": "torch", "torch": torch.__version__, "threads": torch.get_num_threads(), "model": model_name,
            **config, "batch": args.batch, "seq": args.seq, "warmup": args.warmup, "step_ms": timed,
            "median_ms": statistics.median(timed), "step_cpu_ms": timed_cpu,
            "median_cpu_ms": statistics.median(timed_cpu)}
