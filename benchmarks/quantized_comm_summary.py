#!/usr/bin/python3
"""The helper of benchmarks/quantized_comm.sh:

  quantized_comm_summary.py WORK SUMMARY_JSON --warmup N --steps N
      every run listed in WORK/runs.tsv (tag, part, model, link, flags) into SUMMARY_JSON, and the
      markdown tables on stdout.

Per run, from zshard-train's --log-json: every step's loss (the curves) and time; the final loss, as the last
step's, as the mean of the last FINAL_STEPS steps' and as the evaluation after the last step; the step time over the steps after --warmup (median,
p10 and p90, interpolated as zshard-bench does), the exposed communication and the step less it (medians);
zshard's count of the bytes each rank's collectives sent a step. From count_eth0.sh, the bytes each host's
eth0 sent per rank and per step of the run, set-up included (network_sweep_summary.py's wire_bytes). The
shaped link's runs add zshard-bench's replay of their collectives (the link's time without the compute).
Each run's loss is compared with its reference: the unquantized zero3 run of the same part and model. The
seeds: the link's model at each seed (the seedN parts, and the link part at the default seed), each
setting's final evaluation against zero3's of the same seed, and the mean of those differences.
"""

import argparse
import json
import os
import statistics
import subprocess

from network_sweep_summary import load, wire_bytes

FINAL_STEPS = 10
MIB = 1048576


def percentile(values, q):
    v = sorted(values)
    pos = q * (len(v) - 1)
    i = int(pos)
    return v[i] + (pos - i) * (v[i + 1] - v[i]) if i + 1 < len(v) else v[-1]


def read_steps(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def read_loads(work):
    """TAG -> {"before"|"after": (time, "load1 load5 load15")} from loads.txt."""
    loads = {}
    with open(os.path.join(work, "loads.txt")) as f:
        for line in f:
            tag, when, time, *load = line.split()
            loads.setdefault(tag, {})[when] = (time, " ".join(load))
    return loads


def is_reference(run):
    flags = run["flags"].split()
    return "--quantize-gathers" not in flags and "--quantize-reductions" not in flags and \
        flags[flags.index("--strategy") + 1] == "zero3"


def summarise_run(work, tag, part, model, link, flags, loads, warmup, steps):
    records = read_steps(os.path.join(work, f"{tag}.json"))
    timed = records[warmup:]
    ms = [r["ms"] for r in timed]
    losses = [r["loss"] for r in records]
    run = {
        "tag": tag, "part": part, "model": model, "link": link, "flags": flags, "steps": len(records),
        "final_loss": losses[-1], "final_loss_mean": statistics.fmean(losses[-FINAL_STEPS:]),
        "final_eval_loss": next(r["eval_loss"] for r in reversed(records) if "eval_loss" in r),
        "step_ms": percentile(ms, 0.5), "step_ms_p10": percentile(ms, 0.1), "step_ms_p90": percentile(ms, 0.9),
        "comm_exposed_ms": percentile([r["comm_exposed_ms"] for r in timed], 0.5),
        "step_less_exposed_ms": percentile([r["ms"] - r["comm_exposed_ms"] for r in timed], 0.5),
        "comm_bytes_per_step": records[-1]["comm_bytes"],
        "eth0_sent_bytes_per_step": wire_bytes(work, tag, steps),
        "started": loads[tag]["before"][0], "ended": loads[tag]["after"][0],
        "load_before": loads[tag]["before"][1], "load_after": loads[tag]["after"][1],
        "losses": losses, "step_ms_all": [round(r["ms"], 1) for r in records],
    }
    bench = os.path.join(work, f"{tag}.bench.json")
    if os.path.exists(bench):
        r = load(bench)["results"][0]
        run["bench_step_ms"] = r["step_ms"]["median"]
        run["bench_comm_exposed_ms"] = r["comm_ms_per_step"]["exposed"]
        run["bench_comm_replayed_ms"] = r["comm_ms_per_step"]["total"]
    return run


def reference_of(run, runs):
    part = "accuracy" if run["part"] == "repeat" else run["part"]
    return next(r for r in runs if r["part"] == part and r["model"] == run["model"] and is_reference(r))


def compare(runs):
    """Each run against its reference: the relative loss difference, and on the shaped link the bytes
    and the speed against zero3 and ddp unquantized."""
    ddp = next((r for r in runs if r["part"] == "link" and "ddp" in r["flags"].split()), None)
    for run in runs:
        ref = reference_of(run, runs)
        run["reference"] = ref["tag"]
        run["final_loss_vs_reference"] = run["final_loss"] / ref["final_loss"] - 1
        run["final_loss_mean_vs_reference"] = run["final_loss_mean"] / ref["final_loss_mean"] - 1
        run["final_eval_loss_vs_reference"] = run["final_eval_loss"] / ref["final_eval_loss"] - 1
        if run["part"] == "link":
            run["eth0_bytes_reduction_vs_reference"] = ref["eth0_sent_bytes_per_step"] / run["eth0_sent_bytes_per_step"]
            run["speedup_vs_reference"] = ref["step_ms"] / run["step_ms"]
            run["speedup_vs_ddp"] = ddp["step_ms"] / run["step_ms"]


def determinism(runs):
    """The repeated run against the accuracy run of the same flags: are the per-step losses the same bits
    (JSON's shortest round-trip form of each double)?"""
    out = []
    for again in (r for r in runs if r["part"] == "repeat"):
        first = next(r for r in runs if r["part"] == "accuracy" and r["flags"] == again["flags"])
        differing = [i + 1 for i, (a, b) in enumerate(zip(first["losses"], again["losses"])) if a != b]
        out.append({"runs": [first["tag"], again["tag"]], "flags": again["flags"],
                    "bit_identical": not differing and len(first["losses"]) == len(again["losses"]),
                    "steps_differing": len(differing), "first_differing_step": differing[0] if differing else None})
    return out


def seed_of(run):
    flags = run["flags"].split()
    return int(flags[flags.index("--seed") + 1]) if "--seed" in flags else None


def across_seeds(runs):
    """Per setting of the link's model (the seedN parts and the link part), each seed's final evaluation
    against zero3's at the same seed, and their mean."""
    out = {}
    for run in (r for r in runs if r["part"] == "link" or r["part"].startswith("seed")):
        entry = out.setdefault(setting(run["flags"]), {"seeds": {}})
        seed = "default seed (the link's runs)" if run["part"] == "link" else str(seed_of(run))
        entry["seeds"][seed] = {"eval_loss": run["final_eval_loss"],
                                                          "vs_zero3": run["final_eval_loss_vs_reference"]}
    for entry in out.values():
        diffs = [s["vs_zero3"] for s in entry["seeds"].values()]
        entry["mean_vs_zero3"] = statistics.fmean(diffs)
        entry["largest_vs_zero3"] = max(diffs, key=abs)
    return out


def machine(work):
    def first_line(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.splitlines()[0]
        except (OSError, subprocess.CalledProcessError, IndexError):
            return None
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               None)
    mem_kib = next(int(line.split()[1]) for line in open("/proc/meminfo") if line.startswith("MemTotal"))
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": round(mem_kib / 2**20, 1),
            "mpi": first_line(["mpirun", "--version"]),
            "commits": open(os.path.join(work, "commit")).read().split("\n")[:-1]}


def summarise(args):
    loads = read_loads(args.work)
    with open(os.path.join(args.work, "runs.tsv")) as f:
        rows = [line.rstrip("\n").split("\t") for line in f if line.strip()]
    runs = [summarise_run(args.work, *row, loads, args.warmup, args.steps) for row in rows]
    compare(runs)
    doc = {
        "first_run": runs[0]["started"], "last_run": runs[-1]["ended"], "machine": machine(args.work),
        "steps": args.steps, "warmup_steps": args.warmup, "final_steps": FINAL_STEPS, "hosts": "2,2",
        "determinism": determinism(runs), "across_seeds": across_seeds(runs), "runs": runs,
    }
    with open(args.summary, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print_tables(doc)


def setting(flags):
    """The strategy and the quantization flags of a run, e.g. "zero3 gathers int8, reductions int4"."""
    words = flags.split()
    named = [f"{w[len('--quantize-'):]} {words[i + 1]}" for i, w in enumerate(words) if w.startswith("--quantize-")]
    return " ".join([words[words.index("--strategy") + 1], ", ".join(named)]).strip()


def print_tables(doc):
    print(f"| model | run | final loss: last step | mean of last {doc['final_steps']} | evaluated | vs zero3 "
          "(last / mean / evaluated) | step ms (p10-p90) | eth0 MiB sent |")
    print("|---|---|---|---|---|---|---|---|")
    for r in (r for r in doc["runs"] if r["part"] == "accuracy"):
        print(f"| {r['model']} | {setting(r['flags'])} | {r['final_loss']:.4f} | {r['final_loss_mean']:.4f} | "
              f"{r['final_eval_loss']:.4f} | {r['final_loss_vs_reference']:+.2%} / "
              f"{r['final_loss_mean_vs_reference']:+.2%} / {r['final_eval_loss_vs_reference']:+.2%} | "
              f"{r['step_ms']:.0f} ({r['step_ms_p10']:.0f}-{r['step_ms_p90']:.0f}) | "
              f"{r['eth0_sent_bytes_per_step'] / MIB:.2f} |")
    for d in doc["determinism"]:
        print(f"\nrepeat of {d['runs'][0]}: bit-identical {d['bit_identical']} "
              f"({d['steps_differing']} steps differ)")
    print(f"\n| run | step ms (p10-p90) | exposed comm ms | step less exposed ms | replayed comm ms | "
          f"zshard MiB | eth0 MiB sent | fewer bytes than zero3 | speed-up vs zero3 / ddp | "
          f"final loss: last / mean of last {doc['final_steps']} / evaluated | vs zero3 (last / mean / evaluated) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in (r for r in doc["runs"] if r["part"] == "link"):
        print(f"| {setting(r['flags'])} | {r['step_ms']:.0f} ({r['step_ms_p10']:.0f}-{r['step_ms_p90']:.0f}) | "
              f"{r['comm_exposed_ms']:.0f} | {r['step_less_exposed_ms']:.0f} | {r['bench_comm_replayed_ms']:.0f} | "
              f"{r['comm_bytes_per_step'] / MIB:.1f} | {r['eth0_sent_bytes_per_step'] / MIB:.1f} | "
              f"{r['eth0_bytes_reduction_vs_reference']:.2f}x | {r['speedup_vs_reference']:.2f}x / "
              f"{r['speedup_vs_ddp']:.2f}x | {r['final_loss']:.4f} / {r['final_loss_mean']:.4f} / "
              f"{r['final_eval_loss']:.4f} | {r['final_loss_vs_reference']:+.2%} / "
              f"{r['final_loss_mean_vs_reference']:+.2%} / {r['final_eval_loss_vs_reference']:+.2%} |")
    seeds = sorted({s for e in doc["across_seeds"].values() for s in e["seeds"]})
    if not seeds:
        return
    print(f"\n| run | " + " | ".join(f"{'seed ' + s if s.isdigit() else s}: evaluated (vs zero3)" for s in seeds) + " | mean vs zero3 |")
    print("|---|" + "---|" * (len(seeds) + 1))
    for name, e in doc["across_seeds"].items():
        cells = [f"{e['seeds'][s]['eval_loss']:.4f} ({e['seeds'][s]['vs_zero3']:+.2%})" if s in e["seeds"] else ""
                 for s in seeds]
        print(f"| {name} | " + " | ".join(cells) + f" | {e['mean_vs_zero3']:+.2%} |")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("work")
    p.add_argument("summary")
    p.add_argument("--warmup", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    summarise(p.parse_args())


if __name__ == "__main__":
    main()
