#!/bin/bash
# zshard-tune against an exhaustive timing of every candidate that fits, on one problem, in one command:
#   benchmarks/tune_exhaustive.sh BUILD_DIR OUT_DIR [tuner repeats]
# 1. zshard-tune (its default search: a calibrating run and the top 3, each run twice) REPEATS times, with
#    one zshard-tune --exhaustive --repeats 1 (every candidate that fits, run once) after the first;
# 2. each pick of the tuner and the exhaustive run's fastest 3, timed again in ROUNDS interleaved rounds
#    (zshard-bench, 1 warm-up and 5 timed steps), so that the comparison does not rest on one noisy run.
# Prints the exhaustive ranking, each tuner run's pick, time and wall time against the exhaustive one's,
# and the re-timed minimum and median of each contender, as markdown (OUT/summary.md).
# Environment: PROBLEM overrides the model, ranks, global batch and budget; LAUNCHER the launcher; ROUNDS (3).
set -euo pipefail
build=$1 out=$2 repeats=${3:-3} rounds=${ROUNDS:-3}
src=$(cd "$(dirname "$0")" && pwd)
# shellcheck disable=SC2206
problem=(${PROBLEM:---model gpt2 --layers 2 --np 4 --global-batch 8 --seq 32 --mem-budget 800MB --rank-batches even})
launcher=${LAUNCHER:-mpirun --oversubscribe --bind-to none -np {np}}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
mkdir -p "$out"
: >"$out/loads.txt"
for rep in $(seq "$repeats"); do
  echo "tune_$rep $(cut -d' ' -f1-3 /proc/loadavg)" >>"$out/loads.txt"
  "$build/zshard-tune" "${problem[@]}" --launcher "$launcher" --json "$out/tune_$rep.json" | tee "$out/tune_$rep.txt"
  if [ "$rep" = 1 ]; then
    echo "exhaustive $(cut -d' ' -f1-3 /proc/loadavg)" >>"$out/loads.txt"
    "$build/zshard-tune" "${problem[@]}" --launcher "$launcher" --exhaustive --repeats 1 --time-budget 6h \
      --json "$out/exhaustive.json" | tee "$out/exhaustive.txt"
  fi
done
/usr/bin/python3 "$src/tune_summary.py" --bin "$build" --out "$out" --repeats "$repeats" --rounds "$rounds" \
  --launcher "$launcher" | tee "$out/summary.md"
