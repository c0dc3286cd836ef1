#!/usr/bin/env bash
# Step time with a checkpoint after every step (--save-every 1), asynchronous and synchronous, beside the
# same run without saves. The time of a step is taken between consecutive progress lines on rank 0, so it
# holds the step and what the boundary after the previous one cost (the snapshot and any wait for the
# save in flight, or the whole synchronous save); the first steps (warm-up) are left out. Prints one
# markdown row per mode and the snapshot's host bytes, measured and predicted (the memory report's).
#   benchmarks/async_save.sh BUILD_DIR [steps]
# Environment: NP (2), MODEL_FLAGS ("--model gpt2"), STRATEGY (zero2), BATCH (2), SEQ (64), SAVE_DIR_ROOT
# (a temp dir; saves keep one checkpoint: --keep 1).
set -euo pipefail
build=$(realpath "$1") steps=${2:-8}
np=${NP:-2} model_flags=${MODEL_FLAGS:---model gpt2} strategy=${STRATEGY:-zero2}
work=$(mktemp -d "${SAVE_DIR_ROOT:-${TMPDIR:-/tmp}}/zshard-async-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/../scripts/mpi-env.sh"

run() {  # run NAME FLAGS...: prints the mean, median and spread of the timed steps
  local name=$1
  shift
  # shellcheck disable=SC2086
  "${MPIRUN[@]}" -np "$np" "$build/zshard-train" $model_flags --strategy "$strategy" --batch "${BATCH:-2}" \
    --seq "${SEQ:-64}" --steps "$steps" --log-every 1 --mem-report "$work/$name.mem.json" "$@" |
    python3 -c '
import sys, time, statistics
stamps, lines = [], []
for line in sys.stdin:
    lines.append(line)
    if line.startswith("step "): stamps.append(time.monotonic())
open(sys.argv[1], "w").writelines(lines)
gaps = [b - a for a, b in zip(stamps, stamps[1:])][1:]  # the step after the first boundary on
print("%.0f|%.0f|%.0f|%d" % (1e3 * statistics.mean(gaps), 1e3 * statistics.median(gaps),
                              1e3 * (max(gaps) - min(gaps)), len(gaps)))
' "$work/$name.out"
}

none=$(run none)
sync=$(run sync --save-dir "$work/sync" --save-every 1 --keep 1 --save-mode sync)
async=$(run async --save-dir "$work/async" --save-every 1 --keep 1 --save-mode async)
IFS='|' read -r base base_median _ <<<"$none"
echo "| mode | ms per step (mean) | median | spread (ms) | steps timed | overhead vs no saves (mean, median) |"
echo "|---|---|---|---|---|---|"
for row in "no saves|$none" "sync|$sync" "async|$async"; do
  IFS='|' read -r mode mean median spread count <<<"$row"
  echo "| $mode | $mean | $median | $spread | $count |" \
    "$(python3 -c "print('%+.1f%%, %+.1f%%' % (100.0 * ($mean / $base - 1), 100.0 * ($median / $base_median - 1)))") |"
done
python3 - "$work/async.mem.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print("snapshot (host, per rank of the first shard group): measured %d bytes, predicted %d bytes"
      % (r["measured_checkpoint_snapshot"], r["predicted"]["checkpoint_snapshot"]))
PY
grep -h "checkpoint .* saved" "$work/sync.out" | tail -1 | sed 's/^/sync:  /'
grep -h "checkpoint .* saved" "$work/async.out" | tail -1 | sed 's/^/async: /'
