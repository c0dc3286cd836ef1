# shellcheck shell=bash
# The steps of scripts/gpu-acceptance.sh that measure speed on the GPU (sourced by it, which sets BUILD,
# LOGS, REPO, ... and defines note, run_logged, first_error, with_build and tiny_list): gpt2 with each
# switch on and off, the PyTorch peer, the profile, llama, and the optional async-save. Their limits and
# what each proves are in gpu-acceptance.sh's header and plan.

peak_tflops() {  # dense bf16 peak of GPU 0 by name (H100/H200 SXM: 989.4), 0 when unknown
  case $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1) in
    *H100*|*H200*|*H800*) echo 989.4 ;;
    *A100*) echo 312 ;;
    *) echo 0 ;;
  esac
}

# The run every switch is measured against: fused attention (cuDNN), the path the issue's targets are for.
export GPT2_BASE_FLAGS="--attention fused"
bench_gpt2() {  # BATCH JSON [FLAGS...]: one zshard-bench run of gpt2 bf16 at T=1024, FLAGS over the base's
  local base kept=() i
  read -ra base <<<"$GPT2_BASE_FLAGS"
  for ((i = 0; i < ${#base[@]}; i += 2)); do  # a base flag the switch sets again gives way to it
    [[ " ${*:3} " == *" ${base[i]} "* ]] || kept+=("${base[i]}" "${base[i + 1]}")
  done
  local cmd=("$BUILD/zshard-bench" --model gpt2 --param-dtype bf16 --seq 1024 --batch "$1" --device cuda
    --strategies ddp --warmup-steps 1 --steps 3 --peak-tflops "$(peak_tflops)" --json "$2" "${kept[@]}" "${@:3}")
  [ -z "${GPT2_LIST:-}" ] || { tiny_list "${cmd[@]}"; return; }  # the dry run's listing
  "${cmd[@]}"
}
# The switches of the training step measured on and off at both batches, ';' between them: their cost or
# gain in tokens/s and memory on a GPU, each against the base run. A new switch goes here.
gpu_mem_mib() { nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1 | tr -dc 0-9; }
export GPT2_SWITCHES="--activation-checkpointing blocks;--offload optimizer;--attention blocks;--fused-epilogues off;--cuda-graphs on"
export OOM_PATTERN='out of memory|MemoryAllocation|OUT_OF_MEMORY|ALLOC_FAILED|does not fit'

step_gpt2() {
  with_build
  local mem_mib gib proposal=0 b tried=()
  mem_mib=$(gpu_mem_mib)
  gib=$(( ${mem_mib:-0} * 9 / 10 / 1024 ))  # headroom for the CUDA context, cuBLAS workspaces, fragmentation
  # shellcheck disable=SC2086 # the base's flags, word by word
  "$BUILD/zshard-mem" --model gpt2 --dtype mixed --seq 1024 --world 1 --strategy ddp --device cuda \
    --device-mem "${gib}GiB" $GPT2_BASE_FLAGS --json "$LOGS/gpt2_mem.json" && proposal=$(python3 -c "
import json; print(min(r.get('max_rank_batch', 0) for r in json.load(open('$LOGS/gpt2_mem.json'))['rows']))")
  local c=${proposal:-0}
  [ "$c" -gt 0 ] 2>/dev/null || c=32
  local largest=0
  while [ "$c" -gt 8 ]; do
    tried+=("$c")
    if bench_gpt2 "$c" "$LOGS/gpt2_b$c.json" >"$LOGS/gpt2_b$c.out" 2>&1; then largest=$c; break; fi
    grep -qiE "$OOM_PATTERN" "$LOGS/gpt2_b$c.out" ||
      { cat "$LOGS/gpt2_b$c.out"; note "batch $c failed, not for memory: $(first_error "$LOGS/gpt2_b$c.out")"; exit 1; }
    c=$(( c * 3 / 4 ))
  done
  run_logged gpt2-b8 bench_gpt2 8 "$LOGS/gpt2_b8.json"
  echo "$largest" >"$LOGS/gpt2_largest"
  # The issue's memory target: the peak at batch 96, 70.7 GB before fused attention. Each measured batch's
  # peak goes beside zshard-mem's prediction for it.
  if [ "$largest" -gt 96 ]; then
    bench_gpt2 96 "$LOGS/gpt2_b96.json" >"$LOGS/gpt2_b96.out" 2>&1 || note "batch 96: $(first_error "$LOGS/gpt2_b96.out")"
  fi
  for b in 8 96 "$largest"; do
    # shellcheck disable=SC2086 # the base's flags, word by word
    [ -s "$LOGS/gpt2_b$b.json" ] && "$BUILD/zshard-mem" --model gpt2 --dtype mixed --seq 1024 --batch "$b" --world 1 \
      --strategy ddp --device cuda $GPT2_BASE_FLAGS --json "$LOGS/gpt2_mem_b$b.json" >/dev/null
  done
  local switches sw flags slug slugs=() rc=0
  IFS=';' read -ra switches <<<"$GPT2_SWITCHES"
  for sw in "${switches[@]}"; do
    read -ra flags <<<"$sw"
    slug=$(sed 's/^--//; s/ /=/g' <<<"$sw")
    slugs+=("$slug")
    for b in $( [ "$largest" -gt 8 ] && echo "$largest") 8; do
      bench_gpt2 "$b" "$LOGS/gpt2_b${b}_$slug.json" "${flags[@]}" >"$LOGS/gpt2_b${b}_$slug.out" 2>&1 && continue
      # A switch that holds more (blocks' scores) may not fit the batch the base fits: a result, not a failure.
      if [ "$b" != 8 ] && grep -qiE "$OOM_PATTERN" "$LOGS/gpt2_b${b}_$slug.out"; then note "batch $b $sw: does not fit"
      else rc=1; note "batch $b $sw failed: $(first_error "$LOGS/gpt2_b${b}_$slug.out")"; fi
    done
  done
  python3 - "$LOGS" "$largest" "$proposal" "${tried[*]}" "${slugs[@]}" <<'PY'
import json, os, sys
logs, largest, proposal, tried, slugs = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5:]
out, parts = {"zshard_mem_proposal": proposal, "tried": tried}, []
def figures(r):
    return {"tokens_per_s": r["tokens_per_s"], "mfu": r["mfu"], "step_ms": r["step_ms"]["median"],
            "peak_total_bytes": r["peak_total_bytes"]}
measured = sorted({b for b in (largest, 96, 8) if b and os.path.exists(os.path.join(logs, f"gpt2_b{b}.json"))},
                  reverse=True)
for b in measured:
    r = json.load(open(os.path.join(logs, f"gpt2_b{b}.json")))["results"][0]
    out[f"batch_{b}"] = figures(r)
    mfu = "n/a" if r["mfu"] is None else f'{100 * r["mfu"]:.1f}%'
    parts.append(f'batch {b}: {r["tokens_per_s"]:.0f} tok/s, MFU {mfu}, {r["step_ms"]["median"]:.0f} ms')
    # Each switch on, against this run with every switch off.
    for slug in slugs:
        path = os.path.join(logs, f"gpt2_b{b}_{slug}.json")
        if not os.path.exists(path):
            continue
        on = figures(json.load(open(path))["results"][0])
        on["tokens_per_s_over_off"] = on["tokens_per_s"] / r["tokens_per_s"]
        on["peak_over_off"] = on["peak_total_bytes"] / r["peak_total_bytes"]
        out[f"batch_{b}"][slug] = on
        parts.append(f'{slug}: {on["tokens_per_s_over_off"]:.2f}x tok/s, {on["peak_over_off"]:.2f}x peak')
# The tracking allocator's figures at each measured batch beside zshard-mem's prediction for the same run.
for b in measured:
    try:
        mem = json.load(open(os.path.join(logs, f"gpt2_mem_b{b}.json")))["rows"][0]
        r = json.load(open(os.path.join(logs, f"gpt2_b{b}.json")))["results"][0]
    except (OSError, KeyError, IndexError, ValueError) as e:
        parts.append(f"batch {b}: no memory comparison ({e!r})")
        continue
    states, peak = r["model_states_bytes"]["measured"], r["peak_total_bytes"]
    out[f"memory_batch_{b}"] = {"states_measured": states, "states_predicted": mem["model_states_bytes"],
                                "peak_measured": peak, "peak_predicted": mem["step_bytes"]}
    parts.append(f'batch {b} memory: states {states / 1e9:.3f} GB, zshard-mem {mem["model_states_bytes"] / 1e9:.3f} GB; '
                 f'peak {peak / 1e9:.2f} GB, zshard-mem {mem["step_bytes"] / 1e9:.2f} GB '
                 f'(measured {peak / mem["step_bytes"]:.3f} of it)')
json.dump(out, open(os.path.join(logs, "gpt2.json"), "w"))
open(os.path.join(logs, "gpt2.note"), "a").write(
    ("largest batch that fits: " + str(largest) if largest else f"no batch above 8 fitted (tried {tried})") +
    "; " + "; ".join(parts) + "\n")
PY
  exit $rc
}

# The runs at batch 8, the base and each switch, as the GPU step makes them: the dry run checks their flags.
step_gpt2_dry() {
  local sw flags switches
  GPT2_LIST=1 bench_gpt2 8 "$LOGS/gpt2_b8.json"
  IFS=';' read -ra switches <<<"$GPT2_SWITCHES"
  for sw in "${switches[@]}"; do
    read -ra flags <<<"$sw"
    GPT2_LIST=1 bench_gpt2 8 "$LOGS/gpt2_b8_$(sed 's/^--//; s/ /=/g' <<<"$sw").json" "${flags[@]}"
  done
  note "the base ($GPT2_BASE_FLAGS) and ${#switches[@]} switches at batch 8, then at the largest batch that fits"
}

step_llama() {
  with_build
  run_logged llama-b8 "$BUILD/zshard-bench" --model llama-3.2-1b --param-dtype bf16 --seq 1024 --batch 8 \
    --device cuda --strategies ddp --warmup-steps 1 --steps 3 --peak-tflops "$(peak_tflops)" --json "$LOGS/llama.json"
  note "$(python3 -c "
import json; r = json.load(open('$LOGS/llama.json'))['results'][0]
print(f\"llama-3.2-1b batch 8: {r['tokens_per_s']:.0f} tok/s, MFU {100 * r['mfu']:.1f}%, {r['step_ms']['median']:.0f} ms\")")"
}

# Not a GPU check: the machine's 16 cores give the async checkpoint benchmark what a 2-core
# box cannot, a core for each rank and more for the writers.
step_async_save() {
  with_build
  NP=2 SAVE_DIR_ROOT=/dev/shm bash benchmarks/async_save.sh "$BUILD" 8 | tee "$LOGS/async_save.txt"
  local rc=${PIPESTATUS[0]}
  note "gpt2 np 2 --save-every 1 on the cpu, $NPROC cores: $(grep -E '^\| (no saves|sync|async) ' "$LOGS/async_save.txt" |
    awk -F'|' '{for (i = 2; i <= 7; i++) gsub(/^ +| +$/, "", $i); printf "%s %s ms, median %s (%s); ", $2, $3, $4, $7}')"
  exit "$rc"
}

# Not a GPU check either: full fine-tuning of llama-3.2-1b at its 16 layers, 4 ranks on the cpu device, every
# strategy, for the fine-tuning figures (benchmarks/RESULTS.md, "The 16-layer model under LoRA, every
# strategy"): full ddp holds about 80 GB of host memory, which the build machine lacks and this one has.
step_finetune_host() {
  with_build
  MODEL_FLAGS="--model llama-3.2-1b" MODES=full STEPS=1 BLAS_THREADS=$((NPROC >= 8 ? NPROC / 4 : 1)) \
    bash benchmarks/lora_memory.sh "$BUILD" "$LOGS/finetune" | tee "$LOGS/finetune_host.txt"
  local rc=${PIPESTATUS[0]}
  note "llama-3.2-1b full fine-tuning, np 4 on the cpu, $NPROC cores: $(grep -E '^\| full ' "$LOGS/finetune_host.txt" |
    awk -F'|' '{for (i = 2; i <= 8; i++) gsub(/^ +| +$/, "", $i); printf "%s states %s peak %s MiB, %s s, comm %s; ", $3, $4, $6, $7, $8}')"
  exit "$rc"
}

# torch's batch beside zshard's largest: torch holds more per sequence (eager and compile differ), so each
# mode runs at 8 and then at the largest batch its own peak at 8 says fits (peak/8 per sequence, static
# memory included: an underestimate of the batch, never an out-of-memory spent), at most zshard's largest;
# zshard runs at that batch too, so that every ratio is taken at one batch.
torch_peer_run() {  # MODE BATCH: one PyTorch run, its JSON in torch_MODE_bBATCH.json; 1 when it failed
  local flags=(--mode plain --batch "$2" --seq 1024 --warmup 2 --steps 5 --json "$LOGS/torch_${1}_b$2.json")
  [ "$1" = compile ] && flags+=(--compile)
  LD_LIBRARY_PATH=$ORIG_LD_LIBRARY_PATH python3 benchmarks/peers/gpt2_torch_gpu.py "${flags[@]}" \
    >"$LOGS/torch_${1}_b$2.out" 2>&1 || { note "torch $1 batch $2: $(first_error "$LOGS/torch_${1}_b$2.out")"; return 1; }
}
step_torch_peer() {
  with_build
  local largest mem_mib b mode rc=0
  largest=$(cat "$LOGS/gpt2_largest" 2>/dev/null || echo 0)
  mem_mib=$(gpu_mem_mib)
  for mode in eager compile; do
    torch_peer_run $mode 8 || { rc=1; continue; }
    [ "$largest" -gt 8 ] || continue
    b=$(python3 -c "import json; p = json.load(open('$LOGS/torch_${mode}_b8.json'))['peak_mem_bytes']
print(min($largest, int(0.9 * ${mem_mib:-0} * 2**20 / (p / 8)) // 8 * 8))")
    [ "$b" -gt 8 ] || { note "torch $mode: no batch above 8 fits"; continue; }
    torch_peer_run $mode "$b" || rc=1
    [ -f "$LOGS/gpt2_b$b.json" ] || bench_gpt2 "$b" "$LOGS/gpt2_b$b.json" >"$LOGS/gpt2_b$b.out" 2>&1 ||
      { rc=1; note "zshard batch $b: $(first_error "$LOGS/gpt2_b$b.out")"; }
  done
  python3 - "$LOGS" <<'PY'
import glob, json, os, re, sys
logs = sys.argv[1]
out, parts = {}, []
for path in sorted(glob.glob(os.path.join(logs, "torch_*_b*.json"))):
    mode, b = re.match(r"torch_(\w+)_b(\d+)\.json", os.path.basename(path)).groups()
    t = json.load(open(path))
    if t.get("oom"):
        parts.append(f"{mode} b{b}: out of memory")
        continue
    z = json.load(open(os.path.join(logs, f"gpt2_b{b}.json")))["results"][0] if os.path.exists(os.path.join(logs, f"gpt2_b{b}.json")) else None
    ratio = t["tokens_per_s"] / z["tokens_per_s"] if z else None
    out[f"{mode}_b{b}"] = {"tokens_per_s": t["tokens_per_s"], "mfu": t["mfu"], "torch": t["torch"], "device": t["device"],
                           "peak_mem_bytes": t["peak_mem_bytes"], "zshard_tokens_per_s": z and z["tokens_per_s"],
                           "torch_over_zshard": ratio}
    parts.append(f"{mode} b{b} {t['tokens_per_s']:.0f} tok/s" + (f" ({ratio:.2f}x zshard)" if ratio else ""))
json.dump(out, open(os.path.join(logs, "torch-peer.json"), "w"))
open(os.path.join(logs, "torch-peer.note"), "a").write("; ".join(parts) + "\n")
PY
  exit $rc
}
step_profile() {
  with_build
  local ncu step_ms
  ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
  [ -n "$ncu" ] || { note "ncu not found"; exit 77; }
  # One step of gpt2 batch 8, every kernel timed on its own (ncu serialises them).
  local one_step=("$BUILD/zshard-bench" --model gpt2 --param-dtype bf16 --seq 1024 --batch 8 --device cuda
    --strategies ddp --warmup-steps 0 --steps 1)
  run_logged profile-ncu "$ncu" --clock-control none --metrics gpu__time_duration.sum --csv \
    --log-file "$LOGS/profile_ncu.csv" "${one_step[@]}"
  step_ms=$(python3 -c "import json; print(json.load(open('$LOGS/gpt2_b8.json'))['results'][0]['step_ms']['median'])" \
    2>/dev/null)
  python3 benchmarks/kernel_profile.py "$LOGS/profile_ncu.csv" --from embedding_forward ${step_ms:+--step-ms "$step_ms"} \
    --json "$LOGS/profile.json" >"$LOGS/profile.txt" || { cat "$LOGS/profile.txt"; note "kernel_profile.py failed"; exit 1; }
  cat "$LOGS/profile.txt"
  note "$(head -1 "$LOGS/profile.txt"); $(sed -n '3,6p' "$LOGS/profile.txt" | awk '{print $1, $2, $NF}' | tr '\n' ';')"
  # The costliest of zshard's own kernels, one launch each in detail: how near the memory or compute roof.
  local k
  for k in $(python3 -c "import json; print(' '.join(json.load(open('$LOGS/profile.json'))['own_kernels'][:4]))"); do
    "$ncu" --clock-control none --section SpeedOfLight --kernel-name "regex:$k" --launch-count 1 "${one_step[@]}" \
      >"$LOGS/profile_sol_$k.txt" 2>&1
    grep -E "Duration|DRAM Throughput|Memory Throughput|Compute \(SM\)|SM Frequency" "$LOGS/profile_sol_$k.txt" |
      sed "s/^/$k: /"
  done
}
export -f peak_tflops bench_gpt2 gpu_mem_mib step_gpt2 step_gpt2_dry
export -f torch_peer_run step_torch_peer step_profile step_llama step_async_save step_finetune_host
