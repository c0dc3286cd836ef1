#!/usr/bin/python3
"""Memory per rank in the style of the ZeRO paper: for each model, every strategy with and without
activation checkpointing and optimizer offload, the peak per rank at a fixed batch (zshard-bench,
measured by the tracking allocator) beside the estimate (zshard-mem), and the largest micro-batch per rank
under a budget: predicted by zshard-mem, and derived from the measurement (the measured peak less its
activations, plus the measured activation bytes per sequence, which grow linearly with the batch).

  /usr/bin/python3 benchmarks/memory_sweep.py --bin build --np 4 \
      --case gpt2-medium:4:128:4GiB:zero1,zero2,zero3,hybrid --case llama-tiny:16:64:64MiB \
      --out benchmarks/results

Writes memory_sweep.json and memory_sweep.md into --out; benchmarks/plot.py --memory-sweep draws it.
"""

import argparse
import json
import os
import re
import subprocess

STRATEGIES = "ddp,zero1,zero2,zero3,hybrid"
UNITS = {"kib": 2**10, "mib": 2**20, "gib": 2**30, "kb": 1e3, "mb": 1e6, "gb": 1e9, "": 1}


def parse_size(text):
    m = re.fullmatch(r"([0-9.]+)\s*([a-zA-Z]*)", text)
    if not m or m.group(2).lower() not in UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text}")
    return int(float(m.group(1)) * UNITS[m.group(2).lower()])


def parse_case(text):
    parts = text.split(":")
    if len(parts) not in (4, 5):
        raise argparse.ArgumentTypeError(f"--case MODEL:BATCH:SEQ:BUDGET[:STRATEGIES], got {text}")
    return {"model": parts[0], "batch": int(parts[1]), "seq": int(parts[2]), "budget_text": parts[3],
            "budget": parse_size(parts[3]), "strategies": parts[4] if len(parts) == 5 else STRATEGIES}


def run(cmd):
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def measure(args, case, ac, offload, path):
    run(["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(args.np), os.path.join(args.bin, "zshard-bench"),
         "--model", case["model"], "--batch", str(case["batch"]), "--seq", str(case["seq"]), "--warmup-steps", "0",
         "--steps", "1", "--strategies", case["strategies"], "--activation-checkpointing", ac, "--offload", offload,
         "--json", path])
    with open(path) as f:
        return json.load(f)


def estimate(args, case, ac, offload, path):
    run([os.path.join(args.bin, "zshard-mem"), "--model", case["model"], "--world", str(args.np), "--strategy",
         case["strategies"], "--batch", str(case["batch"]), "--seq", str(case["seq"]), "--activation-checkpointing",
         ac, "--offload", offload, "--device-mem", case["budget_text"], "--json", path])
    with open(path) as f:
        return {row["strategy"]: row for row in json.load(f)["rows"]}


def largest_measured_batch(result, rank_batch, budget):
    """The measured peak of the rank with the most activations, its activations scaled to each batch."""
    best = None
    for rank in result["memory_report"]["ranks"]:
        acts = rank["peak"]["activations"]
        per_sequence = acts / rank_batch
        fixed = rank["peak_total"] - acts
        fit = int((budget - fixed) // per_sequence) if budget > fixed else 0
        best = fit if best is None else min(best, fit)
    return best


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bin", default="build", help="directory of zshard-bench and zshard-mem")
    p.add_argument("--np", type=int, default=4)
    p.add_argument("--case", type=parse_case, action="append", required=True,
                   help="MODEL:BATCH:SEQ:BUDGET[:STRATEGIES] (BATCH global; BUDGET per rank, e.g. 4GiB)")
    p.add_argument("--out", default="benchmarks/results")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    scratch = os.path.join(args.out, "memory_sweep_runs")
    os.makedirs(scratch, exist_ok=True)
    rows = []
    for case in args.case:
        rank_batch = -(-case["batch"] // args.np)
        for ac in ("none", "blocks"):
            for offload in ("none", "optimizer"):
                tag = f"{case['model']}_{ac}_{offload}"
                bench = measure(args, case, ac, offload, os.path.join(scratch, f"bench_{tag}.json"))
                est = estimate(args, case, ac, offload, os.path.join(scratch, f"mem_{tag}.json"))
                for r in bench["results"]:
                    e = est[r["strategy"]]
                    rows.append({
                        "model": case["model"], "strategy": r["strategy"], "activation_checkpointing": ac,
                        "offload": offload, "world": args.np, "rank_batch": rank_batch, "seq": case["seq"],
                        "peak_measured": r["peak_total_bytes"], "peak_predicted": e["total_bytes"],
                        "states_measured": r["model_states_bytes"]["measured"],
                        "states_predicted": e["model_states_bytes"], "budget": case["budget"],
                        "largest_batch_measured": largest_measured_batch(r, rank_batch, case["budget"]),
                        "largest_batch_predicted": e.get("max_rank_batch"),
                    })
    with open(os.path.join(args.out, "memory_sweep.json"), "w") as f:
        json.dump({"tool": "memory_sweep", "rows": rows}, f, indent=1)
    lines = ["| model | strategy | ckpt | offload | peak MiB meas / pred | ratio | states ratio | largest batch meas / pred |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['strategy']} | {r['activation_checkpointing']} | {r['offload']} | "
                     f"{r['peak_measured'] / 2**20:.1f} / {r['peak_predicted'] / 2**20:.1f} | "
                     f"{r['peak_predicted'] / r['peak_measured']:.3f} | "
                     f"{r['states_predicted'] / r['states_measured']:.3f} | "
                     f"{r['largest_batch_measured']} / {r['largest_batch_predicted']} |")
    with open(os.path.join(args.out, "memory_sweep.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
