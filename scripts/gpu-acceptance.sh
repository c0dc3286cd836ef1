#!/usr/bin/env bash
# The GPU acceptance runs, for the lent GPU machine (docs/cuda.md, "Running the GPU checks"). Two stages,
# each well under the device tool's 10 minutes per command (ZSHARD_GPU_BUDGET_S, default 540 s):
#
#   scripts/gpu-acceptance.sh build-and-test   unpack .gpudeps (scripts/gpu-setup.sh), build build-gpu
#                                              (-DZSHARD_CUDA=ON, sm_90), ctest -R Cuda, the CUDA op tests
#                                              with their JSON report, then the whole ctest suite
#   scripts/gpu-acceptance.sh measure          (builds first if build-gpu is missing or stale)
#       flags       zshard-train/zshard-bench --help list --device --comm --param-dtype --reduce-dtype
#       tiny        tiny model, 20 steps fp32, --device cuda vs --device cpu: per-step loss rel diff <= 1e-4
#       offload     tiny model, 10 steps fp32 on cuda, --offload optimizer vs none: the same losses, bit for bit
#                   (the host AdamW and the device kernel round every operation alike)
#       offload-mem gpt2, bf16 params, seq 1024, batch 4, 3 steps, --offload optimizer vs none: device peak and
#                   model states beside host memory, from --mem-report (offloaded: no optimizer bytes on the
#                   device, host within 5% of the prediction), and the step times
#       mpi-np2/4   mpirun -np 2 / 4 on the one GPU, --device cuda --comm mpi, fp32: ddp vs zero3 losses
#                   <= 1e-4 rel; at np 4 zero3's per-rank model-state memory <= 0.3x ddp's (--mem-report)
#       nccl-gpt2   one rank, --comm nccl, gpt2, bf16 params, seq 1024: the largest batch that fits
#                   (zshard-mem --device-mem proposes, then a descending list), tokens/s and MFU of ddp and
#                   zero3 from zshard-bench --json
#       torch-peer  benchmarks/peers/gpt2_torch_gpu.py at the same batch (DDP and FSDP2, world 1), and the
#                   ratios torch/zshard in tokens/s
#   scripts/gpu-acceptance.sh all              both stages in one go (fits the budget only when build-gpu
#                                              is already built)
#
# Every step is independent: a failure (or a missing flag) is recorded and the next step runs. Each step
# gets min(its own limit, what is left of the budget); with too little left it is SKIPPED. Output, in
# $OUT (the device tool's folder; out/gpu, which git ignores, when unset), per stage STAGE:
#   summary-STAGE.txt    one line per step: PASS / FAIL / SKIP, seconds, a note with the numbers
#   results-STAGE.json   the same plus each step's metrics
#   logs-STAGE.tar.gz    every log, JSON, memory report and the ctest JUnit file
# Exit status: 0 when every step passed, 1 otherwise (the files are written either way).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
REPO=$(pwd)
STAGE=${1:-all}
case $STAGE in build-and-test|measure|all) ;; *) echo "usage: $0 build-and-test|measure|all" >&2; exit 2 ;; esac
OUT=${OUT:-$REPO/out/gpu}
BUDGET=${ZSHARD_GPU_BUDGET_S:-540}
BUILD=${ZSHARD_GPU_BUILD:-build-gpu}
LOGS=$(mktemp -d /tmp/zshard-gpu-$STAGE.XXXXXX)
mkdir -p "$OUT"
T0=$SECONDS
NPROC=$(nproc)
ORIG_LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}
export REPO BUILD LOGS NPROC ORIG_LD_LIBRARY_PATH

# ---- the prefix with OpenMPI, OpenBLAS, nlohmann-json, CLI11, GoogleTest ----
SETUP_OK=1
# shellcheck source=gpu-setup.sh
source scripts/gpu-setup.sh >"$LOGS/setup.log" 2>&1 || SETUP_OK=0
cat "$LOGS/setup.log"
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1} OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
MPIRUN="mpirun --oversubscribe --bind-to none"
export MPIRUN

# ---- the step runner ----
declare -a RESULTS=()
record() {  # name status seconds note
  RESULTS+=("$1|$2|$3|$4")
  printf '%-14s %-5s %5ss  %s\n' "$1" "$2" "$3" "$4"
}
# step NAME LIMIT_S FUNCTION: runs FUNCTION in its own bash under `timeout` (its whole process group is
# killed when the limit passes); stdout+stderr go to LOGS/NAME.log. The function may write a one-line
# note to LOGS/NAME.note and metrics (a JSON object) to LOGS/NAME.json.
step() {
  local name=$1 limit=$2 fn=$3 left t rc note status
  left=$((BUDGET - (SECONDS - T0) - 20))
  if [ "$left" -lt 30 ]; then
    record "$name" SKIP 0 "out of time budget (${BUDGET}s per invocation)"
    return
  fi
  [ "$limit" -le "$left" ] || limit=$left
  echo "---- $name (limit ${limit}s)"
  t=$SECONDS
  timeout -k 10 "$limit" bash -c "$fn" >"$LOGS/$name.log" 2>&1
  rc=$?
  note=$(head -c 400 "$LOGS/$name.note" 2>/dev/null | tr '\n' ' ')
  if [ $rc -eq 0 ]; then status=PASS
  elif [ $rc -eq 77 ]; then status=SKIP
  else
    status=FAIL
    [ $rc -eq 124 ] || [ $rc -eq 137 ] && note="timed out after ${limit}s; $note"
    [ -n "$note" ] || note="exit $rc; log tail: $(grep -v '^\s*$' "$LOGS/$name.log" | tail -2 | tr '\n' ' ' | head -c 300)"
  fi
  record "$name" "$status" $((SECONDS - t)) "$note"
}
note() { echo "$*" >>"$LOGS/$STEP_NAME.note"; }
first_error() {  # the first line of FILE that looks like the reason of a failure, else its last line
  { grep -m1 -iE "error|exception|terminate|abort|not found|not installed|unrecognized|not expected|fail|no cuda" "$1" ||
    grep -v '^\s*$' "$1" | tail -1; } | head -c 240
}
export -f note first_error

# A comparison helper shared by the steps (python3 is on the GPU image; jq may not be).
cat >"$LOGS/compare.py" <<'PY'
import json, sys

def losses(path):
    with open(path) as f:
        return [json.loads(line)["loss"] for line in f if line.strip()]

def max_rel(a, b):
    if len(a) != len(b) or not a:
        raise SystemExit(f"step counts differ: {len(a)} vs {len(b)}")
    return max(abs(x - y) / max(abs(x), 1e-12) for x, y in zip(a, b))

def model_states(path):
    """Per-rank model-state bytes (max over ranks) from a --mem-report file: the top-level figure is the
    tracked allocator of the run's device ("device": "cuda"); a per-device section wins if there is one."""
    with open(path) as f:
        doc = json.load(f)
    for key in ("device", "cuda"):
        sub = doc.get(key)
        if isinstance(sub, dict) and "measured_model_states_max" in sub:
            return sub["measured_model_states_max"], f"{key}.measured_model_states_max"
    if "measured_model_states_max" in doc:
        return doc["measured_model_states_max"], "measured_model_states_max"
    return max(r["model_states_peak"] for r in doc["ranks"]), "max(ranks[].model_states_peak)"

if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "losses":  # A.jsonl B.jsonl tol
        a, b = losses(sys.argv[2]), losses(sys.argv[3])
        r = max_rel(a, b)
        print(json.dumps({"steps": len(a), "max_rel_diff": r, "tol": float(sys.argv[4]),
                          "first": [a[0], b[0]], "last": [a[-1], b[-1]]}))
        sys.exit(0 if r <= float(sys.argv[4]) else 1)
    if cmd == "mem-ratio":  # zero3.json ddp.json limit
        z, zk = model_states(sys.argv[2])
        d, dk = model_states(sys.argv[3])
        ratio = z / d
        device = json.load(open(sys.argv[2])).get("device")
        print(json.dumps({"zero3_bytes": z, "ddp_bytes": d, "ratio": ratio, "limit": float(sys.argv[4]), "key": zk,
                          "device": device if isinstance(device, str) else None}))
        sys.exit(0 if ratio <= float(sys.argv[4]) else 1)
PY

# ---- steps ----
step_gpu_info() {
  nvidia-smi || true
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$LOGS/gpu.csv"
  [ -s "$LOGS/gpu.csv" ] || { note "no GPU visible to nvidia-smi"; exit 1; }
  note "$(head -1 "$LOGS/gpu.csv")"
}

step_build() {
  local gen=() keep=(-k)
  command -v ninja >/dev/null && gen=(-G Ninja) keep=(-k 0)
  [ -f "$BUILD/CMakeCache.txt" ] && gen=()  # the generator is fixed at the first configure
  # shellcheck disable=SC2086
  cmake -S . -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DZSHARD_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    $ZSHARD_DEPS_CMAKE_ARGS || { note "configure failed"; exit 1; }
  if ! cmake --build "$BUILD" -j"$NPROC" -- "${keep[@]}"; then
    note "build failed (kept going: $(ls "$BUILD"/zshard-* 2>/dev/null | wc -l) tools built; see the log)"
    exit 1
  fi
  note "built $(cd "$BUILD" && echo zshard-*)"
}

step_cuda_ctest() {
  ctest --test-dir "$BUILD" -R Cuda --output-on-failure --timeout 120 | tee "$LOGS/cuda-ctest.out"
  local rc=${PIPESTATUS[0]}
  grep -qE 'tests passed|tests failed' "$LOGS/cuda-ctest.out" || { note "no Cuda tests found"; exit 1; }
  note "$(grep -E 'tests passed|tests failed' "$LOGS/cuda-ctest.out" | tail -1); $(grep -c '(Skipped)' "$LOGS/cuda-ctest.out") skipped"
  exit "$rc"
}

step_cuda_ops() {
  local bin=$BUILD/tests/test_cuda_ops
  [ -x "$bin" ] || { note "$bin missing"; exit 1; }
  "$bin" --gtest_output=json:"$LOGS/cuda_ops.json"
  python3 - "$LOGS/cuda_ops.json" "$LOGS/cuda-ops.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
res = {"tests": 0, "failed": [], "skipped": []}
for suite in doc["testsuites"]:
    for t in suite["testsuite"]:
        res["tests"] += 1
        name = f'{suite["name"]}.{t["name"]}'
        if t.get("failures"):
            res["failed"].append(name)
        if t.get("result") == "SKIPPED" or t.get("status") == "NOTRUN":
            res["skipped"].append(name)
json.dump(res, open(sys.argv[2], "w"))
print(json.dumps(res))
sys.exit(0 if res["tests"] and not res["failed"] and not res["skipped"] else 1)
PY
  local rc=$?
  note "$(python3 -c "
import json
r = json.load(open('$LOGS/cuda-ops.json'))
def names(v): return 'none' if not v else f'{len(v)} (' + ' '.join(v[:4]) + (' ...' if len(v) > 4 else '') + ')'
print(f\"{r['tests']} tests, failed: {names(r['failed'])}, skipped: {names(r['skipped'])}\")" 2>/dev/null)"
  exit $rc
}

step_ctest_all() {
  ctest --test-dir "$BUILD" -j"$NPROC" --timeout 300 --output-on-failure --output-junit "$LOGS/ctest-all.xml" \
    | tee "$LOGS/ctest-all.out"
  local rc=${PIPESTATUS[0]}
  grep -qE 'tests passed|tests failed' "$LOGS/ctest-all.out" || { note "no tests found"; exit 1; }
  note "$(grep -E 'tests passed|tests failed' "$LOGS/ctest-all.out" | tail -1); failed: $(sed -n '/The following tests FAILED/,$p' "$LOGS/ctest-all.out" | grep -oE '[0-9]+ - [^ ]+' | cut -d' ' -f3 | tr '\n' ' ')"
  exit "$rc"
}

step_flags() {
  local missing=() tool f
  for tool in zshard-train zshard-bench; do
    [ -x "$BUILD/$tool" ] || { note "$tool not built"; exit 1; }
    "$BUILD/$tool" --help >"$LOGS/$tool.help" 2>&1
    for f in --device --comm --param-dtype --reduce-dtype; do
      grep -qE -- "(^|[ ,])$f([ =,]|\$)" "$LOGS/$tool.help" || missing+=("$tool $f")
    done
  done
  if [ ${#missing[@]} -gt 0 ]; then note "missing: ${missing[*]}"; exit 1; fi
  note "all four flags present in zshard-train and zshard-bench"
}

step_tiny() {
  local common=(--model tiny --steps 20 --log-every 5)
  "$BUILD/zshard-train" "${common[@]}" --device cuda --param-dtype fp32 --log-json "$LOGS/tiny_cuda.jsonl" \
    >"$LOGS/tiny_cuda.out" 2>&1 || { cat "$LOGS/tiny_cuda.out"; note "the cuda run failed: $(first_error "$LOGS/tiny_cuda.out")"; exit 1; }
  cat "$LOGS/tiny_cuda.out"
  "$BUILD/zshard-train" "${common[@]}" --device cpu --log-json "$LOGS/tiny_cpu.jsonl" \
    >"$LOGS/tiny_cpu.out" 2>&1 || { cat "$LOGS/tiny_cpu.out"; note "the cpu run failed: $(first_error "$LOGS/tiny_cpu.out")"; exit 1; }
  cat "$LOGS/tiny_cpu.out"
  python3 "$LOGS/compare.py" losses "$LOGS/tiny_cuda.jsonl" "$LOGS/tiny_cpu.jsonl" 1e-4 | tee "$LOGS/tiny.json"
  local rc=${PIPESTATUS[0]}
  note "cuda vs cpu, 20 steps fp32: $(cat "$LOGS/tiny.json")"
  exit "$rc"
}

step_checkpointing() {  # --activation-checkpointing blocks recomputes the same ops: the same losses, bit for bit
  local model mode rc=0
  for model in tiny llama-tiny; do
    for mode in none blocks; do
      "$BUILD/zshard-train" --model "$model" --steps 20 --log-every 10 --device cuda --activation-checkpointing "$mode" \
        --log-json "$LOGS/ckpt_${model}_$mode.jsonl" >"$LOGS/ckpt_${model}_$mode.out" 2>&1 ||
        { cat "$LOGS/ckpt_${model}_$mode.out"; note "$model $mode failed: $(first_error "$LOGS/ckpt_${model}_$mode.out")"; exit 1; }
    done
    python3 "$LOGS/compare.py" losses "$LOGS/ckpt_${model}_blocks.jsonl" "$LOGS/ckpt_${model}_none.jsonl" 0 |
      tee "$LOGS/ckpt_$model.txt" || rc=1
    note "$model blocks vs none, 20 steps fp32 on cuda: $(cat "$LOGS/ckpt_$model.txt")"
  done
  exit "$rc"
}

step_offload() {  # --offload optimizer moves AdamW to the host, in the same fp32 arithmetic: the same losses
  local mode
  for mode in none optimizer; do
    "$BUILD/zshard-train" --model tiny --steps 10 --log-every 5 --device cuda --param-dtype fp32 --offload "$mode" \
      --log-json "$LOGS/offload_$mode.jsonl" >"$LOGS/offload_$mode.out" 2>&1 ||
      { cat "$LOGS/offload_$mode.out"; note "--offload $mode failed: $(first_error "$LOGS/offload_$mode.out")"; exit 1; }
    cat "$LOGS/offload_$mode.out"
  done
  python3 "$LOGS/compare.py" losses "$LOGS/offload_optimizer.jsonl" "$LOGS/offload_none.jsonl" 0 | tee "$LOGS/offload.json"
  local rc=${PIPESTATUS[0]}
  note "tiny, 10 steps fp32 on cuda, --offload optimizer vs none: $(cat "$LOGS/offload.json")"
  exit "$rc"
}

step_offload_mem() {  # device and host memory of an offloaded gpt2 run beside the plain one
  local mode
  for mode in none optimizer; do
    "$BUILD/zshard-train" --model gpt2 --device cuda --param-dtype bf16 --seq 1024 --batch 4 --steps 3 --log-every 1 \
      --offload "$mode" --mem-report "$LOGS/offload_mem_$mode.json" --log-json "$LOGS/offload_mem_$mode.jsonl" \
      >"$LOGS/offload_mem_$mode.out" 2>&1 ||
      { cat "$LOGS/offload_mem_$mode.out"; note "gpt2 --offload $mode failed: $(first_error "$LOGS/offload_mem_$mode.out")"; exit 1; }
    cat "$LOGS/offload_mem_$mode.out"
  done
  python3 - "$LOGS" <<'PY'
import json, os, sys
logs = sys.argv[1]
GiB = 2**30
out, parts = {}, []
for mode in ("none", "optimizer"):
    rep = json.load(open(os.path.join(logs, f"offload_mem_{mode}.json")))
    r = rep["ranks"][0]
    steps = [json.loads(line) for line in open(os.path.join(logs, f"offload_mem_{mode}.jsonl")) if line.strip()]
    live = r["live"]
    out[mode] = {"device_peak": r["peak_total"], "device_states": live["params"] + live["grads"] + live["optimizer"],
                 "device_optimizer": live["optimizer"], "host": live["host"], "host_predicted": rep["predicted"]["host"],
                 "zero_offload_host": rep["predicted"].get("zero_offload", {}).get("host", 0),
                 "last_step_ms": steps[-1]["ms"]}
    o = out[mode]
    parts.append(f"{mode}: device peak {o['device_peak'] / GiB:.2f} GiB (model states {o['device_states'] / GiB:.2f}), "
                 f"host {o['host'] / GiB:.2f} GiB (predicted {o['host_predicted'] / GiB:.2f}), "
                 f"step {o['last_step_ms']:.0f} ms")
json.dump(out, open(os.path.join(logs, "offload-mem.json"), "w"))
with open(os.path.join(logs, "offload-mem.note"), "a") as f:
    f.write("gpt2 bf16 seq 1024 batch 4 on cuda; " + "; ".join(parts) + "\n")
print(json.dumps(out))
o = out["optimizer"]
ok = o["device_optimizer"] == 0 and abs(o["host"] / max(o["host_predicted"], 1) - 1) <= 0.05
sys.exit(0 if ok else 1)
PY
}

step_mpi() {  # NP
  local np=$1 s rc=0
  for s in ddp zero3; do
    $MPIRUN -np "$np" "$BUILD/zshard-train" --model tiny --steps 20 --log-every 5 --strategy "$s" \
      --device cuda --comm mpi --param-dtype fp32 --reduce-dtype fp32 \
      --log-json "$LOGS/mpi_np${np}_$s.jsonl" --mem-report "$LOGS/mpi_np${np}_${s}_mem.json" \
      >"$LOGS/mpi_np${np}_$s.out" 2>&1
    local run_rc=$?
    cat "$LOGS/mpi_np${np}_$s.out"
    [ $run_rc = 0 ] || { note "np $np $s run failed: $(first_error "$LOGS/mpi_np${np}_$s.out")"; exit 1; }
  done
  python3 "$LOGS/compare.py" losses "$LOGS/mpi_np${np}_ddp.jsonl" "$LOGS/mpi_np${np}_zero3.jsonl" 1e-4 \
    >"$LOGS/mpi_np${np}_losses.json" || rc=1
  note "ddp vs zero3: $(cat "$LOGS/mpi_np${np}_losses.json")"
  echo '{}' >"$LOGS/mpi_np${np}_mem.json"
  if [ "$np" = 4 ]; then
    python3 "$LOGS/compare.py" mem-ratio "$LOGS/mpi_np4_zero3_mem.json" "$LOGS/mpi_np4_ddp_mem.json" 0.3 \
      >"$LOGS/mpi_np4_mem.json" || rc=1
    note "; model states per rank zero3/ddp: $(cat "$LOGS/mpi_np4_mem.json")"
  fi
  python3 -c "import json, sys; json.dump({'losses': json.load(open(sys.argv[1])), 'memory': json.load(open(sys.argv[2]))}, open(sys.argv[3], 'w'))" \
    "$LOGS/mpi_np${np}_losses.json" "$LOGS/mpi_np${np}_mem.json" "$LOGS/mpi-np$np.json" 2>/dev/null
  exit $rc
}

peak_tflops() {  # dense bf16 peak of GPU 0 by name (H100/H200 SXM: 989.4), 0 when unknown
  case $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1) in
    *H100*|*H200*|*H800*) echo 989.4 ;;
    *A100*) echo 312 ;;
    *) echo 0 ;;
  esac
}

step_nccl_gpt2() {
  local mem_mib gib proposal start b tried=() peak
  peak=$(peak_tflops)
  mem_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1 | tr -dc 0-9)
  gib=$(( ${mem_mib:-0} * 9 / 10 / 1024 ))  # headroom for the CUDA context, cuBLAS workspaces, fragmentation
  proposal=0
  if [ "$gib" -gt 0 ]; then
    "$BUILD/zshard-mem" --model gpt2 --dtype mixed --seq 1024 --world 1 --strategy ddp,zero3 \
      --device-mem "${gib}GiB" --json "$LOGS/gpt2_mem_estimate.json" || true
    proposal=$(python3 -c "
import json
rows = json.load(open('$LOGS/gpt2_mem_estimate.json'))['rows']
print(min(r.get('max_rank_batch', 0) for r in rows))" 2>/dev/null || echo 0)
  fi
  start=$proposal
  [ "${start:-0}" -gt 0 ] 2>/dev/null || start=32
  [ "$start" -le 64 ] || start=64
  local cands=() c=$start
  while [ "$c" -ge 1 ]; do cands+=("$c"); c=$(( c * 3 / 4 )); done
  echo "zshard-mem proposes $proposal sequences (device ${gib} GiB usable); trying ${cands[*]}"
  for b in "${cands[@]}"; do
    tried+=("$b")
    if timeout -k 5 200 $MPIRUN -np 1 "$BUILD/zshard-bench" --model gpt2 --param-dtype bf16 --reduce-dtype fp32 \
         --seq 1024 --batch "$b" --device cuda --comm nccl --strategies ddp,zero3 --warmup-steps 1 --steps 3 \
         --peak-tflops "$peak" --json "$LOGS/gpt2_bench.json" >"$LOGS/gpt2_b$b.log" 2>&1; then
      cat "$LOGS/gpt2_b$b.log"
      echo "$b" >"$LOGS/gpt2_batch"
      python3 - "$LOGS/gpt2_bench.json" "$b" "$proposal" "${tried[*]}" "$LOGS/nccl-gpt2.json" "$LOGS/nccl-gpt2.note" <<'PY'
import json, sys
bench, b, proposal, tried, out_path, note_path = sys.argv[1:7]
doc = json.load(open(bench))
out = {"batch": int(b), "proposed_by_zshard_mem": int(proposal), "tried": tried, "seq": doc["seq"],
       "params": doc["model"]["params"], "peak_tflops": doc.get("peak_tflops_per_rank")}
parts = []
for r in doc["results"]:
    out[r["strategy"]] = {"tokens_per_s": r["tokens_per_s"], "tflops": r["tflops"], "mfu": r["mfu"],
                          "step_ms": r["step_ms"]["median"], "peak_total_bytes": r["peak_total_bytes"]}
    mfu = "n/a" if r["mfu"] is None else f'{100 * r["mfu"]:.1f}%'
    parts.append(f'{r["strategy"]} {r["tokens_per_s"]:.0f} tok/s, {r["step_ms"]["median"]:.0f} ms, MFU {mfu}')
json.dump(out, open(out_path, "w"))
with open(note_path, "a") as f:
    f.write(f"batch {b} fits (tried {tried}; zshard-mem proposed {proposal}): " + "; ".join(parts) + "\n")
print(json.dumps(out))
PY
      exit $?
    fi
    echo "batch $b: failed ($(grep -ciE 'out of memory|cudaErrorMemoryAllocation|CUDA_ERROR_OUT_OF_MEMORY|CUBLAS_STATUS_ALLOC_FAILED' "$LOGS/gpt2_b$b.log") OOM lines); last lines:"
    tail -3 "$LOGS/gpt2_b$b.log"
    grep -qiE 'out of memory|MemoryAllocation|OUT_OF_MEMORY|ALLOC_FAILED' "$LOGS/gpt2_b$b.log" ||
      { note "batch $b failed, not out of memory: $(first_error "$LOGS/gpt2_b$b.log")"; exit 1; }
  done
  note "no batch fitted (tried ${tried[*]})"
  exit 1
}

step_torch_peer() {
  local b mode rc=0
  b=$(cat "$LOGS/gpt2_batch" 2>/dev/null || echo 8)
  for mode in ddp fsdp2; do
    local prc
    LD_LIBRARY_PATH=$ORIG_LD_LIBRARY_PATH python3 benchmarks/peers/gpt2_torch_gpu.py --batch "$b" --seq 1024 \
      --mode "$mode" --warmup 3 --steps 10 --json "$LOGS/torch_$mode.json" >"$LOGS/torch_$mode.out" 2>&1
    prc=$?
    if [ $prc != 0 ] && [ $prc != 3 ] && [ $prc != 2 ]; then  # 3: out of memory, 2: no GPU / usage
      echo "torch $mode failed (exit $prc); again with the for-each AdamW (--no-fused)"
      cat "$LOGS/torch_$mode.out"
      LD_LIBRARY_PATH=$ORIG_LD_LIBRARY_PATH python3 benchmarks/peers/gpt2_torch_gpu.py --batch "$b" --seq 1024 \
        --mode "$mode" --no-fused --warmup 3 --steps 10 --json "$LOGS/torch_$mode.json" >"$LOGS/torch_$mode.out" 2>&1
      prc=$?
    fi
    cat "$LOGS/torch_$mode.out"
    [ $prc = 0 ] || { rc=1; note "torch $mode failed (exit $prc): $(first_error "$LOGS/torch_$mode.out")"; }
  done
  python3 - "$LOGS" "$b" <<'PY'
import json, os, sys
logs, b = sys.argv[1], int(sys.argv[2])
def load(name):
    try:
        return json.load(open(os.path.join(logs, name)))
    except Exception:
        return None
z = load("nccl-gpt2.json") or {}
out = {"batch": b}
for mode, strat in (("ddp", "ddp"), ("fsdp2", "zero3")):
    t = load(f"torch_{mode}.json")
    if not t or t.get("oom"):
        continue
    out[f"torch_{mode}"] = {"tokens_per_s": t["tokens_per_s"], "mfu": t["mfu"], "step_ms": t["step_ms"]["median"],
                            "peak_mem_bytes": t["peak_mem_bytes"], "device": t["device"], "torch": t["torch"]}
    if strat in z:
        out[f"torch_{mode}_over_zshard_{strat}"] = t["tokens_per_s"] / z[strat]["tokens_per_s"]
json.dump(out, open(os.path.join(logs, "torch-peer.json"), "w"))
print(json.dumps(out))
parts = [f'torch {m} {out["torch_" + m]["tokens_per_s"]:.0f} tok/s' for m in ("ddp", "fsdp2") if "torch_" + m in out]
parts += [f"{k} {v:.2f}" for k, v in out.items() if k.endswith(("_ddp", "_zero3"))]
with open(os.path.join(logs, "torch-peer.note"), "a") as f:
    f.write(f"batch {b}: " + ("; ".join(parts) or "no result") + "\n")
PY
  exit $rc
}
export -f step_gpu_info step_build step_cuda_ctest step_cuda_ops step_ctest_all step_flags step_tiny \
  step_checkpointing step_offload step_offload_mem step_mpi peak_tflops step_nccl_gpt2 step_torch_peer

run_step() {  # NAME LIMIT FUNCTION [ARGS]
  local name=$1 limit=$2
  shift 2
  STEP_NAME=$name step "$name" "$limit" "export STEP_NAME=$name; $*"
}

if [ $SETUP_OK = 0 ]; then
  record setup FAIL $((SECONDS - T0)) "gpu-setup.sh failed: $(tail -2 "$LOGS/setup.log" | tr '\n' ' ')"
else
  record setup PASS $((SECONDS - T0)) "$(grep -m1 'Open MPI' "$LOGS/setup.log" | sed 's/^ *//'); NCCL ${ZSHARD_NCCL_FOUND:-?}"
fi
run_step gpu-info 30 step_gpu_info
if [ "$STAGE" != measure ]; then
  run_step build 420 step_build
  run_step cuda-ctest 150 step_cuda_ctest
  run_step cuda-ops 120 step_cuda_ops
  run_step ctest-all 400 step_ctest_all
else
  run_step build 420 step_build  # a no-op when build-and-test ran on this (still warm) machine
fi
if [ "$STAGE" != build-and-test ]; then
  run_step flags 30 step_flags
  run_step tiny 90 step_tiny
  run_step checkpointing 120 step_checkpointing
  run_step offload 60 step_offload
  run_step offload-mem 120 step_offload_mem
  run_step mpi-np2 90 "step_mpi 2"
  run_step mpi-np4 120 "step_mpi 4"
  run_step nccl-gpt2 300 step_nccl_gpt2
  run_step torch-peer 180 step_torch_peer
fi

# ---- summary, results, logs ----
{
  echo "zshard GPU acceptance, stage $STAGE, $(date -u +%FT%TZ), $(hostname), ${SECONDS}s"
  echo "GPU: $(head -1 "$LOGS/gpu.csv" 2>/dev/null || echo unknown); commit $(git rev-parse --short HEAD 2>/dev/null || echo ?)"
  for r in "${RESULTS[@]}"; do IFS='|' read -r n s t m <<<"$r"; printf '%-14s %-5s %5ss  %s\n' "$n" "$s" "$t" "$m"; done
} >"$OUT/summary-$STAGE.txt"
printf '%s\n' "${RESULTS[@]}" >"$LOGS/results.txt"
python3 - "$LOGS" "$STAGE" "$OUT/results-$STAGE.json" <<'PY'
import json, os, sys
logs, stage, path = sys.argv[1:4]
steps = []
for line in open(os.path.join(logs, "results.txt")):
    name, status, secs, note = line.rstrip("\n").split("|", 3)
    entry = {"step": name, "status": status, "seconds": int(secs), "note": note}
    metrics = os.path.join(logs, name + ".json")
    if os.path.exists(metrics):
        try:
            entry["metrics"] = json.load(open(metrics))
        except ValueError:
            pass
    steps.append(entry)
json.dump({"stage": stage, "steps": steps}, open(path, "w"), indent=1)
PY
cp "$LOGS/setup.log" "$LOGS/gpu-setup.log" 2>/dev/null
[ -f "$BUILD/Testing/Temporary/LastTest.log" ] && cp "$BUILD/Testing/Temporary/LastTest.log" "$LOGS/ctest-LastTest.log"
tar -czf "$OUT/logs-$STAGE.tar.gz" -C "$(dirname "$LOGS")" "$(basename "$LOGS")"
echo "==== summary ($OUT/summary-$STAGE.txt)"
cat "$OUT/summary-$STAGE.txt"
rm -rf "$LOGS"
! grep -q '|FAIL|\||SKIP|' <(printf '%s\n' "${RESULTS[@]}")
