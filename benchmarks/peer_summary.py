#!/usr/bin/python3
"""The summary of benchmarks/peer_compare.sh: median step times of zshard ddp and zero3 and PyTorch DDP over
the repeats, and their ratios, as markdown on stdout; OUT/summary.csv keeps each repeat's median step and
the load average before each run, the record that stays once the per-run JSON files are gone.

    benchmarks/peer_summary.py OUT --repeats N --nps 2 4 [--poll-ab]
"""

import argparse
import csv
import json
import os
import statistics


def read_loads(out):
    """Run name -> 1-minute load average before it, from OUT/loads.txt where the script wrote one."""
    path = os.path.join(out, "loads.txt")
    if not os.path.exists(path):
        return {}
    return {name: load for name, load, *_ in (line.split() for line in open(path) if line.strip())}


def zshard_medians(out, prefix, np, repeats):
    """Per strategy, the per-repeat median step times; and what the runs said of their waits' back-off."""
    medians, backoff = {"ddp": [], "zero3": []}, set()
    for r in range(1, repeats + 1):
        doc = json.load(open(os.path.join(out, f"{prefix}_np{np}_{r}.json")))
        backoff.add(doc.get("poll_backoff"))
        for res in doc["results"]:
            medians[res["strategy"]].append(res["step_ms"]["median"])
    return medians, backoff


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out")
    p.add_argument("--repeats", type=int, required=True)
    p.add_argument("--nps", type=int, nargs="+", required=True)
    p.add_argument("--poll-ab", action="store_true", help="the runs include zshard_nobackoff_* (POLL_AB=1)")
    args = p.parse_args()
    out, repeats = args.out, args.repeats
    loads = read_loads(out)
    rows = []

    print("| np | torch DDP ms | zshard ddp ms | zshard zero3 ms | torch/ddp | torch/zero3 | zshard waits back off |")
    print("|---|---|---|---|---|---|---|")
    for np in args.nps:
        torch = [json.load(open(os.path.join(out, f"torch_np{np}_{r}.json")))["step_ms"]["median"]
                 for r in range(1, repeats + 1)]
        zs, backoff = zshard_medians(out, "zshard", np, repeats)
        off = zshard_medians(out, "zshard_nobackoff", np, repeats)[0] if args.poll_ab else None
        t, d, z = statistics.median(torch), statistics.median(zs["ddp"]), statistics.median(zs["zero3"])
        print(f"| {np} | {t:.1f} | {d:.1f} | {z:.1f} | {t / d:.2f} | {t / z:.2f} | {'/'.join(map(str, backoff))} |")
        for i in range(repeats):
            run = f"np{np}_{i + 1}"
            row = {"np": np, "repeat": i + 1, "torch_ddp_ms": f"{torch[i]:.3f}", "zshard_ddp_ms": f"{zs['ddp'][i]:.3f}",
                   "zshard_zero3_ms": f"{zs['zero3'][i]:.3f}"}
            if off:
                row.update({"zshard_nobackoff_ddp_ms": f"{off['ddp'][i]:.3f}",
                            "zshard_nobackoff_zero3_ms": f"{off['zero3'][i]:.3f}"})
            # In run order: zshard, zshard without back-off, torch.
            row["load_before_zshard"] = loads.get(f"zshard_{run}", "")
            if off:
                row["load_before_zshard_nobackoff"] = loads.get(f"zshard_nobackoff_{run}", "")
            row["load_before_torch"] = loads.get(f"torch_{run}", "")
            rows.append(row)

    if args.poll_ab:
        print()
        print("| np | ddp ms default / no backoff | zero3 ms default / no backoff | "
              "ddp no-backoff/default, paired median (per repeat) | zero3 |")
        print("|---|---|---|---|---|")
        for np in args.nps:
            zs, _ = zshard_medians(out, "zshard", np, repeats)
            off, _ = zshard_medians(out, "zshard_nobackoff", np, repeats)
            cells = []
            for s in ("ddp", "zero3"):
                pairs = [o / d for o, d in zip(off[s], zs[s])]
                cells.append(f"{statistics.median(pairs):.2f} ({' '.join(f'{p:.2f}' for p in pairs)})")
            print(f"| {np} | {statistics.median(zs['ddp']):.1f} / {statistics.median(off['ddp']):.1f} | "
                  f"{statistics.median(zs['zero3']):.1f} / {statistics.median(off['zero3']):.1f} | {cells[0]} | {cells[1]} |")

    with open(os.path.join(out, "summary.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
