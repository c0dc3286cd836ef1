#!/usr/bin/env bash
# The GPU checks of a lent GPU machine in ONE device-tool call (docs/cuda.md, "A lent GPU"): what only a
# GPU can show, in order of what it proves, each step printing its verdict as it ends.
#
#   scripts/gpu-acceptance.sh              on the GPU machine: the plan below, within ZSHARD_GPU_BUDGET_S
#                                          (default 570 s) in all
#                                          (ZSHARD_GPU_STEPS="tiny gpt2 ..." runs only those, with setup
#                                          and build: a second call finishing what the first ran out of)
#   scripts/gpu-acceptance.sh --dry-run    anywhere (CI): the plan with every step's time limit, each GPU
#                                          step reported SKIP; builds and runs nothing heavy, but round-
#                                          trips a small synthetic build through the archive code
#   scripts/gpu-acceptance.sh prepare      on the build machine, before the call: makes .gpudeps if it is
#                                          missing (scripts/gpu-bundle.sh) and checks that the working
#                                          tree and the carried folders fit the device tool's 64 MiB
#   scripts/gpu-acceptance.sh keep-build DIR   on the build machine, after a call: copies the build
#                                          archive from the reply's files_at DIR into .gpubuild/, which
#                                          the next call carries to skip the build
#   scripts/gpu-acceptance.sh pack BUILD   on the build machine, where nvcc is: archives BUILD (a build of
#                                          these sources with -DZSHARD_CUDA=ON, its targets built) into
#                                          .gpubuild/, so that even the first call builds nothing; the
#                                          build step rebuilds there if the archive does not start
#
# The steps (limit in seconds; each gets min(its limit, what is left of the budget), SKIP below 20 s):
#   setup       45  unpack .gpudeps (scripts/gpu-setup.sh), name the GPU
#   build      300  the targets the steps need on every core (zshard-train, zshard-bench, zshard-mem, the
#                   CUDA op, model and one-rank NCCL tests), sm_90; or unpacked from .gpubuild when its
#                   sources are these. Then the build goes to $OUT as build-gpu.tar.gz.NN (16 MiB each)
#   cuda-ops    90  tests/test_cuda_ops and test_cuda_model: every op, fp32 and bf16, against the CPU
#   nccl        45  tests/test_nccl_one_rank: every collective of the NCCL backend, split, the watchdog
#   tiny        60  tiny model 20 steps: cuda against cpu, fp32 within 1e-4; bf16 (the CPU's bf16 kernels
#                   round where the GPU's do) within twice what bf16 changes on the cpu (fp32 against bf16
#                   there): each side is that far from fp32, so the two are at most twice as far apart
#   mpi        180  np 2 and 4 on the one GPU through --comm mpi, fp32 and bf16 (bf16 reductions), ddp,
#                   zero3 and hybrid, against one process: fp32 within 1e-4, bf16 within half of what bf16
#                   changes (tests/mpi/test_mixed_precision.cpp derives it)
#   memcheck   150  compute-sanitizer memcheck on the op tests and a 3-step tiny bf16 run with the
#                   optimizer offloaded (the copy stream)
#   gpt2       120  gpt2 124M bf16 at T=1024: tokens/s and MFU at the largest batch that fits, and at 8
#   llama       60  llama-3.2-1b bf16 at T=1024, batch 8: tokens/s and MFU
#   torch-peer 200  the PyTorch peer at the same batches, eager and torch.compile: the ratios
#   profile    150  one gpt2 step under ncu: device time by kind of kernel, and busy share of the step
#   async-save 150  not a GPU check: gpt2 np 2 --save-every 1 on the cpu device (benchmarks/async_save.sh),
#                   step time with async, sync and no saves, on the machine's many cores
#
# Output in $OUT (the device tool's folder; out/gpu, which git ignores, when unset): summary.txt (one line
# per step), results.json (with each step's metrics), logs.tar.gz, and the build archive: at most 8
# files, as the device tool returns. Exit status: 0 when every step passed (or was left out by
# ZSHARD_GPU_STEPS: OMIT), 1 when one failed or was skipped.
set -uo pipefail
CALLER_DIR=$PWD  # where a relative path given on the command line is from
cd "$(dirname "$0")/.." || exit 2
REPO=$(pwd)
MODE=run
case ${1:-} in
  "") ;;
  --dry-run) MODE=dry ;;
  prepare|keep-build|pack) MODE=$1 ;;
  *) echo "usage: $0 [--dry-run | prepare | keep-build FILES_AT_DIR | pack CUDA_BUILD_DIR]" >&2; exit 2 ;;
esac
BUILD=${ZSHARD_GPU_BUILD:-build-gpu}
case $BUILD in /*) ;; *) BUILD=$REPO/$BUILD ;; esac
KEPT=$REPO/.gpubuild  # the archive of an earlier call, carried
PART_BYTES=${ZSHARD_GPU_PART_BYTES:-16777216}
CARRY_LIMIT=$((64 * 1024 * 1024))
TARGETS=(zshard-train zshard-bench zshard-mem test_cuda_ops test_cuda_model test_nccl_one_rank)
export REPO BUILD KEPT PART_BYTES

# ---- the build archive: the built files the steps run, split into parts, keyed by the sources ----
# A hash of what the build reads: the call's tree has no .git, so not a commit.
source_key() {
  (cd "$REPO" && find CMakeLists.txt cmake include kernels comm shard models runtime tests/unit \
     tests/support tests/CMakeLists.txt -type f 2>/dev/null | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-16)
}
# pack_build BUILD_DIR DEST_DIR KEY: BUILD_DIR's libraries and the targets' executables as DEST/build-gpu.tar.gz.NN
pack_build() {
  local dir=$1 dest=$2 key=$3 files t
  files=$(cd "$dir" && { ls libzshard_*.so* 2>/dev/null; for t in $TARGETS_LIST; do ls "$t" "tests/$t" 2>/dev/null; done; })
  [ -n "$files" ] || { echo "pack_build: nothing built in $dir" >&2; return 1; }
  echo "$key" >"$dir/SOURCE_KEY"
  # shellcheck disable=SC2086
  tar -C "$dir" -czf - SOURCE_KEY $files | split -b "$PART_BYTES" -d - "$dest/build-gpu.tar.gz."
  ls -l "$dest"/build-gpu.tar.gz.* | awk '{print "  " $NF ": " $5 " bytes"}'
}
# unpack_build SRC_DIR BUILD_DIR KEY: true when SRC's parts hold a build of these sources, unpacked
unpack_build() {
  local src=$1 dir=$2 key=$3
  ls "$src"/build-gpu.tar.gz.* >/dev/null 2>&1 || return 1
  mkdir -p "$dir"
  cat "$src"/build-gpu.tar.gz.* | tar -C "$dir" -xzf - || return 1
  [ "$(cat "$dir/SOURCE_KEY" 2>/dev/null)" = "$key" ]
}
export TARGETS_LIST="${TARGETS[*]}"
export -f source_key pack_build unpack_build

if [ "$MODE" = keep-build ]; then
  src=${2:?"keep-build needs the reply's files_at folder"}
  ls "$src"/build-gpu.tar.gz.* >/dev/null 2>&1 || { echo "keep-build: no build-gpu.tar.gz.* in $src" >&2; exit 1; }
  rm -rf "$KEPT" && mkdir -p "$KEPT" && cp "$src"/build-gpu.tar.gz.* "$KEPT"/
  echo "keep-build: $(du -sh "$KEPT" | cut -f1) in $KEPT; carry it: carry=[\".gpudeps\", \".gpubuild\"]"
  MODE=prepare  # and check that it all still fits
fi

if [ "$MODE" = pack ]; then
  dir=${2:?"pack needs a CUDA build folder"}
  case $dir in /*) ;; *) dir=$CALLER_DIR/$dir ;; esac
  cache=$dir/CMakeCache.txt
  # The archive is keyed by this tree's sources: the build must be of this tree, with the CUDA path, in
  # Release (the gpt2 and profile figures) and for sm_90 (the default; an explicit list must hold 90).
  [ -f "$cache" ] || { echo "pack: $dir is not a CMake build folder" >&2; exit 1; }
  [ "$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$cache")" -ef "$REPO" ] ||
    { echo "pack: $dir is a build of another source tree, not of $REPO" >&2; exit 1; }
  grep -q '^CMAKE_CUDA_FLAGS:STRING=' "$cache" ||  # in the cache once CUDA is enabled (ON, or AUTO with nvcc)
    { echo "pack: $dir is not a build with the CUDA path (-DZSHARD_CUDA=ON)" >&2; exit 1; }
  grep -q '^CMAKE_BUILD_TYPE:STRING=Release$' "$cache" || { echo "pack: $dir is not a Release build" >&2; exit 1; }
  archs=$(sed -n 's/^CMAKE_CUDA_ARCHITECTURES:STRING=//p' "$cache")
  [ -z "$archs" ] || [[ ";$archs;" == *";90"* ]] ||
    { echo "pack: $dir is built for CUDA architectures $archs, without sm_90" >&2; exit 1; }
  # shellcheck disable=SC2086
  cmake --build "$dir" --target ${TARGETS[*]} || { echo "pack: building the targets in $dir failed" >&2; exit 1; }
  rm -rf "$KEPT" && mkdir -p "$KEPT" && pack_build "$dir" "$KEPT" "$(source_key)" || exit 1
  MODE=prepare
fi

if [ "$MODE" = prepare ]; then
  [ -f .gpudeps/MANIFEST ] || bash scripts/gpu-bundle.sh || exit 1
  # What a call sends: tracked and untracked-not-ignored files, and the carried folders.
  tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
  deps=$(du -sb .gpudeps | cut -f1)
  kept=0
  [ -d "$KEPT" ] && kept=$(du -sb "$KEPT" | cut -f1)
  total=$((tree + deps + kept))
  printf 'carry: tree %d + .gpudeps %d + .gpubuild %d = %d bytes of %d (%d%%)\n' "$tree" "$deps" "$kept" \
    "$total" "$CARRY_LIMIT" $((100 * total / CARRY_LIMIT))
  [ "$total" -le "$CARRY_LIMIT" ] || { echo "prepare: over the device tool's 64 MiB; drop .gpubuild or shrink the tree" >&2; exit 1; }
  carry='".gpudeps"'
  [ -d "$KEPT" ] && carry='".gpudeps", ".gpubuild"'
  echo "run(command=\"bash scripts/gpu-acceptance.sh\", carry=[$carry], timeout_s=600)"
  exit 0
fi

OUT=${OUT:-$REPO/out/gpu}
BUDGET=${ZSHARD_GPU_BUDGET_S:-570}
LOGS=$(mktemp -d /tmp/zshard-gpu.XXXXXX)
mkdir -p "$OUT"
T0=$SECONDS
NPROC=$(nproc)
ORIG_LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}
export OUT LOGS NPROC ORIG_LD_LIBRARY_PATH MODE
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1} OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export MPIRUN="mpirun --oversubscribe --bind-to none"

# ---- the step runner ----
declare -a RESULTS=()
record() {  # name status seconds note
  RESULTS+=("$1|$2|$3|$4")
  printf '%-11s %-5s %4ss  %s\n' "$1" "$2" "$3" "$4"
}
# step NAME LIMIT FUNCTION WHAT: FUNCTION in its own bash under `timeout` (its process group killed at
# the limit), output to LOGS/NAME.log; it may write a one-line note to LOGS/NAME.note and metrics (a JSON
# object) to LOGS/NAME.json; exit 77 means SKIP. WHAT says what the step proves.
step() {
  local name=$1 limit=$2 fn=$3 what=$4 left t rc note status
  left=$((BUDGET - (SECONDS - T0) - 15))  # 15 s for the summary and the logs
  [ "$limit" -le "$left" ] || limit=$left
  echo "---- $name (limit ${limit}s): $what"
  if [ "$MODE" = dry ] && [ "$name" != build ]; then
    record "$name" SKIP 0 "dry run: needs the GPU machine"
    return
  fi
  if [ -n "${ZSHARD_GPU_STEPS:-}" ] && [[ " setup build $ZSHARD_GPU_STEPS " != *" $name "* ]]; then
    record "$name" OMIT 0 "not among ZSHARD_GPU_STEPS"  # left out on purpose: not a failure
    return
  fi
  if [ "$limit" -lt 20 ]; then
    record "$name" SKIP 0 "out of time (budget ${BUDGET}s)"
    return
  fi
  t=$SECONDS
  STEP_NAME=$name timeout -k 10 "$limit" bash -c "$fn" >"$LOGS/$name.log" 2>&1
  rc=$?
  note=$(head -c 600 "$LOGS/$name.note" 2>/dev/null | tr '\n' ' ')
  if [ $rc -eq 0 ]; then status=PASS
  elif [ $rc -eq 77 ]; then status=SKIP
  else
    status=FAIL
    { [ $rc -eq 124 ] || [ $rc -eq 137 ]; } && note="timed out after ${limit}s; $note"
    [ -n "$note" ] || note="exit $rc; $(grep -v '^\s*$' "$LOGS/$name.log" | tail -2 | tr '\n' ' ' | head -c 300)"
  fi
  record "$name" "$status" $((SECONDS - t)) "$note"
}
note() { echo "$*" >>"$LOGS/$STEP_NAME.note"; }
first_error() {  # the first line of FILE that looks like the reason of a failure, else its last line
  { grep -m1 -iE "error|exception|terminate|abort|not found|fail|no cuda" "$1" || grep -v '^\s*$' "$1" | tail -1; } |
    head -c 240
}
# Runs a command, output to LOGS/NAME.out; on failure notes why and exits the step.
run_logged() {  # NAME COMMAND...
  local name=$1
  shift
  "$@" >"$LOGS/$name.out" 2>&1 || { cat "$LOGS/$name.out"; note "$name failed: $(first_error "$LOGS/$name.out")"; exit 1; }
}
export -f note first_error run_logged

# ---- steps ----
step_setup() {
  # shellcheck source=gpu-setup.sh
  source scripts/gpu-setup.sh || { note "gpu-setup.sh failed"; exit 1; }
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$LOGS/gpu.csv"
  [ -s "$LOGS/gpu.csv" ] || { note "no GPU visible to nvidia-smi"; exit 1; }
  note "$(head -1 "$LOGS/gpu.csv"); $(mpirun --version 2>&1 | head -1); NCCL ${ZSHARD_NCCL_FOUND:-?}; $(nvcc --version | tail -1)"
}

step_build() {
  local key targets
  key=$(source_key)
  read -ra targets <<<"$TARGETS_LIST"
  if [ "$MODE" = dry ]; then
    echo "would build: cmake --build $BUILD -j$NPROC --target ${targets[*]} (-DZSHARD_CUDA=ON, sm_90), sources $key"
    [ -d "$KEPT" ] && echo "would first try the build kept in $KEPT"
    # The archive's round trip on a synthetic build, in parts of 1 KiB: the code the real build goes through.
    local fake out back
    fake=$(mktemp -d) out=$(mktemp -d) back=$(mktemp -d)
    mkdir -p "$fake/tests"
    head -c 5000 /dev/urandom >"$fake/libzshard_core.so"
    for t in "${targets[@]}"; do echo "$t" >"$fake/$t"; cp "$fake/$t" "$fake/tests/$t"; done
    PART_BYTES=1024 pack_build "$fake" "$out" "$key" || exit 1
    unpack_build "$out" "$back" "$key" || { note "the archive's round trip failed"; exit 1; }
    cmp -s "$fake/libzshard_core.so" "$back/libzshard_core.so" || { note "the archive changed libzshard_core.so"; exit 1; }
    note "dry run: built nothing; archive round trip of a synthetic build in $(ls "$out" | wc -l) parts: ok"
    rm -rf "$fake" "$out" "$back"
    exit 77
  fi
  ZSHARD_DEPS_QUIET=1 source scripts/gpu-setup.sh || { note "gpu-setup.sh failed"; exit 1; }
  if [ -d "$KEPT" ]; then
    if unpack_build "$KEPT" "$BUILD" "$key"; then
      # A build from another machine may not load here (its libraries): it must start before it is trusted.
      if LD_LIBRARY_PATH=$BUILD:$LD_LIBRARY_PATH "$BUILD/zshard-train" --help >"$LOGS/kept-build.out" 2>&1; then
        note "unpacked from .gpubuild (sources $key): nothing built"
        exit 0
      fi
      echo "the build in $KEPT does not start here ($(first_error "$LOGS/kept-build.out")): building"
      rm -rf "$BUILD"
    else
      echo "the build in $KEPT is of other sources than these ($key): building"
    fi
  fi
  local gen=()
  [ -f "$BUILD/CMakeCache.txt" ] || gen=(-G Ninja)
  # shellcheck disable=SC2086
  cmake -S . -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DZSHARD_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    $ZSHARD_DEPS_CMAKE_ARGS || { note "configure failed"; exit 1; }
  cmake --build "$BUILD" -j"$NPROC" --target "${targets[@]}" || { note "build failed: $(grep -m1 -E 'error' "$LOGS/build.log" | head -c 200)"; exit 1; }
  pack_build "$BUILD" "$OUT" "$key" || { note "built, but the archive failed"; exit 1; }
  note "built ${targets[*]} on $NPROC cores; archived to \$OUT as $(ls "$OUT"/build-gpu.tar.gz.* | wc -l) parts, $(cat "$OUT"/build-gpu.tar.gz.* | wc -c) bytes (sources $key)"
}

# What every step after the build runs with: the bundle's environment and the built library.
with_build() {
  ZSHARD_DEPS_QUIET=1 source scripts/gpu-setup.sh >/dev/null 2>&1 || { note "gpu-setup.sh failed"; exit 1; }
  export LD_LIBRARY_PATH=$BUILD:$LD_LIBRARY_PATH
  [ -x "$BUILD/zshard-train" ] || { note "no build (the build step failed)"; exit 1; }
}
export -f step_setup step_build with_build

step_cuda_ops() {
  with_build
  "$BUILD/tests/test_cuda_ops" --gtest_output=json:"$LOGS/cuda_ops.json"
  "$BUILD/tests/test_cuda_model" --gtest_output=json:"$LOGS/cuda_model.json"
  python3 scripts/gpu_compare.py gtest "$LOGS/cuda_ops.json" "$LOGS/cuda_model.json" | tee "$LOGS/cuda-ops.json"
  local rc=${PIPESTATUS[0]}
  note "$(python3 -c "import json; r = json.load(open('$LOGS/cuda-ops.json')); print(r['tests'], 'tests; failed:', ' '.join(r['failed'][:6]) or 'none', '; skipped:', len(r['skipped']))")"
  exit "$rc"
}

step_nccl() {
  with_build
  NCCL_DEBUG=WARN "$BUILD/tests/test_nccl_one_rank" --gtest_output=json:"$LOGS/nccl.json"
  python3 scripts/gpu_compare.py gtest "$LOGS/nccl.json" | tee "$LOGS/nccl-result.json"
  local rc=${PIPESTATUS[0]}
  note "$(python3 -c "import json; r = json.load(open('$LOGS/nccl-result.json')); print(r['tests'], 'tests; failed:', ' '.join(r['failed']) or 'none', '; skipped:', len(r['skipped']))")"
  exit "$rc"
}

step_tiny() {
  with_build
  local dtype device rc=0 args=(--model tiny --steps 20 --log-every 10)
  for dtype in fp32 bf16; do
    for device in cuda cpu; do
      run_logged "tiny-$device-$dtype" "$BUILD/zshard-train" "${args[@]}" --device $device --param-dtype $dtype \
        --log-json "$LOGS/tiny_${device}_$dtype.jsonl"
    done
  done
  python3 scripts/gpu_compare.py losses "$LOGS/tiny_cuda_fp32.jsonl" "$LOGS/tiny_cpu_fp32.jsonl" 1e-4 \
    >"$LOGS/tiny-fp32.json" || rc=1
  python3 scripts/gpu_compare.py within-effect "$LOGS/tiny_cuda_bf16.jsonl" "$LOGS/tiny_cpu_bf16.jsonl" \
    "$LOGS/tiny_cpu_fp32.jsonl" "$LOGS/tiny_cpu_bf16.jsonl" 2 >"$LOGS/tiny-bf16.json" || rc=1
  note "fp32 cuda vs cpu: $(cat "$LOGS/tiny-fp32.json"); bf16: $(cat "$LOGS/tiny-bf16.json")"
  exit $rc
}

step_mpi() {
  with_build
  local dtype s np rc=0 args=(--model tiny --steps 10 --log-every 5 --device cuda)
  for dtype in fp32 bf16; do
    run_logged "np1-$dtype" "$BUILD/zshard-train" "${args[@]}" --param-dtype $dtype --log-json "$LOGS/np1_$dtype.jsonl"
  done
  for np in 2 4; do
    for dtype in fp32 bf16; do
      for s in ddp zero3 hybrid; do
        local group=() run="np$np-$s-$dtype"
        [ $s = hybrid ] && group=(--shard-group $((np / 2)))
        # shellcheck disable=SC2086 # MPIRUN is a command and its flags
        run_logged "$run" $MPIRUN -np $np "$BUILD/zshard-train" "${args[@]}" --param-dtype $dtype \
          --reduce-dtype $dtype --comm mpi --strategy $s "${group[@]}" --log-json "$LOGS/$run.jsonl"
        if [ $dtype = fp32 ]; then
          python3 scripts/gpu_compare.py losses "$LOGS/$run.jsonl" "$LOGS/np1_$dtype.jsonl" 1e-4
        else
          python3 scripts/gpu_compare.py within-effect "$LOGS/$run.jsonl" "$LOGS/np1_$dtype.jsonl" \
            "$LOGS/np1_fp32.jsonl" "$LOGS/np1_bf16.jsonl" 0.5
        fi >"$LOGS/$run.json" || rc=1
        note "np $np $s $dtype: $(python3 -c "import json; r = json.load(open('$LOGS/$run.json')); print(f\"{r['max_rel_diff']:.2e} (tol {r['tol']:.1e})\")")"
      done
    done
  done
  exit $rc
}

step_memcheck() {
  with_build
  command -v compute-sanitizer >/dev/null || { note "compute-sanitizer not on PATH"; exit 77; }
  local sanitize=(compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 20)
  # The two passes over a (11, 12, 1024, 1024) attention backward are left out: minutes under memcheck.
  run_logged memcheck-ops "${sanitize[@]}" "$BUILD/tests/test_cuda_ops" --gtest_filter=-CudaOps.AttentionBackwardInPasses
  run_logged memcheck-tiny "${sanitize[@]}" "$BUILD/zshard-train" --model tiny --steps 3 --log-every 1 --device cuda \
    --param-dtype bf16 --offload optimizer
  note "no memcheck error in the op tests (all but AttentionBackwardInPasses) and in 3 steps of tiny bf16 offloaded: $(grep -h 'ERROR SUMMARY' "$LOGS"/memcheck-*.out | tr '\n' ' ')"
}

peak_tflops() {  # dense bf16 peak of GPU 0 by name (H100/H200 SXM: 989.4), 0 when unknown
  case $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1) in
    *H100*|*H200*|*H800*) echo 989.4 ;;
    *A100*) echo 312 ;;
    *) echo 0 ;;
  esac
}

bench_gpt2() {  # BATCH JSON: one zshard-bench run of gpt2 bf16 at T=1024
  "$BUILD/zshard-bench" --model gpt2 --param-dtype bf16 --seq 1024 --batch "$1" --device cuda --strategies ddp \
    --warmup-steps 1 --steps 3 --peak-tflops "$(peak_tflops)" --json "$2"
}

step_gpt2() {
  with_build
  local mem_mib gib proposal=0 b tried=()
  mem_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1 | tr -dc 0-9)
  gib=$(( ${mem_mib:-0} * 9 / 10 / 1024 ))  # headroom for the CUDA context, cuBLAS workspaces, fragmentation
  "$BUILD/zshard-mem" --model gpt2 --dtype mixed --seq 1024 --world 1 --strategy ddp --device-mem "${gib}GiB" \
    --json "$LOGS/gpt2_mem.json" && proposal=$(python3 -c "
import json; print(min(r.get('max_rank_batch', 0) for r in json.load(open('$LOGS/gpt2_mem.json'))['rows']))")
  local c=${proposal:-0}
  [ "$c" -gt 0 ] 2>/dev/null || c=32
  [ "$c" -le 96 ] || c=96
  local largest=0
  while [ "$c" -gt 8 ]; do
    tried+=("$c")
    if bench_gpt2 "$c" "$LOGS/gpt2_b$c.json" >"$LOGS/gpt2_b$c.out" 2>&1; then largest=$c; break; fi
    grep -qiE 'out of memory|MemoryAllocation|OUT_OF_MEMORY|ALLOC_FAILED|does not fit' "$LOGS/gpt2_b$c.out" ||
      { cat "$LOGS/gpt2_b$c.out"; note "batch $c failed, not for memory: $(first_error "$LOGS/gpt2_b$c.out")"; exit 1; }
    c=$(( c * 3 / 4 ))
  done
  run_logged gpt2-b8 bench_gpt2 8 "$LOGS/gpt2_b8.json"
  echo "$largest" >"$LOGS/gpt2_largest"
  python3 - "$LOGS" "$largest" "$proposal" "${tried[*]}" <<'PY'
import json, os, sys
logs, largest, proposal, tried = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
out, parts = {"zshard_mem_proposal": proposal, "tried": tried}, []
for b in sorted({largest, 8} - {0}, reverse=True):
    r = json.load(open(os.path.join(logs, f"gpt2_b{b}.json")))["results"][0]
    out[f"batch_{b}"] = {"tokens_per_s": r["tokens_per_s"], "mfu": r["mfu"], "step_ms": r["step_ms"]["median"],
                         "peak_total_bytes": r["peak_total_bytes"]}
    mfu = "n/a" if r["mfu"] is None else f'{100 * r["mfu"]:.1f}%'
    parts.append(f'batch {b}: {r["tokens_per_s"]:.0f} tok/s, MFU {mfu}, {r["step_ms"]["median"]:.0f} ms')
# The tracking allocator's figures at batch 8 beside zshard-mem's prediction for the same run.
try:
    mem = json.load(open(os.path.join(logs, "gpt2_mem.json")))["rows"][0]
    r = json.load(open(os.path.join(logs, "gpt2_b8.json")))["results"][0]
    states, peak = r["model_states_bytes"]["measured"], r["peak_total_bytes"]
    out["memory_batch_8"] = {"states_measured": states, "states_predicted": mem["model_states_bytes"],
                             "peak_measured": peak, "peak_predicted": mem["total_bytes"]}
    parts.append(f'batch 8 memory: states {states / 1e9:.3f} GB, zshard-mem {mem["model_states_bytes"] / 1e9:.3f} GB; '
                 f'peak {peak / 1e9:.2f} GB, zshard-mem {mem["total_bytes"] / 1e9:.2f} GB')
except (OSError, KeyError, IndexError, ValueError) as e:
    parts.append(f"no memory comparison ({e!r})")
json.dump(out, open(os.path.join(logs, "gpt2.json"), "w"))
open(os.path.join(logs, "gpt2.note"), "a").write(
    ("largest batch that fits: " + str(largest) if largest else f"no batch above 8 fitted (tried {tried})") +
    "; " + "; ".join(parts) + "\n")
PY
}

step_llama() {
  with_build
  run_logged llama-b8 "$BUILD/zshard-bench" --model llama-3.2-1b --param-dtype bf16 --seq 1024 --batch 8 \
    --device cuda --strategies ddp --warmup-steps 1 --steps 3 --peak-tflops "$(peak_tflops)" --json "$LOGS/llama.json"
  note "$(python3 -c "
import json; r = json.load(open('$LOGS/llama.json'))['results'][0]
print(f\"llama-3.2-1b batch 8: {r['tokens_per_s']:.0f} tok/s, MFU {100 * r['mfu']:.1f}%, {r['step_ms']['median']:.0f} ms\")")"
}

# Not a GPU check: the machine's 16 cores give the async checkpoint benchmark of issue #26 what a 2-core
# box cannot, a core for each rank and more for the writers.
step_async_save() {
  with_build
  NP=2 SAVE_DIR_ROOT=/dev/shm bash benchmarks/async_save.sh "$BUILD" 8 | tee "$LOGS/async_save.txt"
  local rc=${PIPESTATUS[0]}
  note "gpt2 np 2 --save-every 1 on the cpu, $NPROC cores: $(grep -E '^\| (no saves|sync|async) ' "$LOGS/async_save.txt" |
    awk -F'|' '{for (i = 2; i <= 7; i++) gsub(/^ +| +$/, "", $i); printf "%s %s ms, median %s (%s); ", $2, $3, $4, $7}')"
  exit "$rc"
}

step_torch_peer() {
  with_build
  local largest b mode rc=0
  largest=$(cat "$LOGS/gpt2_largest" 2>/dev/null || echo 0)
  for b in 8 $([ "$largest" -gt 8 ] && echo "$largest"); do
    for mode in eager compile; do
      local flags=(--mode plain --batch "$b" --seq 1024 --warmup 2 --steps 5 --json "$LOGS/torch_${mode}_b$b.json")
      [ $mode = compile ] && flags+=(--compile)
      LD_LIBRARY_PATH=$ORIG_LD_LIBRARY_PATH python3 benchmarks/peers/gpt2_torch_gpu.py "${flags[@]}" \
        >"$LOGS/torch_${mode}_b$b.out" 2>&1 || { rc=1; note "torch $mode batch $b: $(first_error "$LOGS/torch_${mode}_b$b.out")"; }
    done
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
export -f step_cuda_ops step_nccl step_tiny step_mpi step_memcheck peak_tflops bench_gpt2 step_gpt2 step_torch_peer
export -f step_profile step_llama step_async_save

# ---- the plan, in order ----
[ "$MODE" = dry ] && echo "dry run: the plan of one call, budget ${BUDGET}s; nothing runs on a GPU"
step setup 45 step_setup "the bundle unpacks and its MPI runs; the GPU, driver, nvcc and NCCL it finds"
step build 300 step_build "the CUDA path compiles and links against the bundle (or the kept build is of these sources)"
step cuda-ops 90 step_cuda_ops "every kernel, fp32 and bf16, matches the CPU op; GPT-2 on cuda matches cpu"
step nccl 45 step_nccl "NCCL's collectives, in place and out of place, split, stream order and the watchdog's abort"
step tiny 60 step_tiny "training on cuda matches the cpu: fp32 within 1e-4, bf16 within twice bf16's own effect"
step mpi 180 step_mpi "ddp, zero3 and hybrid at np 2 and 4 over mpi with device buffers, fp32 and bf16, match one process"
step memcheck 150 step_memcheck "no out-of-bounds or misaligned device access in the kernels, the runtime and the copy stream"
step gpt2 120 step_gpt2 "gpt2 124M bf16 at T=1024: tokens/s and MFU at the largest batch that fits and at 8"
step llama 60 step_llama "llama-3.2-1b bf16 at T=1024, batch 8: tokens/s and MFU (no peer)"
step torch-peer 200 step_torch_peer "PyTorch eager and torch.compile at the same batches on the same GPU: the ratios"
step profile 150 step_profile "where one gpt2 step's device time goes, by kind of kernel (ncu), and the GPU's busy share"
step async-save 150 step_async_save "issue #26's async checkpoint cost at np 2 with cores to spare (cpu device, the machine's cores)"

# ---- summary, results, logs ----
{
  echo "zshard GPU checks ($MODE), $(date -u +%FT%TZ), $(hostname), ${SECONDS}s of ${BUDGET}s"
  echo "GPU: $( [ -s "$LOGS/gpu.csv" ] && head -1 "$LOGS/gpu.csv" || echo none); sources $(source_key)"
  for r in "${RESULTS[@]}"; do IFS='|' read -r n s t m <<<"$r"; printf '%-11s %-5s %4ss  %s\n' "$n" "$s" "$t" "$m"; done
} >"$OUT/summary.txt"
printf '%s\n' "${RESULTS[@]}" >"$LOGS/results.txt"
python3 - "$LOGS" "$MODE" "$BUDGET" "$OUT/results.json" <<'PY'
import json, os, sys
logs, mode, budget, path = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
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
json.dump({"mode": mode, "budget_s": budget, "steps": steps}, open(path, "w"), indent=1)
PY
tar -czf "$OUT/logs.tar.gz" -C "$(dirname "$LOGS")" "$(basename "$LOGS")"
echo "==== summary ($OUT/summary.txt)"
cat "$OUT/summary.txt"
rm -rf "$LOGS"
[ "$MODE" = dry ] && exit 0
! printf '%s\n' "${RESULTS[@]}" | grep -qE '\|(FAIL|SKIP)\|'
