#!/usr/bin/env python3
"""PyTorch GPT-2 training step on one CUDA GPU: the peer that zshard-bench --device cuda is compared with.

The model is the one in gpt2_torch.py (same module names, Conv1D layouts, pre-LN, tanh GELU, LM head tied
to wte); the default config is GPT-2 124M (12 layers, 768 wide, 12 heads, vocab 50257, context 1024).
One step is zero_grad, forward, backward, AdamW (weight decay on matrices and embeddings only, as zshard),
on a fixed random batch. Modes:

  plain   the bare module, one process
  ddp     DistributedDataParallel at world 1 (NCCL, in-process store): DDP's bucketing hooks included
  fsdp2   torch.distributed.fsdp.fully_shard on every block and the root, world 1

--compile runs the module through torch.compile (default mode); the warm-up steps then include the
compilation.

Precision (--precision):
  bf16-mixed  (default) fp32 parameters and AdamW, compute under torch.autocast(bfloat16); fsdp2 also
              gathers bf16 parameters: MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32).
              This is zshard's policy: bf16 compute copy, fp32 master weights and Adam state.
  bf16        every parameter, gradient and Adam state in bfloat16 (no master copy)
  fp32        no autocast (TF32 off)

Prints one JSON line (also written to --json): step times (median, p10, p90), tokens/s, achieved
TFLOP/s and MFU with zshard-bench's FLOP count: per token 6*N + 6*layers*seq*dim (N = the parameter
count, tied head once; runtime/tools/bench_main.cpp), against the dense bf16 peak of the GPU (H100 and H200
SXM: 989.4 TFLOP/s; --peak-tflops overrides, unknown GPUs get no MFU). Exit 3 on CUDA out of memory (the
JSON says "oom": true), so a caller can search for the largest batch. Needs PyTorch and a CUDA GPU: exits 2
without either.

  python3 benchmarks/peers/gpt2_torch_gpu.py --batch 16 --mode fsdp2 --json torch_fsdp2.json
"""

import argparse
import json
import os
import statistics
import sys
import time

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("gpt2_torch_gpu.py: PyTorch is not installed", file=sys.stderr)
    sys.exit(2)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt2_torch import CONFIGS, Attention, model_from_args  # noqa: E402

# Dense (no sparsity) bf16 tensor-core peak, TFLOP/s, by a substring of torch.cuda.get_device_name().
PEAK_BF16_TFLOPS = [("H200", 989.4), ("H100", 989.4), ("H800", 989.4), ("A100", 312.0)]


class SdpaAttention(Attention):
    """The same parameters as gpt2_torch.Attention; the causal attention by
    F.scaled_dot_product_attention (flash / memory-efficient kernels) instead of the explicit T x T."""

    def forward(self, x):
        B, T, C = x.shape
        hd = C // self.heads
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, hd).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


def flops_per_token(layers, dim, params, seq):
    """zshard-bench's count: 6 per parameter, plus causal attention's 6 * layers * seq * dim."""
    return 6.0 * params + 6.0 * layers * seq * dim


def peak_tflops(name, override):
    if override > 0:
        return override
    for key, value in PEAK_BF16_TFLOPS:
        if key in name:
            return value
    return None


def percentile(values, q):
    v = sorted(values)
    pos = q * (len(v) - 1)
    i = int(pos)
    return v[i] + (pos - i) * (v[i + 1] - v[i]) if i + 1 < len(v) else v[-1]


def build_optimizer(model, lr, fused):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    kwargs = {"lr": lr, "betas": (0.9, 0.95), "eps": 1e-8}
    if fused:
        kwargs["fused"] = True
    return torch.optim.AdamW(groups, **kwargs)


def init_world_of_one():
    import torch.distributed as dist
    if not dist.is_initialized():
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)


def wrap(model, args):
    """Returns (module to call, autocast dtype or None)."""
    if args.mode == "plain":
        return model, (torch.bfloat16 if args.precision == "bf16-mixed" else None)
    init_world_of_one()
    if args.mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel
        return (DistributedDataParallel(model, device_ids=[torch.cuda.current_device()]),
                torch.bfloat16 if args.precision == "bf16-mixed" else None)
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    kwargs = {}
    if args.precision == "bf16-mixed":
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.h:
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)
    # fsdp2 casts the parameters itself; autocast on top keeps the loss (softmax cross-entropy) in fp32,
    # as in the other modes.
    return model, (torch.bfloat16 if args.precision == "bf16-mixed" else None)


def run(args):
    model, dims = model_from_args(args)
    layers, dim, heads, vocab, ctx = dims
    if args.seq > ctx:
        sys.exit(f"gpt2_torch_gpu.py: --seq {args.seq} exceeds the context {ctx}")
    device = torch.device("cuda", torch.cuda.current_device())
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(args.seed)

    if args.attention == "sdpa":
        for block in model.h:
            block.attn.__class__ = SdpaAttention
    params = sum(p.numel() for p in model.parameters())  # wte counted once: the head is tied to it
    model.to(device)
    if args.precision == "bf16":
        model.to(torch.bfloat16)
    module, autocast_dtype = wrap(model, args)
    if args.compile:
        module = torch.compile(module)
    opt = build_optimizer(model, 1e-4, not args.no_fused)

    gen = torch.Generator(device="cpu").manual_seed(args.seed)
    inputs = torch.randint(0, vocab, (args.batch, args.seq), generator=gen).to(device)
    targets = torch.randint(0, vocab, (args.batch, args.seq), generator=gen).to(device)

    def step():
        opt.zero_grad(set_to_none=True)
        if autocast_dtype is not None:
            with torch.autocast("cuda", dtype=autocast_dtype):
                loss = module(inputs, targets)
        else:
            loss = module(inputs, targets)
        loss.backward()
        opt.step()
        return loss

    torch.cuda.reset_peak_memory_stats()
    ms, losses = [], []
    for s in range(args.warmup + args.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = step()
        torch.cuda.synchronize()
        if s >= args.warmup:
            ms.append((time.perf_counter() - t0) * 1e3)
            losses.append(float(loss))

    name = torch.cuda.get_device_name(device)
    tokens = args.batch * args.seq
    median = statistics.median(ms)
    tflops = flops_per_token(layers, dim, params, args.seq) * tokens / (median / 1e3) / 1e12
    peak = peak_tflops(name, args.peak_tflops)
    return {"impl": "torch", "torch": torch.__version__, "device": name, "mode": args.mode, "compile": args.compile,
            "precision": args.precision, "attention": args.attention, "fused_adamw": not args.no_fused,
            "model": args.model, "layers": layers, "dim": dim, "heads": heads, "vocab": vocab, "ctx": ctx,
            "params": params, "batch": args.batch, "seq": args.seq, "warmup": args.warmup,
            "step_ms": {"median": median, "p10": percentile(ms, 0.1), "p90": percentile(ms, 0.9), "all": ms},
            "tokens_per_s": tokens / (median / 1e3),
            "flops_per_token": flops_per_token(layers, dim, params, args.seq),
            "flops_formula": "6*N + 6*layers*seq*dim (zshard-bench)",
            "tflops": tflops, "peak_tflops": peak, "mfu": tflops / peak if peak else None,
            "peak_mem_bytes": torch.cuda.max_memory_allocated(device),
            "losses": losses, "oom": False}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="gpt2", choices=sorted(CONFIGS))
    for name in ("layers", "dim", "heads", "vocab", "ctx"):
        p.add_argument("--" + name, type=int, default=0, help="override (0 = the config's)")
    p.add_argument("--batch", type=int, default=8, help="sequences per step")
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--mode", default="ddp", choices=["plain", "ddp", "fsdp2"])
    p.add_argument("--precision", default="bf16-mixed", choices=["bf16-mixed", "bf16", "fp32"])
    p.add_argument("--attention", default="sdpa", choices=["sdpa", "math"],
                   help="sdpa: F.scaled_dot_product_attention; math: the explicit masked T x T softmax")
    p.add_argument("--no-fused", action="store_true", help="the for-each AdamW instead of fused=True")
    p.add_argument("--compile", action="store_true", help="torch.compile the module")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--peak-tflops", type=float, default=0, help="peak TFLOP/s for MFU (0 = by GPU name)")
    p.add_argument("--json", help="also write the JSON line to this file")
    args = p.parse_args()
    if args.batch < 1 or args.seq < 1 or args.steps < 1 or args.warmup < 0:
        p.error("--batch, --seq and --steps must be >= 1, --warmup >= 0")

    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        print("gpt2_torch_gpu.py: no CUDA device (torch.cuda.is_available() is False): this peer runs on a "
              "GPU machine only; the CPU peer is gpt2_torch.py", file=sys.stderr)
        sys.exit(2)
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))

    try:
        result = run(args)
        code = 0
    except torch.cuda.OutOfMemoryError as e:
        result = {"impl": "torch", "mode": args.mode, "precision": args.precision, "batch": args.batch,
                  "seq": args.seq, "oom": True, "error": str(e).splitlines()[0]}
        code = 3
    finally:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    line = json.dumps(result)
    print(line)
    if args.json:
        with open(args.json, "w") as f:
            f.write(line + "\n")
    sys.exit(code)


if __name__ == "__main__":
    main()
