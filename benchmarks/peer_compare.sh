#!/bin/bash
# zshard ddp and zero3 beside PyTorch DDP (gloo, CPU, one thread per rank) on the same GPT-2 config and
# global batch, at np 2 and 4. Runs are interleaved (zshard, torch, zshard, torch, ...) so that machine
# noise hits both alike; prints the medians over repeats and the ratios as a markdown table.
#   benchmarks/peer_compare.sh BUILD_DIR OUT_DIR [repeats]      (MODEL_FLAGS overrides the config)
set -euo pipefail
build=$1 out=$2 repeats=${3:-3}
src=$(cd "$(dirname "$0")" && pwd)
model_flags=${MODEL_FLAGS:---model tiny --layers 4 --dim 256 --heads 4 --batch 8 --seq 128}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
mkdir -p "$out"
for np in 2 4; do
  for rep in $(seq "$repeats"); do
    # shellcheck disable=SC2086
    mpirun --oversubscribe --bind-to none -np "$np" "$build/zshard-bench" $model_flags --strategies ddp,zero3 \
      --json "$out/zshard_np${np}_$rep.json" >/dev/null
    # shellcheck disable=SC2086
    mpirun --oversubscribe --bind-to none -np "$np" /usr/bin/python3 "$src/peers/torch_ddp.py" $model_flags \
      --json "$out/torch_np${np}_$rep.json" >/dev/null
  done
done
/usr/bin/python3 - "$out" "$repeats" <<'PY'
import json, statistics, sys
out, repeats = sys.argv[1], int(sys.argv[2])
print("| np | torch DDP ms | zshard ddp ms | zshard zero3 ms | torch/ddp | torch/zero3 |")
print("|---|---|---|---|---|---|")
for np in (2, 4):
    torch = [json.load(open(f"{out}/torch_np{np}_{r}.json"))["step_ms"]["median"] for r in range(1, repeats + 1)]
    zs = {"ddp": [], "zero3": []}
    for r in range(1, repeats + 1):
        for res in json.load(open(f"{out}/zshard_np{np}_{r}.json"))["results"]:
            zs[res["strategy"]].append(res["step_ms"]["median"])
    t, d, z = statistics.median(torch), statistics.median(zs["ddp"]), statistics.median(zs["zero3"])
    print(f"| {np} | {t:.1f} | {d:.1f} | {z:.1f} | {t / d:.2f} | {t / z:.2f} |")
PY
