#!/usr/bin/python3
"""Single-process CPU step time of zshard-train against PyTorch on the same work, in one run.

Why: the Foundation issue asks how far zshard's CPU path is from PyTorch's on one core. Both sides
train the same GPT-2 config at the same batch and sequence length on one thread (OpenBLAS and OpenMP
pinned to one thread, torch.set_num_threads(1)), with AdamW and no gradient clipping. zshard's step
time is the "ms" of its --log-json lines; PyTorch's comes from benchmarks/peers/gpt2_torch.py bench.
Warm-up steps are dropped on both sides. The machine may be shared, so the two are run alternately,
round after round (the order flipping each round), and the medians over all timed steps are reported.

Run it with the system interpreter (/usr/bin/python3), which is the one with torch installed.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PEER = os.path.join(HERE, "peers", "gpt2_torch.py")

# name: (model flags shared by both sides, batch, seq, warm-up steps, timed steps per round)
CASES = {
    "gpt2-B4-T256": (["--model", "gpt2"], 4, 256, 1, 3),
    "tiny-B8-T64": (["--model", "tiny"], 8, 64, 5, 30),
    "L4-D256-B8-T64": (["--model", "tiny", "--layers", "4", "--dim", "256", "--heads", "4"], 8, 64, 3, 20),
}

ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def run_zshard(binary, model_flags, batch, seq, warmup, steps, workdir):
    log = os.path.join(workdir, "zshard_steps.jsonl")
    cmd = [binary, *model_flags, "--batch", str(batch), "--seq", str(seq), "--steps", str(warmup + steps),
           "--lr", "1e-4", "--lr-schedule", "constant", "--warmup", "0", "--grad-clip", "0",
           "--log-json", log, "--log-every", str(warmup + steps)]
    subprocess.run(cmd, check=True, env=dict(os.environ, **ONE_THREAD), stdout=subprocess.DEVNULL)
    with open(log) as f:
        ms = [json.loads(line)["ms"] for line in f if line.strip()]
    return ms[warmup:]


def run_torch(model_flags, batch, seq, warmup, steps):
    cmd = [sys.executable, PEER, "bench", *model_flags, "--batch", str(batch), "--seq", str(seq),
           "--warmup", str(warmup), "--steps", str(steps)]
    out = subprocess.run(cmd, check=True, env=dict(os.environ, **ONE_THREAD), capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["step_ms"]


def cpu_model():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--zshard-train", required=True, help="path to the zshard-train binary")
    p.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    p.add_argument("--rounds", type=int, default=2, help="alternating zshard/torch runs per case")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()

    print(f"cpu: {cpu_model()}, {os.cpu_count()} cores; load average at start {os.getloadavg()[0]:.2f}")
    results = []
    with tempfile.TemporaryDirectory(prefix="zshard_cpu_step_") as workdir:
        for name in args.cases:
            flags, B, T, warmup, steps = CASES[name]
            z, t = [], []
            for r in range(args.rounds):
                order = ("zshard", "torch") if r % 2 == 0 else ("torch", "zshard")
                for impl in order:
                    if impl == "zshard":
                        z += run_zshard(args.zshard_train, flags, B, T, warmup, steps, workdir)
                    else:
                        t += run_torch(flags, B, T, warmup, steps)
            res = {"case": name, "batch": B, "seq": T, "warmup": warmup, "timed_steps": len(z),
                   "zshard_median_ms": statistics.median(z), "torch_median_ms": statistics.median(t),
                   "zshard_ms": z, "torch_ms": t}
            res["ratio_zshard_over_torch"] = res["zshard_median_ms"] / res["torch_median_ms"]
            results.append(res)
            print(f"{name:>16}: zshard {res['zshard_median_ms']:9.1f} ms  torch {res['torch_median_ms']:9.1f} ms"
                  f"  zshard/torch {res['ratio_zshard_over_torch']:.2f}  ({len(z)}+{len(t)} timed steps)",
                  flush=True)
    print(f"load average at end {os.getloadavg()[0]:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": cpu_model(), "cores": os.cpu_count(), "date": time.strftime("%Y-%m-%d"),
                       "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
