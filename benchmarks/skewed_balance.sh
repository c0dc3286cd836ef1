#!/bin/bash
# --rank-batches auto on ranks of unequal speed, beside the even split and PyTorch DDP's even split, in one
# command: 3 ranks, ranks 0 and 1 pinned to core 0 and rank 2 to core 1 (taskset), so rank 2 computes
# twice as fast as each of the others. Each repeat runs zshard-bench --rank-batches even,auto and then
# torch_ddp.py on the same pinning, model and global batch; prints the medians over repeats as a markdown
# table: even, auto, ideal (the global batch at the ranks' summed measured throughput), auto's split,
# PyTorch DDP, and the ratios. Needs 2 cores and nothing else running.
#   benchmarks/skewed_balance.sh BUILD_DIR OUT_DIR [repeats]
# Environment: MODEL_FLAGS overrides the model and batch; STRATEGIES the zshard strategies (default ddp).
set -euo pipefail
build=$1 out=$2 repeats=${3:-3}
src=$(cd "$(dirname "$0")" && pwd)
model_flags=${MODEL_FLAGS:---model gpt2 --layers 2 --dim 256 --heads 4 --vocab 4096 --seq 128 --batch 48}
strategies=${STRATEGIES:-ddp}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
mkdir -p "$out"
pin="$src/skewed_pin.sh"
: >"$out/loads.txt"
for rep in $(seq "$repeats"); do
  echo "zshard_$rep $(cut -d' ' -f1-3 /proc/loadavg)" >>"$out/loads.txt"
  # shellcheck disable=SC2086
  mpirun --oversubscribe --bind-to none -np 3 "$pin" "$build/zshard-bench" $model_flags --strategies "$strategies" \
    --rank-batches even,auto --warmup-steps 2 --steps 8 --json "$out/zshard_$rep.json" >/dev/null
  echo "torch_$rep $(cut -d' ' -f1-3 /proc/loadavg)" >>"$out/loads.txt"
  # shellcheck disable=SC2086
  mpirun --oversubscribe --bind-to none -np 3 "$pin" /usr/bin/python3 "$src/peers/torch_ddp.py" $model_flags \
    --warmup-steps 2 --steps 8 --json "$out/torch_$rep.json" >/dev/null
done
/usr/bin/python3 - "$out" "$repeats" <<'PY'
import json, statistics, sys
out, repeats = sys.argv[1], int(sys.argv[2])
runs = [json.load(open(f"{out}/zshard_{r}.json")) for r in range(1, repeats + 1)]
torch = statistics.median(json.load(open(f"{out}/torch_{r}.json"))["step_ms"]["median"] for r in range(1, repeats + 1))
print(f"global batch {runs[0]['batch']}, {repeats} repeats (medians of the per-run median steps)\n")
print("| strategy | even ms | auto ms | ideal ms (auto run) | auto split | auto/even speed-up | auto vs ideal "
      "| PyTorch DDP even ms | PyTorch / auto |")
print("|---|---|---|---|---|---|---|---|---|")
for strategy in sorted({r["strategy"] for r in runs[0]["results"]}, key=lambda s: s != "ddp"):
    def pick(split, key):
        return [next(x for x in run["results"] if x["strategy"] == strategy and x["rank_batches"] == split)[key]
                for run in runs]
    even = statistics.median(m["median"] for m in pick("even", "step_ms"))
    auto = statistics.median(m["median"] for m in pick("auto", "step_ms"))
    ideal = statistics.median(pick("auto", "ideal_step_ms"))
    splits = sorted({",".join(map(str, s)) for s in pick("auto", "split")})
    print(f"| {strategy} | {even:.1f} | {auto:.1f} | {ideal:.1f} | {' / '.join(splits)} | {even / auto:.2f}x "
          f"| {100 * (auto / ideal - 1):+.1f}% | {torch:.1f} | {torch / auto:.2f}x |")
PY
