#!/bin/bash
# zshard ddp and zero3 beside PyTorch DDP (gloo, CPU, one thread per rank) on the same GPT-2 config and
# global batch, at np 2 and 4. Runs are interleaved (zshard, torch, zshard, torch, ...) so that machine
# noise hits both alike; prints the medians over repeats and the ratios as a markdown table.
#   benchmarks/peer_compare.sh BUILD_DIR OUT_DIR [repeats]
# Environment: MODEL_FLAGS overrides the config; NPS the world sizes (default "2 4"); POLL_AB=1 adds, in
# each repeat, a zshard run with ZSHARD_POLL_BACKOFF=0 (waits never sleep; comm/polling_work.h) and a
# second table with the paired ratio no-backoff / default per repeat (median). OUT_DIR/loads.txt has the
# load average before each run.
set -euo pipefail
build=$1 out=$2 repeats=${3:-3}
src=$(cd "$(dirname "$0")" && pwd)
model_flags=${MODEL_FLAGS:---model tiny --layers 4 --dim 256 --heads 4 --batch 8 --seq 128}
nps=${NPS:-2 4}
ab=${POLL_AB:-0}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
mkdir -p "$out"
: >"$out/loads.txt"
note() { echo "$1 $(cut -d' ' -f1-3 /proc/loadavg)" >>"$out/loads.txt"; }
for np in $nps; do
  for rep in $(seq "$repeats"); do
    note "zshard_np${np}_$rep"
    # shellcheck disable=SC2086
    mpirun --oversubscribe --bind-to none -np "$np" "$build/zshard-bench" $model_flags --strategies ddp,zero3 \
      --json "$out/zshard_np${np}_$rep.json" >/dev/null
    if [ "$ab" = 1 ]; then
      note "zshard_nobackoff_np${np}_$rep"
      # shellcheck disable=SC2086
      ZSHARD_POLL_BACKOFF=0 mpirun --oversubscribe --bind-to none -x ZSHARD_POLL_BACKOFF -np "$np" \
        "$build/zshard-bench" $model_flags --strategies ddp,zero3 --json "$out/zshard_nobackoff_np${np}_$rep.json" >/dev/null
    fi
    note "torch_np${np}_$rep"
    # shellcheck disable=SC2086
    mpirun --oversubscribe --bind-to none -np "$np" /usr/bin/python3 "$src/peers/torch_ddp.py" $model_flags \
      --json "$out/torch_np${np}_$rep.json" >/dev/null
  done
done
/usr/bin/python3 - "$out" "$repeats" "$ab" $nps <<'PY'
import json, statistics, sys
out, repeats, ab, nps = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", [int(n) for n in sys.argv[4:]]
reps = range(1, repeats + 1)

def zshard(prefix, np):
    """Per strategy, the list of per-repeat median step times, and whether waits backed off."""
    zs, backoff = {"ddp": [], "zero3": []}, set()
    for r in reps:
        doc = json.load(open(f"{out}/{prefix}_np{np}_{r}.json"))
        backoff.add(doc.get("poll_backoff"))
        for res in doc["results"]:
            zs[res["strategy"]].append(res["step_ms"]["median"])
    return zs, backoff

print("| np | torch DDP ms | zshard ddp ms | zshard zero3 ms | torch/ddp | torch/zero3 | zshard waits back off |")
print("|---|---|---|---|---|---|---|")
for np in nps:
    torch = [json.load(open(f"{out}/torch_np{np}_{r}.json"))["step_ms"]["median"] for r in reps]
    zs, backoff = zshard("zshard", np)
    t, d, z = statistics.median(torch), statistics.median(zs["ddp"]), statistics.median(zs["zero3"])
    print(f"| {np} | {t:.1f} | {d:.1f} | {z:.1f} | {t / d:.2f} | {t / z:.2f} | {'/'.join(map(str, backoff))} |")
if ab:
    print()
    print("| np | ddp ms default / no backoff | zero3 ms default / no backoff | ddp no-backoff/default, paired median (per repeat) | zero3 |")
    print("|---|---|---|---|---|")
    for np in nps:
        zs, _ = zshard("zshard", np)
        off, _ = zshard("zshard_nobackoff", np)
        cells = []
        for s in ("ddp", "zero3"):
            pairs = [o / d for o, d in zip(off[s], zs[s])]
            cells.append(f"{statistics.median(pairs):.2f} ({' '.join(f'{p:.2f}' for p in pairs)})")
        print(f"| {np} | {statistics.median(zs['ddp']):.1f} / {statistics.median(off['ddp']):.1f} | "
              f"{statistics.median(zs['zero3']):.1f} / {statistics.median(off['zero3']):.1f} | {cells[0]} | {cells[1]} |")
PY
