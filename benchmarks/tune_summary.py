#!/usr/bin/python3
"""The summary of benchmarks/tune_exhaustive.sh: the exhaustive ranking, each tuner run against it, and the
contenders (every pick and the exhaustive fastest 3) re-timed in interleaved rounds of zshard-bench."""

import argparse
import json
import os
import statistics
import subprocess


def bench_command(args, doc, flags, path):
    config = ",".join(f"{k}={v}" for k, v in doc["model"]["config"].items())
    flags = ["--strategies" if f == "--strategy" else f for f in flags]
    launcher = [w.replace("{np}", str(doc["world"])) for w in args.launcher.split()]
    return launcher + [os.path.join(args.bin, "zshard-bench"), "--model", doc["model"]["name"], "--config", config,
                       "--seq", str(doc["seq"])] + flags + ["--warmup-steps", "1", "--steps", "5", "--json", path]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bin", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--repeats", type=int, required=True)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--launcher", required=True)
    args = p.parse_args()
    ex = json.load(open(os.path.join(args.out, "exhaustive.json")))
    tunes = [json.load(open(os.path.join(args.out, f"tune_{r}.json"))) for r in range(1, args.repeats + 1)]
    timed = sorted((c for c in ex["candidates"] if c.get("run", {}).get("status") == "ok"),
                   key=lambda c: c["run"]["step_ms"])
    misses = [c for c in ex["candidates"] if c.get("run", {}).get("status") in ("over budget", "out of memory")]
    best = timed[0]["run"]["step_ms"]
    print(f"## Exhaustive: {len(timed)} of {sum(c['fits'] for c in ex['candidates'])} fitting candidates ran "
          f"({len(ex['candidates'])} in the space), {ex['elapsed_s']:.0f} s; over budget or out of memory: "
          f"{len(misses)}\n")
    print("| measured rank | candidate | step ms | / best | predicted rank | predicted ms | peak MiB | estimate MiB |")
    print("|---|---|---|---|---|---|---|---|")
    for i, c in enumerate(timed, 1):
        print(f"| {i} | {c['label']} | {c['run']['step_ms']:.1f} | {c['run']['step_ms'] / best:.3f} | "
              f"{c['predicted']['rank']} | {c['predicted']['step_ms']:.1f} | {c['run']['peak_bytes'] / 2**20:.1f} | "
              f"{c['estimate_bytes'] / 2**20:.1f} |")
    ranks = {c["label"]: i for i, c in enumerate(timed, 1)}
    print("\n## zshard-tune runs against it\n")
    print("| run | pick | its step ms (tuner) | its step ms (exhaustive) | / exhaustive best | runs | wall s | "
          "/ exhaustive wall |")
    print("|---|---|---|---|---|---|---|---|")
    for r, t in enumerate(tunes, 1):
        w = t["winner"]
        in_ex = next(c for c in timed if c["label"] == w["label"]) if w["label"] in ranks else None
        ex_ms = in_ex["run"]["step_ms"] if in_ex else float("nan")
        runs = sum(len(c["run"].get("step_ms_runs") or [0]) for c in t["candidates"] if "run" in c)
        print(f"| {r} | {w['label']} (exhaustive rank {ranks.get(w['label'], '-')}) | {w['step_ms']:.1f} | "
              f"{ex_ms:.1f} | {ex_ms / best:.3f} | {runs} | "
              f"{t['elapsed_s']:.0f} | {t['elapsed_s'] / ex['elapsed_s']:.3f} |")

    # The contenders, re-timed in interleaved rounds.
    contenders = list(dict.fromkeys([t["winner"]["label"] for t in tunes] + [c["label"] for c in timed[:3]]))
    flags = {c["label"]: c["flags"] for c in ex["candidates"]}
    times = {label: [] for label in contenders}
    for rnd in range(args.rounds):
        for label in contenders:
            path = os.path.join(args.out, f"retime_{rnd}_{contenders.index(label)}.json")
            subprocess.run(bench_command(args, ex, flags[label], path), check=True, stdout=subprocess.DEVNULL)
            times[label].append(json.load(open(path))["results"][0]["step_ms"]["median"])
    ref_min = min(min(v) for v in times.values())
    ref_med = min(statistics.median(v) for v in times.values())
    print(f"\n## Re-timed, {args.rounds} interleaved rounds of 1 warm-up and 5 timed steps (median step per round)\n")
    print("| candidate | picked by the tuner | exhaustive rank | min ms | / best min | median ms | / best median |")
    print("|---|---|---|---|---|---|---|")
    for label in contenders:
        v = times[label]
        picks = sum(t["winner"]["label"] == label for t in tunes)
        print(f"| {label} | {picks} of {len(tunes)} | {ranks.get(label, '-')} | {min(v):.1f} | {min(v) / ref_min:.3f} | "
              f"{statistics.median(v):.1f} | {statistics.median(v) / ref_med:.3f} |")


if __name__ == "__main__":
    main()
