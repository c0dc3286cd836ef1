#!/usr/bin/env bash
# LoRA against full fine-tuning at 4 ranks, every strategy: memory per rank (model states and the frozen
# copy, measured beside the prediction), step time and bytes communicated per step, from zshard-bench's
# JSON. Prints one markdown row per run. A run whose estimate exceeds this host's memory is refused by the
# set-up check and shown as such (full fine-tuning of a large model under ddp, for one).
#   benchmarks/lora_memory.sh BUILD_DIR OUT_DIR
# Environment: MODEL_FLAGS ("--model llama-3.2-1b --layers 2"), LORA ("--lora-rank 16 --lora-targets
# q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"), STRATEGIES (ddp zero1 zero2 zero3 hybrid),
# MODES (full lora), BATCH (4), SEQ (64), STEPS (2), BLAS_THREADS (1: OpenBLAS threads per rank, for a host
# with cores to spare).
set -euo pipefail
build=$(realpath "$1") out=$(realpath -m "$2")
mkdir -p "$out"
source "$(dirname "$0")/../scripts/mpi-env.sh"
export OPENBLAS_NUM_THREADS=${BLAS_THREADS:-1}
model_flags=${MODEL_FLAGS:---model llama-3.2-1b --layers 2}
lora=${LORA:---lora-rank 16 --lora-targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj}
echo "| mode | strategy | states MiB measured / predicted | frozen MiB | peak MiB | step s | comm MiB/step measured / theory |"
echo "|---|---|---|---|---|---|---|"
for mode in ${MODES:-full lora}; do
  for strategy in ${STRATEGIES:-ddp zero1 zero2 zero3 hybrid}; do
    extra=() && [ "$mode" = lora ] && read -ra extra <<<"$lora"
    group=() && [ "$strategy" = hybrid ] && group=(--shard-group 2)
    json="$out/$mode-$strategy.json"
    # shellcheck disable=SC2086
    if ! "${MPIRUN[@]}" -np 4 "$build/zshard-bench" $model_flags "${extra[@]}" --strategies "$strategy" "${group[@]}" \
        --batch "${BATCH:-4}" --seq "${SEQ:-64}" --steps "${STEPS:-2}" --warmup-steps 1 --json "$json" \
        >"$out/$mode-$strategy.log" 2>&1; then
      echo "| $mode | $strategy | refused: $(grep -m1 -o 'error: .*' "$out/$mode-$strategy.log" | cut -c1-120) | | | | |"
      continue
    fi
    python3 - "$json" "$mode" "$strategy" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["results"][0]
mib = lambda b: b / 2**20
states, comm = r["model_states_bytes"], r["comm_bytes_per_step"]
print(f"| {sys.argv[2]} | {sys.argv[3]} | {mib(states['measured']):.1f} / {mib(states['theory']):.1f} "
      f"| {mib(r['peak_bytes']['frozen']):.1f} | {mib(r['peak_total_bytes']):.1f} | {r['step_ms']['median'] / 1000:.2f} "
      f"| {mib(comm['measured']):.2f} / {mib(comm['theory']):.2f} |")
PY
  done
done
