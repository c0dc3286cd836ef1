#!/usr/bin/python3
"""The helper of benchmarks/network_sweep.sh:

  network_sweep_summary.py bench-flags VARIANT
      zshard-bench's flags for a variant of VARIANTS: its strategy and communication modes.
  network_sweep_summary.py project-flags WORK HOSTS LINK CORES VARIANT...
      zshard-project's flags for the topology HOSTS (e.g. 2,2) on LINK, three lines per variant that runs
      there: "model_VARIANT" (as the projection models it, every rank its own device), "cores_VARIANT"
      (the single rank's compute time scaled by the ranks sharing each of this machine's CORES) and
      "collectives_VARIANT" (cores, each collective between hosts at the bus bandwidth it reached on HOSTS
      and LINK, and one NIC per host).
  network_sweep_summary.py summarise WORK SUMMARY_JSON --topologies ... --links ... --strategies ...
      every run beside its projections into SUMMARY_JSON, and the markdown table on stdout.

Links: the measured all-reduce bus bandwidth at 4 MiB (zshard-commbench) of two ranks on one host for
the intra link, of two hosts of one rank each on LINK for the inter link; latency 5 us inside a host and
30 us between hosts (a TCP round trip over the bridge is 20-40 us, docs/multihost.md).
"""

import argparse
import glob
import json
import os

# The variants a sweep runs: a strategy, and the communication modes it runs with (docs/training.md).
VARIANTS = {
    "ddp": ("ddp", []),
    "zero2": ("zero2", []),
    "zero3": ("zero3", []),
    "hybrid": ("hybrid", ["--shard-group", "node"]),
    "zero3+int8g+int4r": ("zero3", ["--quantize-gathers", "int8", "--quantize-reductions", "int4"]),
    "zero3+int8g+int8r": ("zero3", ["--quantize-gathers", "int8", "--quantize-reductions", "int8"]),
    "zero3+hpz": ("zero3", ["--secondary-shard", "host"]),
    "zero3+int8g+int4r+hpz": ("zero3", ["--quantize-gathers", "int8", "--quantize-reductions", "int4",
                                        "--secondary-shard", "host"]),
}

INTRA_ALPHA_US = 5
INTER_ALPHA_US = 30
def load(path):
    with open(path) as f:
        return json.load(f)


def busbw(work, name):
    return load(os.path.join(work, f"link_{name}.json"))["rows"][0]["busbw"]


def runs_on(variant, sizes):
    """Whether a variant runs on hosts of these sizes: on a host of one rank hybrid's group and a secondary
    shard's would be one rank, which they refuse (network_sweep.sh skips those runs)."""
    strategy, modes = VARIANTS[variant]
    return min(sizes) > 1 or (strategy != "hybrid" and "--secondary-shard" not in modes)


def project_flags(work, hosts, link, cores, variants):
    """One line per projection kind and variant: "KIND_VARIANT FLAGS"."""
    sizes = [int(s) for s in hosts.split(",")]
    single = load(os.path.join(work, "single.json"))
    common = (f"--scaling strong --max-world 1 --nodes {hosts} --node-size {max(sizes)} --alpha-us {INTRA_ALPHA_US} "
              f"--bandwidth-gbs {busbw(work, 'intra'):.4f} --inter-alpha-us {INTER_ALPHA_US}")
    compute = next(r for r in single["results"] if r["strategy"] == "ddp")["step_ms"]["median"]
    shared = max(1.0, sum(sizes) / cores)
    on_cores = (f"--compute-ms {compute * shared:.3f} --params {single['model']['params']} "
                f"--units {single['model']['units']} --batch {single['batch']}")
    measured = {r["op"]: r["busbw"] for r in
                load(os.path.join(work, f"collectives_{hosts.replace(',', '-')}_{link}.json"))["rows"]}
    for variant in variants:
        if not runs_on(variant, sizes):
            continue
        strategy, modes = VARIANTS[variant]
        what = " ".join(["--strategies", "ddp" if strategy == "zero2" else strategy,
                         *(m for m in modes if m not in ("--shard-group", "node"))])
        link_bw = f"--inter-bandwidth-gbs {busbw(work, link):.4f}"
        print(f"model_{variant} --bench {os.path.join(work, 'single.json')} {common} {link_bw} {what}")
        print(f"cores_{variant} {on_cores} {common} {link_bw} {what}")
        # Each collective at the bus bandwidth it reached on the topology and link (the all-to-all of
        # quantized reductions in the reduce-scatter's place), behind one NIC per host; hybrid's all-reduce
        # across groups runs between ranks of different hosts, at the link's.
        reduction = measured["all_to_all" if "--quantize-reductions" in modes else "reduce_scatter"]
        all_reduce = busbw(work, link) if strategy == "hybrid" else measured["all_reduce"]
        print(f"collectives_{variant} {on_cores} {common} --inter-bandwidth-gbs {all_reduce:.4f} "
              f"--inter-all-gather-gbs {measured['all_gather']:.4f} --inter-reduce-scatter-gbs {reduction:.4f} "
              f"--nic-per host {what}")


def projected(work, tag, kind, variant):
    """zshard-project's step (no overlap, overlap) for the variant; zero2 moves ddp's bytes (a
    reduce-scatter and an all-gather are one all-reduce), so it reads ddp's."""
    strategy = VARIANTS[variant][0]
    rows = load(os.path.join(work, f"project_{tag}_{kind}_{variant}.json"))["nodes"]["rows"]
    row = next(r for r in rows if r["strategy"] == ("ddp" if strategy == "zero2" else strategy))
    return row["step_ms"], row["step_overlap_ms"]


def wire_bytes(work, run, steps):
    """Bytes each rank sent through its host's eth0 per step, averaged over ranks: the kernel's counters
    over the whole run (set-up and warm-up steps included), per step of the run."""
    sent, ranks = 0, 0
    for path in glob.glob(os.path.join(work, f"{run}.wire.*")):
        local, tx0, _rx0, tx1, _rx1 = (int(v) for v in open(path).read().split())
        sent += tx1 - tx0
        ranks += local
    return sent / ranks / steps if ranks else None


# Bytes an element of the quantized collectives moves (shard/comm_volume.h): int8 with an fp32 scale per
# block of 256, int4 per block of 64 (shard/reduction_quantization.h).
QUANTIZED_BYTES = {"int8": 1 + 4 / 256, "int4": 0.5 + 4 / 64}


def mode(variant, flag):
    modes = VARIANTS[variant][1]
    return modes[modes.index(flag) + 1] if flag in modes else None


def theory_split(result, variant, sizes, params):
    """The strategy's bus bytes per rank and step (the memory report's theory) split into what crosses
    hosts and what stays inside one, for rings in rank order over hosts of consecutive ranks: of a ring
    over all N ranks, the H hops between hosts carry H/N of each rank's bytes on average; hybrid's
    gathers and reduce-scatters stay in its host, its shards' all-reduce across the R hosts all crosses.
    An all-to-all (quantized reductions) sends (N - h)/(N - 1) of a rank's bytes to other hosts, and a
    secondary shard's gathers (Ψ a micro-step, the compute dtype, fp32 here) stay in the host."""
    total = result["comm_bytes_per_step"]["theory"]
    hosts, world = len(sizes), sum(sizes)
    if result["strategy"] == "hybrid":
        group = result["shard_group"]
        across = 2 * 4 * params / group * (hosts - 1) / hosts
        return across, total - across
    if hosts == 1:
        return 0, total
    h = sizes[0]  # the variants with per-host groups run on hosts of one size
    secondary = 4 * params * (h - 1) / h if mode(variant, "--secondary-shard") else 0
    reductions = mode(variant, "--quantize-reductions")
    all_to_all = QUANTIZED_BYTES[reductions] * params * (world - 1) / world if reductions else 0
    rings = total - secondary - all_to_all
    cross = rings * hosts / world + all_to_all * (world - h) / (world - 1)
    return cross, total - cross


def summarise(args):
    single = load(os.path.join(args.work, "single.json"))
    params = single["model"]["params"]
    runs_steps = args.steps + args.warmup
    rows = []
    for hosts in args.topologies:
        sizes = [int(s) for s in hosts.split(",")]
        for link in args.links:
            tag = f"{hosts.replace(',', '-')}_{link}"
            for strategy in args.strategies:
                run = f"{tag}_{strategy}"
                skipped = os.path.join(args.work, f"{run}.skipped")
                if os.path.exists(skipped):
                    rows.append({"hosts": hosts, "link": link, "strategy": strategy,
                                 "skipped": open(skipped).read().strip()})
                    continue
                r = load(os.path.join(args.work, f"{run}.json"))["results"][0]
                cross, intra = theory_split(r, strategy, sizes, params)
                model, model_overlap = projected(args.work, tag, "model", strategy)
                cores, cores_overlap = projected(args.work, tag, "cores", strategy)
                collectives, collectives_overlap = projected(args.work, tag, "collectives", strategy)
                step = r["step_ms"]["median"]
                rows.append({
                    "hosts": hosts, "link": link, "strategy": strategy, "shard_group": r["shard_group"],
                    "step_ms": step, "step_ms_p10": r["step_ms"]["p10"], "step_ms_p90": r["step_ms"]["p90"],
                    "comm_exposed_ms": r["comm_ms_per_step"]["exposed"],
                    "comm_replayed_ms": r["comm_ms_per_step"]["total"],
                    "comm_bytes_measured": r["comm_bytes_per_step"]["measured"],
                    "cross_bytes_theory": cross, "intra_bytes_theory": intra,
                    "eth0_sent_bytes_per_step": wire_bytes(args.work, run, runs_steps),
                    "projected_ms": model, "projected_overlap_ms": model_overlap,
                    "projected_cores_ms": cores, "projected_cores_overlap_ms": cores_overlap,
                    "projected_collectives_ms": collectives,
                    "projected_collectives_overlap_ms": collectives_overlap,
                    "projection_proxy": VARIANTS[strategy][0] == "zero2",
                })
    doc = {
        "model": single["model"], "batch": single["batch"], "seq": single["seq"],
        "single_rank_step_ms": next(r for r in single["results"] if r["strategy"] == "ddp")["step_ms"]["median"],
        "steps": args.steps, "warmup_steps": args.warmup, "cores": args.cores,
        "link_busbw_gbs": {name: busbw(args.work, name) for name in ["intra", *args.links]},
        "collective_busbw_gbs": {
            f"{hosts} {link}": {r["op"]: r["busbw"] for r in load(os.path.join(
                args.work, f"collectives_{hosts.replace(',', '-')}_{link}.json"))["rows"]}
            for hosts in args.topologies for link in args.links},
        "loads": open(os.path.join(args.work, "loads.txt")).read().split("\n")[:-1],
        "rows": rows,
    }
    with open(args.summary, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print_table(doc)


def print_table(doc):
    """One row a run; projections as no overlap / overlap, their error against the measured median."""
    mib = 1048576
    variants = ("projected", "projected_cores", "projected_collectives")
    print("| hosts | link | strategy | step ms (p10-p90) | exposed comm ms | cross / intra MiB (theory) | "
          "eth0 MiB sent | projected ms | + shared cores | + own collectives | error: projected | error: last |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in doc["rows"]:
        if "skipped" in r:
            print(f"| {r['hosts']} | {r['link']} | {r['strategy']} | not run: {r['skipped']} |||||||||")
            continue
        proxy = " (ddp's)" if r["projection_proxy"] else ""
        step = r["step_ms"]
        cells = [f"{r[v + '_ms']:.0f} / {r[v + '_overlap_ms']:.0f}" for v in variants]
        error = [f"{r[v + '_ms'] / step - 1:+.0%} / {r[v + '_overlap_ms'] / step - 1:+.0%}" for v in variants]
        print(f"| {r['hosts']} | {r['link']} | {r['strategy']} | {step:.0f} "
              f"({r['step_ms_p10']:.0f}-{r['step_ms_p90']:.0f}) | {r['comm_exposed_ms']:.0f} | "
              f"{r['cross_bytes_theory'] / mib:.1f} / {r['intra_bytes_theory'] / mib:.1f} | "
              f"{r['eth0_sent_bytes_per_step'] / mib:.1f} | {cells[0]}{proxy} | {cells[1]} | {cells[2]} | "
              f"{error[0]} | {error[2]} |")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("bench-flags").add_argument("variant", choices=VARIANTS)
    flags = sub.add_parser("project-flags")
    flags.add_argument("work")
    flags.add_argument("hosts")
    flags.add_argument("link")
    flags.add_argument("cores", type=int)
    flags.add_argument("variants", nargs="+", choices=VARIANTS)
    s = sub.add_parser("summarise")
    s.add_argument("work")
    s.add_argument("summary")
    s.add_argument("--topologies", nargs="+", required=True)
    s.add_argument("--links", nargs="+", required=True)
    s.add_argument("--strategies", nargs="+", required=True)
    s.add_argument("--steps", type=int, required=True)
    s.add_argument("--warmup", type=int, required=True)
    s.add_argument("--cores", type=int, required=True)
    args = p.parse_args()
    if args.command == "bench-flags":
        strategy, modes = VARIANTS[args.variant]
        print(" ".join(["--strategies", strategy, *modes]))
    elif args.command == "project-flags":
        project_flags(args.work, args.hosts, args.link, args.cores, args.variants)
    else:
        summarise(args)


if __name__ == "__main__":
    main()
