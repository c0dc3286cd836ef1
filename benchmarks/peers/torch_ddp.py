#!/usr/bin/python3
"""PyTorch DDP (gloo, CPU) on the same GPT-2 config and global batch as zshard-bench: the peer that
zshard's ddp step time is compared with. One thread per rank. Launch it like zshard, under mpirun:

  mpirun --oversubscribe --bind-to none -np 4 /usr/bin/python3 benchmarks/peers/torch_ddp.py \\
      --model tiny --batch 8 --seq 64 --json torch_ddp.json

Each rank takes a contiguous slice of the global batch (even split, as zshard does); the step is
zero_grad, forward, backward (DDP all-reduces the averaged gradients), clip to norm 1, AdamW. Rank 0
prints one JSON line with the step times (median, p10, p90 over the timed steps).
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt2_torch import CONFIGS, make_optimizer, model_from_args  # noqa: E402


def world_from_launcher():
    """Rank and size from OpenMPI's mpirun, SLURM, or torchrun's variables."""
    for rank_var, size_var in (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS"),
                               ("RANK", "WORLD_SIZE")):
        if rank_var in os.environ:
            return int(os.environ[rank_var]), int(os.environ[size_var])
    return 0, 1


def percentile(values, q):
    v = sorted(values)
    pos = q * (len(v) - 1)
    i = int(pos)
    return v[i] + (pos - i) * (v[i + 1] - v[i]) if i + 1 < len(v) else v[-1]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="tiny", choices=sorted(CONFIGS))
    for name in ("layers", "dim", "heads", "vocab", "ctx"):
        p.add_argument("--" + name, type=int, default=0, help="override (0 = the config's)")
    p.add_argument("--batch", type=int, default=8, help="global sequences per step")
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--warmup-steps", type=int, default=2)
    p.add_argument("--steps", type=int, default=5, help="timed steps")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--port", type=int, default=29517, help="gloo rendezvous port on localhost")
    p.add_argument("--json", help="rank 0 also writes its JSON line to this file")
    args = p.parse_args()

    rank, world = world_from_launcher()
    if args.batch < world:
        p.error(f"--batch {args.batch} is smaller than the world size {world}")
    torch.set_num_threads(1)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(args.port))
    dist.init_process_group("gloo", rank=rank, world_size=world)

    model, dims = model_from_args(args)
    ddp = DistributedDataParallel(model)
    opt = make_optimizer(model, 1e-4, 0.1, 0.9, 0.95, 1e-8)

    share = [args.batch // world + (1 if r < args.batch % world else 0) for r in range(world)]
    gen = torch.Generator().manual_seed(args.seed)
    inputs = torch.randint(0, dims[3], (args.batch, args.seq), generator=gen)
    targets = torch.randint(0, dims[3], (args.batch, args.seq), generator=gen)
    begin = sum(share[:rank])
    x, y = inputs[begin:begin + share[rank]], targets[begin:begin + share[rank]]

    times = []
    for _ in range(args.warmup_steps + args.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        ddp(x, y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        times.append((time.perf_counter() - t0) * 1e3)
    timed = times[args.warmup_steps:]
    if rank == 0:
        line = json.dumps({"impl": "torch-ddp-gloo", "torch": torch.__version__, "world": world, "threads": 1,
                           "model": args.model, "layers": dims[0], "dim": dims[1], "heads": dims[2],
                           "vocab": dims[3], "ctx": dims[4], "batch": args.batch, "seq": args.seq,
                           "step_ms": {"median": statistics.median(timed), "p10": percentile(timed, 0.1),
                                       "p90": percentile(timed, 0.9), "all": timed},
                           "tokens_per_s": args.batch * args.seq / (statistics.median(timed) / 1e3)})
        print(line)
        if args.json:
            with open(args.json, "w") as f:
                f.write(line + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
