#!/usr/bin/env python3
"""Where a GPU step's time goes, from Nsight Compute's per-kernel durations.

    ncu --clock-control none --metrics gpu__time_duration.sum --csv --log-file K.csv zshard-bench ...
    benchmarks/kernel_profile.py K.csv [--from REGEX] [--steps N] [--step-ms MS] [--json OUT]

Sums gpu__time_duration by kind of kernel (matrix products, attention's softmax, the norms, the
element-wise kernels, the optimizer, ...) and by kernel, largest first. ncu serialises the kernels, so the
sum is the device's busy time with no overlap; --step-ms (a step's wall time, measured without ncu) turns
it into the share of the step the GPU was busy, the rest being launch gaps and host stalls. --from drops
the kernels before the first whose name matches (the run's set-up: the first bf16 copies of the
parameters, 0.36 ms of 23 in the gpt2 profile of benchmarks/RESULTS.md), so that one step is what is left.
"""
import argparse
import collections
import csv
import json
import re
import sys

# First match wins; a kernel's name is matched lower-cased.
KINDS = [
    # First: cuDNN's attention kernels carry sm90_ and wgmma in their names, as cuBLAS's do.
    ("attention (cuDNN)", r"sdpa|flash_|cudnn::"),
    ("matmul (cuBLAS)", r"gemm|nvjet|xmma|cutlass|sm90_|sm80_|splitk|gemv"),
    ("attention softmax", r"softmax"),
    ("norms", r"layernorm|rmsnorm"),
    ("gelu / swiglu", r"gelu|swiglu"),
    ("bias, residual", r"bias|residual|add_kernel|axpy"),
    ("optimizer", r"adamw"),
    ("cross entropy", r"cross_entropy|logsoftmax"),
    ("embedding", r"embedding|wpe|wte|run_length|rope|gqa"),
    ("reductions", r"column_sum|sum_sq|reduce|norm_sq"),
    ("dtype casts", r"convert"),
    ("copies, fills", r"memcpy|memset|fill|iota|copy"),
]
SCALE_TO_MS = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0,
               "s": 1e3, "second": 1e3}


def kind_of(name):
    low = name.lower()
    for kind, pattern in KINDS:
        if re.search(pattern, low):
            return kind
    return "other"


def read(path):
    """Rows of (kernel name, grid, milliseconds): ncu's CSV after whatever the program itself printed."""
    with open(path, newline="") as f:
        lines = f.read().splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if start is None:
        sys.exit(f"{path}: no ncu CSV header (a line starting with \"ID\")")
    rows = []
    for r in csv.DictReader(lines[start:]):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = r.get("Metric Unit", "nsecond")
        if unit not in SCALE_TO_MS:
            sys.exit(f"{path}: unknown time unit {unit!r}")
        value = float(r["Metric Value"].replace(",", ""))
        rows.append((r["Kernel Name"], r.get("Grid Size", ""), value * SCALE_TO_MS[unit]))
    if not rows:
        sys.exit(f"{path}: no gpu__time_duration.sum rows")
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--steps", type=int, default=1, help="training steps the profiled run took (shares are per step)")
    ap.add_argument("--step-ms", type=float, help="a step's wall time measured without ncu")
    ap.add_argument("--from", dest="start", metavar="REGEX",
                    help="leave out the kernels before the first whose name matches (the run's set-up)")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = read(args.csv)
    if args.start:
        first = next((i for i, (name, _, _) in enumerate(rows) if re.search(args.start, name)), None)
        if first is None:
            sys.exit(f"{args.csv}: no kernel matches --from {args.start!r}")
        rows = rows[first:]
    total = sum(ms for _, _, ms in rows)
    by_kind = collections.defaultdict(lambda: [0, 0.0])
    by_kernel = collections.defaultdict(lambda: [0, 0.0])
    for name, grid, ms in rows:
        by_kind[kind_of(name)][0] += 1
        by_kind[kind_of(name)][1] += ms
        short = re.sub(r"\(.*", "", name)[:70]
        by_kernel[(short, grid)][0] += 1
        by_kernel[(short, grid)][1] += ms
    per_step = total / args.steps
    print(f"{len(rows)} kernels, {total:.2f} ms of device time; per step {per_step:.2f} ms" +
          (f" of a {args.step_ms:.2f} ms step: the GPU busy {100 * per_step / args.step_ms:.0f}%"
           if args.step_ms else ""))
    print(f"{'kind':<20} {'kernels':>8} {'ms':>9} {'share':>6}")
    for kind, (n, ms) in sorted(by_kind.items(), key=lambda kv: -kv[1][1]):
        print(f"{kind:<20} {n:>8} {ms:>9.2f} {100 * ms / total:>5.1f}%")
    print(f"\n{'kernel':<70} {'grid':>16} {'n':>5} {'ms':>8} {'share':>6}")
    for (name, grid), (n, ms) in sorted(by_kernel.items(), key=lambda kv: -kv[1][1])[: args.top]:
        print(f"{name:<70} {grid:>16} {n:>5} {ms:>8.2f} {100 * ms / total:>5.1f}%")
    if args.json:
        own = {}  # zshard's own kernels (not the libraries'), costliest first, by function name
        for (name, _), (_, ms) in by_kernel.items():
            m = re.search(r"zshard::[^ ]*?(\w+_kernel)", name)
            if m:
                own[m.group(1)] = own.get(m.group(1), 0.0) + ms
        json.dump({"kernels": len(rows), "device_ms": total, "device_ms_per_step": per_step,
                   "step_ms": args.step_ms, "own_kernels": sorted(own, key=lambda k: -own[k]),
                   "kinds": {k: {"kernels": n, "ms": ms, "share": ms / total} for k, (n, ms) in by_kind.items()}},
                  open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
