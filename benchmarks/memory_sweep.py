#!/usr/bin/python3
"""Memory per rank in the style of the ZeRO paper, and the estimator's largest batch checked by running it.
For each case, every strategy with and without activation checkpointing and optimizer offload:

  - the peak per rank at the case's batch (zshard-bench, measured by the tracking allocator over a warm-up
    step and a timed one, so that zero3's prefetch is in it) beside the estimate (zshard-mem);
  - the largest micro-batch per rank that zshard-mem --max-batch says fits the budget, run (zshard-bench)
    at that batch, whose measured peak must fit the budget, and at one sequence more, whose peak must exceed
    it; where it does not, the estimator is conservative and the slack (the budget's share left unused at
    one more) is reported.

  /usr/bin/python3 benchmarks/memory_sweep.py --bin build --np 4 \\
      --case llama-tiny:16:64:64MiB --case gpt2/layers=2:4:16:+4MiB --out benchmarks/results

MODEL may carry configuration overrides after a slash (gpt2/layers=2 is --model gpt2 --config layers=2).
A BUDGET of +SIZE gives each strategy and setting a budget of its own: the estimate at the case's batch plus
SIZE, so that the largest batch stays a few sequences where one budget would leave one strategy with none
and another with more than a CPU can run (ddp's states are four times zero3's; on the cpu offload adds the
host's master and Adam state to the same memory).
Writes memory_sweep.json and memory_sweep.md into --out; benchmarks/plot.py --memory-sweep draws it.
"""

import argparse
import json
import os
import re
import subprocess

STRATEGIES = "ddp,zero1,zero2,zero3,hybrid"
SAVERS = [("none", "none", "none"), ("blocks", "none", "blocks"), ("none", "optimizer", "offload"),
          ("blocks", "optimizer", "blocks+offload")]  # checkpointing, offload, zshard-mem --max-batch's name
UNITS = {"kib": 2**10, "mib": 2**20, "gib": 2**30, "kb": 1e3, "mb": 1e6, "gb": 1e9, "": 1}


def parse_size(text):
    m = re.fullmatch(r"([0-9.]+)\s*([a-zA-Z]*)", text)
    if not m or m.group(2).lower() not in UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text}")
    return int(float(m.group(1)) * UNITS[m.group(2).lower()])


def parse_case(text):
    parts = text.split(":")
    if len(parts) not in (4, 5):
        raise argparse.ArgumentTypeError(f"--case MODEL[/CONFIG]:BATCH:SEQ:BUDGET[:STRATEGIES], got {text}")
    name, _, config = parts[0].partition("/")
    margin = parts[3].startswith("+")
    return {"model": parts[0], "model_flags": ["--model", name] + (["--config", config] if config else []),
            "batch": int(parts[1]), "seq": int(parts[2]), "budget_text": parts[3],
            "budget": None if margin else parse_size(parts[3]), "margin": parse_size(parts[3][1:]) if margin else None,
            "strategies": parts[4] if len(parts) == 5 else STRATEGIES}


def run(cmd):
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def bench(args, case, strategies, batch, ac, offload, path):
    """zshard-bench's JSON results by strategy: a warm-up step and a timed one."""
    run(["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(args.np), os.path.join(args.bin, "zshard-bench"),
         *case["model_flags"], "--batch", str(batch), "--seq", str(case["seq"]), "--warmup-steps", "1", "--steps",
         "1", "--strategies", strategies, "--activation-checkpointing", ac, "--offload", offload, "--json", path])
    with open(path) as f:
        return {r["strategy"]: r for r in json.load(f)["results"]}


def mem(args, case, extra, path):
    run([os.path.join(args.bin, "zshard-mem"), *case["model_flags"], "--world", str(args.np), "--strategy",
         case["strategies"], "--seq", str(case["seq"]), *extra, "--json", path])
    with open(path) as f:
        return json.load(f)


def largest_batches(args, case, strategies, budget, path):
    """zshard-mem --max-batch: the most sequences per rank that fit the budget, by strategy and setting."""
    doc = mem(args, {**case, "strategies": strategies}, ["--max-batch", "--mem-budget", str(budget)], path)
    return {r["strategy"]: r["max_rank_batch"] for r in doc["max_batch"]}


def verify(args, case, strategy, ac, offload, largest, budget, scratch, tag):
    """Runs at the estimator's largest batch per rank and at one more: their peaks, and the batch the runs prove."""
    peaks = {}
    for rank_batch in ([largest] if largest > 0 else []) + [largest + 1]:
        path = os.path.join(scratch, f"verify_{tag}_{strategy}_{rank_batch}.json")
        peaks[rank_batch] = bench(args, case, strategy, args.np * rank_batch, ac, offload, path)[strategy][
            "peak_total_bytes"]
    at, above = peaks.get(largest), peaks[largest + 1]
    out = {"peak_at_largest": at, "peak_at_next": above, "slack": None}
    if at is not None and at > budget:
        out["verdict"] = "estimate does not fit"
        out["largest_batch_verified"] = largest - 1
    elif above <= budget:
        out["verdict"] = "conservative"
        out["largest_batch_verified"] = largest + 1
        out["slack"] = (budget - above) / budget
    else:
        out["verdict"] = "exact"
        out["largest_batch_verified"] = largest
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bin", default="build", help="directory of zshard-bench and zshard-mem")
    p.add_argument("--np", type=int, default=4)
    p.add_argument("--case", type=parse_case, action="append", required=True,
                   help="MODEL[/CONFIG]:BATCH:SEQ:BUDGET[:STRATEGIES] (BATCH global; BUDGET per rank, e.g. 4GiB, "
                        "or +SIZE: the estimate at BATCH plus SIZE, per strategy and setting)")
    p.add_argument("--out", default="benchmarks/results")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    scratch = os.path.join(args.out, "memory_sweep_runs")
    os.makedirs(scratch, exist_ok=True)
    rows = []
    for case in args.case:
        safe = re.sub(r"[^A-Za-z0-9.-]", "_", case["model"] + "_" + case["budget_text"])
        if case["budget"] is not None:
            largest = largest_batches(args, case, case["strategies"], case["budget"],
                                      os.path.join(scratch, f"max_{safe}.json"))
        rank_batch = -(-case["batch"] // args.np)
        for ac, offload, saver in SAVERS:
            tag = f"{safe}_{ac}_{offload}"
            measured = bench(args, case, case["strategies"], case["batch"], ac, offload,
                             os.path.join(scratch, f"bench_{tag}.json"))
            est = {r["strategy"]: r for r in mem(args, case, ["--batch", str(case["batch"]), "--activation-checkpointing",
                                                              ac, "--offload", offload],
                                                 os.path.join(scratch, f"mem_{tag}.json"))["rows"]}
            for strategy, r in measured.items():
                e = est[strategy]
                budget = case["budget"]
                if budget is None:
                    budget = e["total_bytes"] + case["margin"]
                    largest = largest_batches(args, case, strategy, budget,
                                              os.path.join(scratch, f"max_{tag}_{strategy}.json"))
                row = {"model": case["model"], "strategy": strategy, "activation_checkpointing": ac,
                       "offload": offload, "world": args.np, "rank_batch": rank_batch, "seq": case["seq"],
                       "peak_measured": r["peak_total_bytes"], "peak_predicted": e["step_bytes"],
                       "states_measured": r["model_states_bytes"]["measured"],
                       "states_predicted": e["model_states_bytes"], "budget": budget,
                       "largest_batch_predicted": largest[strategy][saver]}
                row.update(verify(args, case, strategy, ac, offload, row["largest_batch_predicted"], budget,
                                  scratch, tag))
                rows.append(row)
    with open(os.path.join(args.out, "memory_sweep.json"), "w") as f:
        json.dump({"tool": "memory_sweep", "rows": rows}, f, indent=1)
    mib = 2**20
    lines = ["| model | strategy | ckpt | offload | peak MiB meas / pred | ratio | states ratio | budget MiB "
             "| largest batch (estimate) | peak MiB at it | at one more | verdict |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        at = "-" if r["peak_at_largest"] is None else f"{r['peak_at_largest'] / mib:.1f}"
        verdict = r["verdict"] + (f" (slack {100 * r['slack']:.1f}%)" if r["slack"] is not None else "")
        lines.append(f"| {r['model']} | {r['strategy']} | {r['activation_checkpointing']} | {r['offload']} | "
                     f"{r['peak_measured'] / mib:.1f} / {r['peak_predicted'] / mib:.1f} | "
                     f"{r['peak_predicted'] / r['peak_measured']:.3f} | "
                     f"{r['states_predicted'] / r['states_measured']:.3f} | {r['budget'] / mib:.1f} | "
                     f"{r['largest_batch_predicted']} | {at} | {r['peak_at_next'] / mib:.1f} | {verdict} |")
    with open(os.path.join(args.out, "memory_sweep.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
