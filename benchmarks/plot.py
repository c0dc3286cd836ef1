#!/usr/bin/python3
"""Turns zshard-bench and zshard-commbench JSON into PNGs (matplotlib, no display needed):

  memory_by_strategy.png  peak bytes per rank by strategy, stacked by category (max over ranks)
  throughput.png          tokens/s by strategy
  busbw.png               bus bandwidth vs size per collective (zshard solid, raw MPI dashed)
  scaling.png             zshard-project's efficiency vs N (solid: overlap, dotted: none) and Amdahl
  memory_sweep.png        per model: peak per rank at a fixed batch, and the largest batch per rank under a
                          budget, each strategy with and without activation checkpointing and offload:
                          measured (bars: the batch the runs at the estimate and one more proved) beside
                          predicted (dots) (benchmarks/memory_sweep.py)
  tune.png                zshard-tune's runs: step time against peak memory per rank, every candidate
                          timed, the Pareto front, the budget and the one chosen (zshard-tune --json)
  network_sweep.png       per topology: measured step time by strategy and link (bars, exposed
                          communication hatched) beside zshard-project's prediction with the ranks'
                          shared cores and each strategy's own collectives' bandwidth, no overlap (dots)
                          (benchmarks/network_sweep.sh's summary.json)
  quantized_comm.png      per accuracy model: zero3's loss curves with each quantization, and their
                          difference from the unquantized run (a 10-step moving mean); on the shaped link,
                          the step time (exposed communication hatched, the collectives replayed alone as
                          dots) and the bytes each rank's host sent (benchmarks/quantized_comm.sh's
                          summary.json)

  /usr/bin/python3 benchmarks/plot.py --bench bench.json --commbench comm.json \
      --projection projection.json --memory-sweep memory_sweep.json --tune tune.json \
      --network-sweep benchmarks/results/network_sweep/summary.json \
      --quantized-comm benchmarks/results/quantized_comm/summary.json --out benchmarks/results
"""

import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

CATEGORIES = ["params", "frozen", "grads", "optimizer", "activations", "comm", "workspace", "host"]


def title_of(doc):
    m = doc["model"]
    return f"{m['name']} ({m['params'] / 1e6:.2f}M params), world {doc['world']}, batch {doc['batch']}x{doc['seq']}"


def save(fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_memory(doc, path):
    results = doc["results"]
    names = [r["strategy"] for r in results]
    bottom = [0.0] * len(results)
    fig, ax = plt.subplots(figsize=(7, 4))
    for cat in CATEGORIES:
        values = [r["peak_bytes"].get(cat, 0) / 2**20 for r in results]
        ax.bar(names, values, bottom=bottom, label=cat)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_ylabel("peak MiB per rank (max over ranks)")
    ax.set_title("memory per rank: " + title_of(doc), fontsize=9)
    ax.legend(fontsize=8)
    save(fig, path)


def plot_throughput(doc, path):
    results = doc["results"]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar([r["strategy"] for r in results], [r["tokens_per_s"] for r in results], color="tab:green")
    ax.set_ylabel("tokens/s (median step)")
    ax.set_title("throughput: " + title_of(doc), fontsize=9)
    save(fig, path)


def plot_busbw(doc, path):
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, op in enumerate(["all_gather", "reduce_scatter", "all_reduce"]):
        rows = [r for r in doc["rows"] if r["op"] == op]
        if not rows:
            continue
        color = f"C{i}"
        ax.plot([r["size"] for r in rows], [r["busbw"] for r in rows], "-o", ms=3, color=color,
                label=f"{op} zshard")
        if "raw_busbw" in rows[0]:
            ax.plot([r["size"] for r in rows], [r["raw_busbw"] for r in rows], "--", color=color,
                    label=f"{op} raw MPI")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("size (bytes, full buffer)")
    ax.set_ylabel("busbw (GB/s)")
    ax.set_title(f"bus bandwidth, {doc['world']} ranks, {doc['backend']}", fontsize=9)
    ax.legend(fontsize=7)
    save(fig, path)


def plot_scaling(doc, path):
    rows = doc["rows"]
    worlds = [r["world"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4))
    # Files written before the projection named its strategies projected all three.
    for i, name in enumerate(doc.get("strategies", ["ddp", "zero3", "hybrid"])):
        ax.plot(worlds, [r[name]["efficiency_overlap"] for r in rows], "-o", ms=3, color=f"C{i}",
                label=f"{name} overlap")
        ax.plot(worlds, [r[name]["efficiency"] for r in rows], ":", color=f"C{i}", label=f"{name} no overlap")
    ax.plot(worlds, [r["amdahl_efficiency"] for r in rows], "--k",
            label=f"Amdahl s={doc['serial_fraction']:.3f}")
    ax.set_xscale("log", base=2)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("ranks N")
    ax.set_ylabel(f"{doc['scaling']} scaling efficiency")
    ax.set_title(f"projection: {doc['params'] / 1e6:.1f}M params, intra {doc['intra']['name']}, "
                 f"inter {doc['inter']['name']}, node {doc['node_size']}", fontsize=9)
    ax.legend(fontsize=7)
    save(fig, path)


def plot_network_sweep(doc, path):
    rows = [r for r in doc["rows"] if "skipped" not in r]
    topologies = list(dict.fromkeys(r["hosts"] for r in rows))
    links = list(dict.fromkeys(r["link"] for r in rows))
    fig, axes = plt.subplots(1, len(topologies), figsize=(6 * len(topologies), 4), squeeze=False)
    width = 0.8 / len(links)
    for ax, hosts in zip(axes[0], topologies):
        strategies = list(dict.fromkeys(r["strategy"] for r in rows if r["hosts"] == hosts))
        for j, link in enumerate(links):
            cell = {r["strategy"]: r for r in rows if r["hosts"] == hosts and r["link"] == link}
            xs = [i + (j - (len(links) - 1) / 2) * width for i in range(len(strategies))]
            ax.bar(xs, [cell[s]["step_ms"] for s in strategies], width, color=f"C{j}", label=f"{link}")
            ax.bar(xs, [cell[s]["comm_exposed_ms"] for s in strategies], width, fill=False, hatch="//",
                   edgecolor="k", linewidth=0)
            ax.plot(xs, [cell[s]["projected_collectives_ms"] for s in strategies], "o", color="k", ms=4)
        ax.set_xticks(range(len(strategies)), strategies, rotation=30, ha="right", fontsize=7)
        ax.set_ylabel("step ms (hatched: exposed comm; dots: projected)", fontsize=8)
        ax.set_title(f"hosts {hosts}, {doc['model']['params'] / 1e6:.1f}M params, batch {doc['batch']}x{doc['seq']}",
                     fontsize=9)
        ax.legend(fontsize=7, title="link", title_fontsize=7)
    save(fig, path)


def moving_mean(values, n):
    """The mean of each value and the n - 1 before it (of fewer at the start)."""
    windows = (values[max(0, i + 1 - n):i + 1] for i in range(len(values)))
    return [sum(w) / len(w) for w in windows]


def plot_quantized_comm(doc, path):
    runs = doc["runs"]
    models = list(dict.fromkeys(r["model"] for r in runs if r["part"] == "accuracy"))
    fig, axes = plt.subplots(2, len(models) + 1, figsize=(5 * (len(models) + 1), 7), squeeze=False)
    for col, model in enumerate(models):
        curves = [r for r in runs if r["part"] == "accuracy" and r["model"] == model]
        reference = next(r for r in curves if r["tag"] == curves[0]["reference"])
        for i, r in enumerate(curves):
            label = r["tag"].split("_", 2)[2]
            steps = range(1, len(r["losses"]) + 1)
            axes[0][col].plot(steps, r["losses"], color=f"C{i}", lw=0.7, label=label)
            diff = [a - b for a, b in zip(r["losses"], reference["losses"])]
            axes[1][col].plot(steps, moving_mean(diff, 10), color=f"C{i}", lw=0.9, label=label)
        flags = " ".join(w for w in curves[0]["flags"].split() if w not in ("--strategy", "zero3"))
        axes[0][col].set_title(f"zero3, hosts {doc['hosts']}: {flags}", fontsize=8)
        axes[0][col].set_ylabel("loss")
        axes[0][col].legend(fontsize=7)
        axes[1][col].set_ylabel("loss - unquantized zero3's (10-step mean)", fontsize=8)
        axes[1][col].set_xlabel("step")
    link = [r for r in runs if r["part"] == "link"]
    names = [r["tag"][len("link_"):].replace("+", "\n+") for r in link]
    ax = axes[0][-1]
    ax.bar(names, [r["step_ms"] for r in link], color=[f"C{i}" for i in range(len(link))])
    ax.bar(names, [r["comm_exposed_ms"] for r in link], fill=False, hatch="//", edgecolor="k", linewidth=0)
    ax.plot(names, [r["bench_comm_replayed_ms"] for r in link], "o", color="k", ms=4)
    ax.set_ylabel("median step ms (hatched: exposed comm; dots: comm alone)", fontsize=8)
    ax.set_title(f"link {link[0]['link']}, hosts {doc['hosts']}: " +
                 " ".join(w for w in link[0]["flags"].split() if w not in ("--strategy", "ddp")), fontsize=7)
    ax = axes[1][-1]
    ax.bar(names, [r["eth0_sent_bytes_per_step"] / 2**20 for r in link], color=[f"C{i}" for i in range(len(link))])
    ax.set_ylabel("MiB each rank's host sent a step (eth0)", fontsize=8)
    for ax in axes[:, -1]:
        ax.tick_params(axis="x", labelsize=6)
    save(fig, path)


def plot_memory_sweep(doc, path):
    rows = doc["rows"]
    models = list(dict.fromkeys(r["model"] for r in rows))
    combos = [("none", "none"), ("blocks", "none"), ("none", "optimizer"), ("blocks", "optimizer")]
    fig, axes = plt.subplots(len(models), 2, figsize=(12, 3.6 * len(models)), squeeze=False)
    for row_axes, model in zip(axes, models):
        mine = [r for r in rows if r["model"] == model]
        strategies = list(dict.fromkeys(r["strategy"] for r in mine))
        width = 0.8 / len(combos)
        for ax, measured, predicted, label in (
                (row_axes[0], "peak_measured", "peak_predicted", "peak MiB per rank"),
                (row_axes[1], "largest_batch_verified", "largest_batch_predicted", "largest batch per rank")):
            for i, (ac, offload) in enumerate(combos):
                xs, got, want, hatch = [], [], [], []
                for j, s in enumerate(strategies):
                    hit = [r for r in mine if r["strategy"] == s and r["activation_checkpointing"] == ac
                           and r["offload"] == offload]
                    if not hit:
                        continue
                    scale = 2**20 if measured == "peak_measured" else 1
                    xs.append(j - 0.4 + (i + 0.5) * width)
                    got.append(hit[0][measured] / scale)
                    want.append((hit[0][predicted] or 0) / scale)
                    hatch.append(hit[0].get("verdict", "exact") != "exact")
                bars = ax.bar(xs, got, width, label=f"ckpt {ac}, offload {offload}")
                for bar, off in zip(bars, hatch):
                    if off and measured != "peak_measured":
                        bar.set_hatch("//")
                ax.plot(xs, want, "k.", markersize=6)
            budgets = {s: next(r["budget"] for r in mine if r["strategy"] == s) for s in strategies}
            margins = {r["budget"] - r["peak_predicted"] for r in mine}  # one: memory_sweep.py's +SIZE
            relative = len(margins) == 1 and len({r["budget"] for r in mine}) > 1
            ticks = strategies
            if measured != "peak_measured" and len(set(budgets.values())) > 1 and not relative:
                ticks = [f"{s}\n{budgets[s] / 2**20:.0f} MiB" for s in strategies]
            ax.set_xticks(range(len(strategies)), ticks, fontsize=8)
            r0 = mine[0]
            if measured == "peak_measured":
                title = f"{model}, world {r0['world']}, {r0['rank_batch']}x{r0['seq']} per rank"
            else:
                one = len(set(budgets.values())) == 1
                scope = (f", budget: its estimate + {margins.pop() / 2**20:.0f} MiB"
                         if relative else f", budget {r0['budget'] / 2**20:.0f} MiB" if one else ", budget per strategy")
                title = (f"{model}, world {r0['world']}, seq {r0['seq']}" + scope
                         + " (hatched: the runs disagree with the estimate)")
            ax.set_title(title, fontsize=8)
            ax.set_ylabel(label + " (dots: predicted)", fontsize=8)
        row_axes[0].legend(fontsize=7)
    save(fig, path)


def pareto(points):
    """The points no other beats in both step time and peak memory, by increasing memory."""
    front, best = [], float("inf")
    for p in sorted(points, key=lambda p: (p[0], p[1])):
        if p[1] < best:
            front.append(p)
            best = p[1]
    return front


def plot_tune(doc, path):
    runs = [c for c in doc["candidates"] if "run" in c and "step_ms" in c["run"]]
    budget = doc["budget_bytes"] / 2**20
    fig, ax = plt.subplots(figsize=(8, 5))
    strategies = list(dict.fromkeys(c["flags"][1] for c in runs))
    for i, s in enumerate(strategies):
        mine = [c for c in runs if c["flags"][1] == s]
        for fits, marker in ((True, "o"), (False, "x")):
            pts = [c for c in mine if (c["run"]["status"] == "ok") == fits]
            if pts:
                ax.scatter([c["run"]["peak_bytes"] / 2**20 for c in pts], [c["run"]["step_ms"] for c in pts],
                           marker=marker, color=f"C{i}", s=24, label=s if fits else f"{s}, over budget")
    ok = [(c["run"]["peak_bytes"] / 2**20, c["run"]["step_ms"]) for c in runs if c["run"]["status"] == "ok"]
    front = pareto(ok)
    if front:
        ax.step([p[0] for p in front], [p[1] for p in front], where="post", color="k", lw=1, label="Pareto front")
    ax.axvline(budget, color="r", ls="--", lw=1, label=f"budget {budget:.0f} MiB")
    if "winner" in doc:
        w = next(c for c in runs if c["label"] == doc["winner"]["label"])
        ax.scatter([w["run"]["peak_bytes"] / 2**20], [w["run"]["step_ms"]], s=160, facecolors="none",
                   edgecolors="k", lw=1.5, label=f"chosen: {w['label']}")
    ax.set_xlabel("measured peak MiB per rank (max over ranks)")
    ax.set_ylabel("measured step time, ms (median)")
    m = doc["model"]
    ax.set_title(f"zshard-tune: {m['name']} ({m['params'] / 1e6:.1f}M params), {doc['world']} ranks, global batch "
                 f"{doc['global_batch']}x{doc['seq']}; {len(runs)} candidates timed", fontsize=9)
    ax.legend(fontsize=7)
    save(fig, path)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bench", help="zshard-bench --json output")
    p.add_argument("--commbench", help="zshard-commbench --json output")
    p.add_argument("--projection", help="zshard-project --json output")
    p.add_argument("--memory-sweep", help="benchmarks/memory_sweep.py output (memory_sweep.json)")
    p.add_argument("--tune", help="zshard-tune --json output (every candidate timed: --exhaustive)")
    p.add_argument("--network-sweep", help="benchmarks/network_sweep.sh output (summary.json)")
    p.add_argument("--quantized-comm", help="benchmarks/quantized_comm.sh output (summary.json)")
    p.add_argument("--out", default=".", help="directory for the PNGs")
    args = p.parse_args()
    if not any([args.bench, args.commbench, args.projection, args.memory_sweep, args.tune, args.network_sweep,
                args.quantized_comm]):
        p.error("give at least one of --bench, --commbench, --projection, --memory-sweep, --tune, --network-sweep, "
                "--quantized-comm")
    os.makedirs(args.out, exist_ok=True)
    # Each input and the pictures drawn from it.
    plots = [(args.bench, [("memory_by_strategy.png", plot_memory), ("throughput.png", plot_throughput)]),
             (args.commbench, [("busbw.png", plot_busbw)]),
             (args.projection, [("scaling.png", plot_scaling)]),
             (args.memory_sweep, [("memory_sweep.png", plot_memory_sweep)]),
             (args.tune, [("tune.png", plot_tune)]),
             (args.network_sweep, [("network_sweep.png", plot_network_sweep)]),
             (args.quantized_comm, [("quantized_comm.png", plot_quantized_comm)])]
    written = []
    for source, pictures in plots:
        if not source:
            continue
        with open(source) as f:
            doc = json.load(f)
        for name, draw in pictures:
            written.append(os.path.join(args.out, name))
            draw(doc, written[-1])
    for path in written:
        print(path)


if __name__ == "__main__":
    main()
