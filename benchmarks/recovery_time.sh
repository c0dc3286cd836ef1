#!/usr/bin/env bash
# Time to recover from a lost host under zshard-run: on three hosts of 2 ranks (scripts/multihost.sh
# --head), every process of hostc is killed after step KILL_STEP, and the launcher relaunches on hosta
# and hostb from the newest checkpoint. Prints one markdown row per trial: the model, from the kill to
# mpirun's end (detection), from there to the relaunch's first finished step, the whole (kill to first
# step after recovery), the steps redone and the checkpoint's size.
#   benchmarks/recovery_time.sh BUILD_DIR [trials]
# Environment: MODEL_FLAGS (default: the tiny model; e.g. "--model gpt2 --layers 2 --seq 64"),
# STRATEGY (zero3), KILL_STEP (5).
set -euo pipefail
if [ -z "${MULTIHOST_CONTROL:-}" ]; then  # make the hosts, then run this on the head host
  exec bash "$(dirname "$0")/../scripts/multihost.sh" --hosts 2,2,2 --head -- bash "$0" "$@"
fi
build=$(realpath "$1") trials=${2:-3}
model_flags=${MODEL_FLAGS:---model tiny}
strategy=${STRATEGY:-zero3}
kill_step=${KILL_STEP:-5}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

field() { sed -n "s/.*\"$1\":\([^,}]*\).*/\1/p"; }
echo "| model | kill to mpirun's end (s) | to the first step after recovery (s) | kill to first step (s) | steps redone | checkpoint |"
echo "|---|---|---|---|---|---|"
for trial in $(seq "$trials"); do
  d="$work/$trial"
  # shellcheck disable=SC2086
  "$build/zshard-run" --hosts "$MULTIHOST_HOSTS" --min-ranks 4 -- "$build/zshard-train" $model_flags \
    --strategy "$strategy" --batch 12 --steps $((kill_step + 4)) --save-every 2 --log-every 1 --save-dir "$d" \
    >"$work/out" 2>"$work/err" &
  run=$!
  until grep -qs "\"step\":$kill_step," "$d/zshard-run/attempt-1.jsonl"; do
    kill -0 $run 2>/dev/null || { echo "the job ended before step $kill_step" >&2; tail "$work/err" >&2; exit 1; }
    sleep 0.05
  done
  killed_at=$(date +%s.%N)
  "$MULTIHOST_CONTROL" kill hostc
  wait $run || { echo "zshard-run failed" >&2; tail "$work/err" >&2; exit 1; }
  "$MULTIHOST_CONTROL" start hostc
  record=$(cat "$d/zshard-run/restarts.jsonl")
  failed=$(field failed_at <<<"$record") recovered=$(field recovered_at <<<"$record")
  size=$(du -sh "$d/$(printf 'step-%08d' "$(field resumed_step <<<"$record")")" | cut -f1)
  printf '| %s | %.1f | %.1f | %.1f | %s | %s |\n' "$model_flags" "$(echo "$failed - $killed_at" | bc)" \
    "$(echo "$recovered - $failed" | bc)" "$(echo "$recovered - $killed_at" | bc)" \
    "$(field steps_redone <<<"$record")" "$size"
done
