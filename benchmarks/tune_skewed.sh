#!/bin/bash
# zshard-tune on ranks of unequal speed: 3 ranks, ranks 0 and 1 pinned to core 0 and rank 2 to core 1
# (benchmarks/skewed_pin.sh, as benchmarks/skewed_balance.sh pins them), so rank 2 computes twice as fast
# as each of the others. The tuner's first run measures the speeds, --rank-batches auto joins the search, and the plan
# it picks is then timed against the same configuration with the even split, REPEATS interleaved times
# (zshard-bench --rank-batches even,auto). Prints the comparison as markdown (OUT/summary.md).
#   benchmarks/tune_skewed.sh BUILD_DIR OUT_DIR [repeats]
# Environment: PROBLEM overrides the model, batch and budget; SKEW the wrapper that makes the speeds unequal
# (default benchmarks/skewed_pin.sh, which needs 2 cores and nothing else running; benchmarks/skewed_nice.sh
# keeps the speeds unequal where other processes load the cores, but shows only the detection: see it).
set -euo pipefail
build=$1 out=$2 repeats=${3:-3}
src=$(cd "$(dirname "$0")" && pwd)
# shellcheck disable=SC2206
problem=(${PROBLEM:---model gpt2 --layers 2 --dim 256 --heads 4 --vocab 4096 --seq 128 --global-batch 48 --np 3
  --mem-budget 1GB --strategies ddp,zero2 --activation-checkpointing none --offload none})
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
mkdir -p "$out"
pin=${SKEW:-$src/skewed_pin.sh}
"$build/zshard-tune" "${problem[@]}" --launcher "mpirun --oversubscribe --bind-to none -np {np} $pin" \
  --json "$out/tune.json" | tee "$out/tune.txt"
# The winner's flags, for zshard-bench: its strategy, batch and the rest, without the split (both are timed).
read -r -a flags < <(/usr/bin/python3 - "$out/tune.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
w = next(c for c in d["candidates"] if c["label"] == d["winner"]["label"])
f, out = w["flags"], []
i = 0
while i < len(f):
    if f[i] in ("--rank-batches", "--max-rank-batch"):
        i += 2
        continue
    out.append("--strategies" if f[i] == "--strategy" else f[i])
    i += 1
cfg = ",".join(f"{k}={v}" for k, v in d["model"]["config"].items())
print(" ".join(["--model", d["model"]["name"], "--config", cfg, "--seq", str(d["seq"])] + out))
PY
)
for rep in $(seq "$repeats"); do
  echo "repeat $rep $(cut -d' ' -f1-3 /proc/loadavg)" >>"$out/loads.txt"
  mpirun --oversubscribe --bind-to none -np 3 "$pin" "$build/zshard-bench" "${flags[@]}" --rank-batches even,auto \
    --warmup-steps 2 --steps 8 --json "$out/bench_$rep.json" >/dev/null
done
/usr/bin/python3 - "$out" "$repeats" <<'PY' | tee "$out/summary.md"
import json, statistics, sys
out, repeats = sys.argv[1], int(sys.argv[2])
tune = json.load(open(f"{out}/tune.json"))
runs = [json.load(open(f"{out}/bench_{r}.json"))["results"] for r in range(1, repeats + 1)]
pick = lambda split: [next(x for x in run if x["rank_batches"] == split) for run in runs]
even = [x["step_ms"]["median"] for x in pick("even")]
auto = [x["step_ms"]["median"] for x in pick("auto")]
print(f"zshard-tune chose: {tune['winner']['label']} ({tune['winner']['step_ms']:.1f} ms in its run), "
      f"{sum('run' in c for c in tune['candidates'])} runs in {tune['elapsed_s']:.0f} s\n")
print("| split | median of per-run medians ms | min ms | split of the last step |")
print("|---|---|---|---|")
print(f"| even | {statistics.median(even):.1f} | {min(even):.1f} | {pick('even')[-1]['split']} |")
print(f"| auto | {statistics.median(auto):.1f} | {min(auto):.1f} | {pick('auto')[-1]['split']} |")
print(f"\nauto / even speed-up: {statistics.median(even) / statistics.median(auto):.2f}x (medians), "
      f"{min(even) / min(auto):.2f}x (minima)\n")
# Each repeat's medians and load, so that this summary is the record once the runs' JSON files are gone.
loads = [line.split()[2:] for line in open(f"{out}/loads.txt")][-repeats:]
print("| repeat | even median ms | auto median ms | load average before it (1, 5, 15 min) |")
print("|---|---|---|---|")
for r in range(repeats):
    print(f"| {r + 1} | {even[r]:.1f} | {auto[r]:.1f} | {' '.join(loads[r])} |")
PY
