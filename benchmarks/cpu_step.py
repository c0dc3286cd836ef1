#!/usr/bin/python3
"""Single-process CPU step time of zshard-train against PyTorch on the same work, in one run.

Why: the Foundation issue asks how far zshard's CPU path is from PyTorch's on one core. Both sides
train the same GPT-2 or Llama config at the same batch and sequence length on one thread (OpenBLAS and OpenMP
pinned to one thread, torch.set_num_threads(1)), with AdamW and no gradient clipping. Warm-up steps are
dropped on both sides.

Two figures per side:
  wall ms  zshard: the "ms" of its --log-json lines; PyTorch: benchmarks/peers/gpt2_torch.py bench, or
           llama_torch.py bench for the Llama cases (the peer follows the case's --model).
  CPU ms   process CPU time (user + system) per step, which other load on a shared machine disturbs far
           less than wall time. PyTorch measures it per step in-process; for zshard it is the CPU time
           of a run of warm-up + timed steps minus that of a run of the warm-up steps only, divided by
           the timed steps (startup and initialisation cancel out).
The machine may be shared, so the two sides run alternately, round after round (the order flipping
each round), and the medians over all timed steps (CPU ms: over rounds) are reported.

Run it with the system interpreter (/usr/bin/python3), which is the one with torch installed.
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))

def peer_script(model_flags):
    """The PyTorch peer of the case's model family: llama_torch.py for llama-*, else gpt2_torch.py."""
    model = model_flags[model_flags.index("--model") + 1]
    return os.path.join(HERE, "peers", "llama_torch.py" if model.startswith("llama") else "gpt2_torch.py")

# name: (model flags understood by both sides, batch, seq, warm-up steps, timed steps per round)
CASES = {
    "gpt2-B4-T256": (["--model", "gpt2"], 4, 256, 1, 3),
    "tiny-B8-T64": (["--model", "tiny"], 8, 64, 5, 30),
    "L4-D256-B8-T64": (["--model", "tiny", "--layers", "4", "--dim", "256", "--heads", "4"], 8, 64, 3, 20),
    "llama-tiny-B8-T64": (["--model", "llama-tiny"], 8, 64, 5, 30),
    "llama-L4-D256-B8-T64": (["--model", "llama-tiny", "--layers", "4", "--dim", "256", "--heads", "8",
                              "--kv-heads", "2", "--ffn-dim", "704"], 8, 64, 3, 20),
}

ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def children_cpu_s():
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_zshard(binary, model_flags, batch, seq, steps, log):
    """Runs zshard-train for `steps` steps; returns (per-step wall ms from its log, process CPU s)."""
    cmd = [binary, *model_flags, "--batch", str(batch), "--seq", str(seq), "--steps", str(steps),
           "--lr", "1e-4", "--lr-schedule", "constant", "--warmup", "0", "--grad-clip", "0",
           "--log-json", log, "--log-every", str(steps)]
    c0 = children_cpu_s()
    subprocess.run(cmd, check=True, env=dict(os.environ, **ONE_THREAD), stdout=subprocess.DEVNULL)
    cpu = children_cpu_s() - c0
    with open(log) as f:
        return [json.loads(line)["ms"] for line in f if line.strip()], cpu


def zshard_round(binary, model_flags, batch, seq, warmup, steps, workdir):
    """Returns (wall ms of the timed steps, CPU ms per timed step)."""
    log = os.path.join(workdir, "zshard_steps.jsonl")
    wall, cpu_full = run_zshard(binary, model_flags, batch, seq, warmup + steps, log)
    _, cpu_warmup = run_zshard(binary, model_flags, batch, seq, warmup, log)
    return wall[warmup:], (cpu_full - cpu_warmup) * 1e3 / steps


def torch_round(model_flags, batch, seq, warmup, steps):
    """Returns (wall ms of the timed steps, median CPU ms per timed step)."""
    cmd = [sys.executable, peer_script(model_flags), "bench", *model_flags, "--batch", str(batch), "--seq", str(seq),
           "--warmup", str(warmup), "--steps", str(steps)]
    out = subprocess.run(cmd, check=True, env=dict(os.environ, **ONE_THREAD), capture_output=True, text=True)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    return res["step_ms"], res["median_cpu_ms"]


def cpu_model():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--zshard-train", required=True, help="path to the zshard-train binary")
    p.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    p.add_argument("--rounds", type=int, default=2, help="alternating zshard/torch runs per case")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()

    print(f"cpu: {cpu_model()}, {os.cpu_count()} cores; load average at start {os.getloadavg()[0]:.2f}")
    print(f"{'case':>20} {'zshard wall':>12} {'torch wall':>11} {'ratio':>6} "
          f"{'zshard cpu':>11} {'torch cpu':>10} {'ratio':>6}   (ms per step, medians; ratio = zshard/torch)")
    results = []
    with tempfile.TemporaryDirectory(prefix="zshard_cpu_step_") as workdir:
        for name in args.cases:
            flags, B, T, warmup, steps = CASES[name]
            z_wall, z_cpu, t_wall, t_cpu = [], [], [], []
            for r in range(args.rounds):
                order = ("zshard", "torch") if r % 2 == 0 else ("torch", "zshard")
                for impl in order:
                    if impl == "zshard":
                        wall, cpu = zshard_round(args.zshard_train, flags, B, T, warmup, steps, workdir)
                        z_wall += wall
                        z_cpu.append(cpu)
                    else:
                        wall, cpu = torch_round(flags, B, T, warmup, steps)
                        t_wall += wall
                        t_cpu.append(cpu)
            res = {"case": name, "batch": B, "seq": T, "warmup": warmup, "rounds": args.rounds,
                   "zshard_wall_ms": statistics.median(z_wall), "torch_wall_ms": statistics.median(t_wall),
                   "zshard_cpu_ms": statistics.median(z_cpu), "torch_cpu_ms": statistics.median(t_cpu),
                   "zshard_wall_steps": z_wall, "torch_wall_steps": t_wall,
                   "zshard_cpu_rounds": z_cpu, "torch_cpu_rounds": t_cpu}
            res["wall_ratio"] = res["zshard_wall_ms"] / res["torch_wall_ms"]
            res["cpu_ratio"] = res["zshard_cpu_ms"] / res["torch_cpu_ms"]
            results.append(res)
            print(f"{name:>20} {res['zshard_wall_ms']:12.1f} {res['torch_wall_ms']:11.1f} {res['wall_ratio']:6.2f} "
                  f"{res['zshard_cpu_ms']:11.1f} {res['torch_cpu_ms']:10.1f} {res['cpu_ratio']:6.2f}", flush=True)
    print(f"load average at end {os.getloadavg()[0]:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": cpu_model(), "cores": os.cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M"),
                       "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
