#!/bin/bash
# What the flight recorder (--trace-dir) and --check-collectives add to a step when nothing fails, in one
# command against the same build with both off: zshard-bench runs off, --trace-dir and --check-collectives
# in turn, REPEATS times, and the medians over the repeats of each run's median step are compared.
#   benchmarks/flight_overhead.sh BUILD_DIR OUT_DIR [repeats]
# Environment: NP (default 2), STRATEGIES (default zero3,hybrid at np 4, zero3 below), MODEL_FLAGS.
set -euo pipefail
build=$1 out=$2 repeats=${3:-5}
np=${NP:-2}
strategies=${STRATEGIES:-zero3}
model_flags=${MODEL_FLAGS:---model gpt2 --layers 2 --dim 256 --heads 4 --vocab 4096 --seq 128 --batch 16}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
mkdir -p "$out"
: >"$out/loads.txt"
for rep in $(seq "$repeats"); do
  for variant in off trace check; do
    case $variant in
      off) extra=() ;;
      trace) extra=(--trace-dir "$out/traces") ;;
      check) extra=(--check-collectives) ;;
    esac
    echo "${variant}_$rep $(cut -d' ' -f1-3 /proc/loadavg)" >>"$out/loads.txt"
    # shellcheck disable=SC2086
    mpirun --oversubscribe --bind-to none -np "$np" "$build/zshard-bench" $model_flags --strategies "$strategies" \
      --warmup-steps 3 --steps 20 "${extra[@]}" --json "$out/${variant}_$rep.json" >/dev/null
  done
done
/usr/bin/python3 - "$out" "$repeats" <<'PY'
import json, statistics, sys
out, repeats = sys.argv[1], int(sys.argv[2])
def medians(variant):
    runs = [json.load(open(f"{out}/{variant}_{r}.json")) for r in range(1, repeats + 1)]
    return {s: statistics.median(next(x for x in run["results"] if x["strategy"] == s)["step_ms"]["median"]
                                 for run in runs)
            for s in [x["strategy"] for x in runs[0]["results"]]}
off, trace, check = medians("off"), medians("trace"), medians("check")
print(f"{repeats} repeats, each variant's median step over them (ms)\n")
print("| strategy | off | --trace-dir | overhead | --check-collectives | overhead |")
print("|---|---|---|---|---|---|")
for s in off:
    print(f"| {s} | {off[s]:.2f} | {trace[s]:.2f} | {100 * (trace[s] / off[s] - 1):+.2f}% | {check[s]:.2f} "
          f"| {100 * (check[s] / off[s] - 1):+.2f}% |")
PY
