#!/bin/bash
# zshard ddp and zero3 beside PyTorch DDP (gloo, CPU, one thread per rank) on the same GPT-2 config and
# global batch, at np 2 and 4. Runs are interleaved (zshard, torch, zshard, torch, ...) so that machine
# noise hits both alike; prints the medians over repeats and the ratios as a markdown table, and writes
# OUT_DIR/summary.csv with each repeat's medians and loads (benchmarks/peer_summary.py).
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
# shellcheck disable=SC2206
summary_flags=(--repeats "$repeats" --nps $nps)
if [ "$ab" = 1 ]; then summary_flags+=(--poll-ab); fi
/usr/bin/python3 "$src/peer_summary.py" "$out" "${summary_flags[@]}"
