#!/usr/bin/env bash
# The GPU checks in ONE call on a GPU machine (docs/cuda.md, "The GPU checks in one call"): what only a
# GPU can show, in order of what it proves, each step printing its verdict as it ends.
#
#   scripts/gpu-acceptance.sh              on the GPU machine: the plan below, within ZSHARD_GPU_BUDGET_S
#                                          (default 400 s: room for a second call that finishes what
#                                          the first ran out of time for, or checks a fix)
#                                          (ZSHARD_GPU_STEPS="tiny gpt2 ..." runs only those, with setup
#                                          and build: a second call finishing what the first ran out of,
#                                          or async-save or finetune-host, which are not in the default
#                                          plan)
#   scripts/gpu-acceptance.sh --dry-run    anywhere (CI): the plan with every step's time limit, each GPU
#                                          step reported SKIP; builds and runs nothing heavy, but round-
#                                          trips a small synthetic build through the archive code, lists
#                                          the folders setup looks in for the CUDA libraries and the tiny
#                                          step's runs and comparisons; with ZSHARD_GPU_DRY_BUILD=DIR (a
#                                          CPU build) it runs those with cpu in place of cuda
#   scripts/gpu-acceptance.sh prepare      on the build machine, before the call: refuses a .gpubuild of
#                                          other sources than the tree's, makes .gpudeps if it is missing
#                                          (scripts/gpu-bundle.sh), checks that the working tree and the
#                                          carried folders fit the device tool's 64 MiB and prints the call
#   scripts/gpu-acceptance.sh keep-build DIR   on the build machine, after a call: copies the build
#                                          archive from the reply's files_at DIR into .gpubuild/, which
#                                          the next call carries to skip the build
#   scripts/gpu-acceptance.sh pack BUILD   on the build machine, where nvcc is: archives BUILD (a build of
#                                          this tree with -DZSHARD_CUDA=ON, its targets built) into
#                                          .gpubuild/, so that even the first call builds nothing; the
#                                          build step rebuilds there if the archive does not start
#
# The steps (limit in seconds; each gets min(its limit, what is left of the budget), SKIP below 20 s):
#   setup       45  unpack .gpudeps (scripts/gpu-setup.sh), name the GPU; the CUDA libraries' folders:
#                   the toolkit's lib64, then PyTorch's nvidia/*/lib (cublas, nccl, cudnn, ...)
#   build      300  unpacked from .gpubuild when its sources are these and its zshard-train starts (when
#                   it does not, the `ldd` lines "not found" are printed first); else the targets the steps
#                   need on every core (zshard-train, zshard-bench, zshard-mem, every tests/unit/
#                   test_cuda_*, the one-rank NCCL test), sm_90, and the build goes to $OUT as
#                   build-gpu.tar.gz.NN (16 MiB each)
#   cuda-ops    45  every tests/unit/test_cuda_* (every op and kernel, cuDNN's fused attention, and GPT-2): fp32
#                   and bf16 against the CPU
#   tiny        45  tiny model 20 steps, cuda against cpu: fp32 within 1e-4; bf16 (the CPU's bf16 kernels
#                   round where the GPU's do) within twice what bf16 changes on the cpu (fp32 against bf16
#                   there): each side is that far from fp32, so the two are at most twice as far apart.
#                   The same for the optimizer offloaded on cuda; activation checkpointing against none on
#                   cuda (fp32 within 1e-6, bf16 within half of bf16's effect: the same kernels recomputed);
#                   a save on cuda resumed on the cpu and a save on the cpu resumed on cuda, fp32 within 1e-4
#   memcheck    40  compute-sanitizer memcheck on the op tests and a 3-step tiny bf16 run with the
#                   optimizer offloaded (the copy stream)
#   gpt2        90  gpt2 124M bf16 at T=1024 with --attention fused: tokens/s and MFU at the largest batch
#                   that fits (no cap: fused holds no (B, H, T, T) scores), and at 8, each of GPT2_SWITCHES
#                   on and off, --attention blocks among them (at the largest batch it may not fit: noted);
#                   the peaks at 8, 96 and the largest batch beside zshard-mem's predictions
#   torch-peer 180  the PyTorch peer, eager and torch.compile, at 8 and at the largest batch each fits
#                   (from its peak at 8, at most zshard's largest), zshard at the same batches: the ratios
#   nccl        30  tests/test_nccl_one_rank: every collective of the NCCL backend, split, the watchdog
#   profile     90  one gpt2 step under ncu: device time by kind of kernel, and busy share of the step
#   mpi         60  np 2 and 4 on the one GPU through --comm mpi, fp32 and bf16 (bf16 reductions), ddp,
#                   zero3 and hybrid, against one process: fp32 within 1e-4, bf16 within half of what bf16
#                   changes (tests/mpi/test_mixed_precision.cpp derives it)
#   llama       60  llama-3.2-1b bf16 at T=1024, batch 8: tokens/s and MFU
#   async-save 150  only when ZSHARD_GPU_STEPS names it; not a GPU check: gpt2 np 2 --save-every 1 on the
#                   cpu device (benchmarks/async_save.sh), step time with async, sync and no saves, on the
#                   machine's many cores
#   finetune-host 420  only when ZSHARD_GPU_STEPS names it; not a GPU check: llama-3.2-1b full fine-tuning at
#                   16 layers, np 4, every strategy on the cpu device (benchmarks/lora_memory.sh), which
#                   needs about 80 GB of host memory (full ddp); with ZSHARD_GPU_BUDGET_S=520
# The default plan's limits add up to 685 s, 985 s with the build's: what the steps may take. On the H100
# call of 2026-11-28 they took 314 s, the build unpacked (torch-peer 120 s of it). With the build unpacked
# the steps up to gpt2 get their whole limits; a step that runs long takes the later ones' time: llama is
# skipped first, then mpi, profile and nccl. A build that compiles leaves time for cuda-ops and tiny only.
#
# Output in $OUT (the device tool's folder; out/gpu, which git ignores, when unset): summary.txt (one line
# per step), results.json (with each step's metrics), logs.tar.gz, and the build archive: at most 8
# files, as the device tool returns. Exit status: 0 when every step passed (or was left out by
# ZSHARD_GPU_STEPS: OMIT), 1 when one failed or was skipped; a dry run's, 0 unless what it checks failed.
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
if [ -n "${ZSHARD_GPU_DRY_BUILD:-}" ]; then
  case $ZSHARD_GPU_DRY_BUILD in /*) ;; *) ZSHARD_GPU_DRY_BUILD=$CALLER_DIR/$ZSHARD_GPU_DRY_BUILD ;; esac
  [ -x "$ZSHARD_GPU_DRY_BUILD/zshard-train" ] ||
    { echo "ZSHARD_GPU_DRY_BUILD: no zshard-train in $ZSHARD_GPU_DRY_BUILD" >&2; exit 2; }
  export ZSHARD_GPU_DRY_BUILD
fi
PART_BYTES=${ZSHARD_GPU_PART_BYTES:-16777216}
BUDGET=${ZSHARD_GPU_BUDGET_S:-400}
BUILD_LIMIT=300  # what a build that must compile may take of the budget
[[ $BUDGET =~ ^[0-9]+$ ]] || { echo "ZSHARD_GPU_BUDGET_S: not a whole number of seconds: $BUDGET" >&2; exit 2; }
# Every CUDA test file's binary, so that a new kernel's test file is built, packed and run too.
CUDA_TESTS=$(shopt -s nullglob; for f in tests/unit/test_cuda_*.cpp; do f=${f##*/}; printf '%s ' "${f%.cpp}"; done)
# shellcheck disable=SC2206 # CUDA_TESTS is a list of names
TARGETS=(zshard-train zshard-bench zshard-mem $CUDA_TESTS test_nccl_one_rank)
export REPO BUILD KEPT PART_BYTES CUDA_TESTS TARGETS_LIST="${TARGETS[*]}"

# shellcheck source=gpu-archive.sh
source scripts/gpu-archive.sh
case $MODE in
  prepare) prepare; exit ;;
  keep-build) keep_build "${2:-}" && prepare; exit ;;
  pack) pack "${2:-}" && prepare; exit ;;
esac

OUT=${OUT:-$REPO/out/gpu}
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
LIMITS=0  # the steps' limits in all, what each would take running to its limit
record() {  # name status seconds note
  RESULTS+=("$1|$2|$3|$4")
  printf '%-11s %-5s %4ss  %s\n' "$1" "$2" "$3" "$4"
}
# step NAME LIMIT FUNCTION WHAT [optional]: FUNCTION in its own bash under `timeout` (its process group
# killed at the limit), output to LOGS/NAME.log; it may write a one-line note to LOGS/NAME.note and
# metrics (a JSON object) to LOGS/NAME.json; exit 77 means SKIP. WHAT says what the step proves. An
# optional step runs only when ZSHARD_GPU_STEPS names it. The dry run runs FUNCTION_dry instead where
# there is one (what can be shown without a GPU, its output printed) and reports the step SKIP.
step() {
  local name=$1 limit=$2 fn=$3 what=$4 left t rc note status
  [ "${5:-}" != optional ] || [[ " ${ZSHARD_GPU_STEPS:-} " == *" $name "* ]] || return 0
  LIMITS=$((LIMITS + limit))
  left=$((BUDGET - (SECONDS - T0) - 15))  # 15 s for the summary and the logs
  [ "$limit" -le "$left" ] || limit=$left
  echo "---- $name (limit ${limit}s): $what"
  if [ "$MODE" = dry ]; then
    declare -F "${fn}_dry" >/dev/null || { record "$name" SKIP 0 "dry run: needs the GPU machine"; return; }
    fn=${fn}_dry
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
  if [ "$MODE" = dry ]; then
    sed 's/^/  /' "$LOGS/$name.log"
    [ $rc -eq 0 ] && rc=77 note="dry run: needs the GPU machine; $note"
  fi
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
  note "$(head -1 "$LOGS/gpu.csv"); $(mpirun --version 2>&1 | head -1); NCCL ${ZSHARD_NCCL_FOUND:-?}; $(nvcc --version | tail -1); CUDA libraries from ${ZSHARD_CUDA_LIB_DIRS:-none}"
}
step_setup_dry() {
  bash scripts/gpu-setup.sh --cuda-lib-dirs | tee "$LOGS/cuda-lib-dirs.txt"
  note "$(head -1 "$LOGS/cuda-lib-dirs.txt")"
}

step_build_dry() {
  local key targets t
  key=$(source_key)
  read -ra targets <<<"$TARGETS_LIST"
  echo "would build: cmake --build $BUILD -j$NPROC --target ${targets[*]} (-DZSHARD_CUDA=ON, sm_90), sources $key"
  [ -d "$KEPT" ] && echo "would first try the build kept in $KEPT (sources $(archive_key "$KEPT"))"
  # The archive's round trip on a synthetic build, in parts of 1 KiB: the code the real build goes through.
  local fake out back
  fake=$(mktemp -d) out=$(mktemp -d) back=$(mktemp -d)
  mkdir -p "$fake/tests"
  head -c 5000 /dev/urandom >"$fake/libzshard_core.so"
  for t in "${targets[@]}"; do echo "$t" >"$fake/$t"; cp "$fake/$t" "$fake/tests/$t"; done
  PART_BYTES=1024 pack_build "$fake" "$out" "$key" || exit 1
  unpack_build "$out" "$back" "$key" || { note "the archive's round trip failed"; exit 1; }
  cmp -s "$fake/libzshard_core.so" "$back/libzshard_core.so" || { note "the archive changed libzshard_core.so"; exit 1; }
  note "built nothing; archive round trip of a synthetic build in $(ls "$out" | wc -l) parts: ok"
  rm -rf "$fake" "$out" "$back"
}

step_build() {
  local key targets missing
  key=$(source_key)
  read -ra targets <<<"$TARGETS_LIST"
  ZSHARD_DEPS_QUIET=1 source scripts/gpu-setup.sh || { note "gpu-setup.sh failed"; exit 1; }
  if [ -d "$KEPT" ]; then
    if unpack_build "$KEPT" "$BUILD" "$key"; then
      # A build from another machine may not load here (its libraries): it must start before it is trusted.
      if LD_LIBRARY_PATH=$BUILD:$LD_LIBRARY_PATH "$BUILD/zshard-train" --help >"$LOGS/kept-build.out" 2>&1; then
        note "unpacked from .gpubuild (sources $key): nothing built"
        exit 0
      fi
      echo "the build in $KEPT does not start here ($(first_error "$LOGS/kept-build.out")); CUDA libraries from ${ZSHARD_CUDA_LIB_DIRS:-none}"
      # What the loader could not find: the reason to fix before the next call, which would build again.
      missing=$(LD_LIBRARY_PATH=$BUILD:$LD_LIBRARY_PATH ldd "$BUILD/zshard-train" 2>&1 | grep "not found")
      echo "${missing:-ldd finds every library}"
      [ -z "$missing" ] || note "the packed build does not start, not found: $(awk '{print $1}' <<<"$missing" | paste -sd' ')"
      echo "building"
      rm -rf "$BUILD"
    else
      echo "the build in $KEPT is of other sources ($(archive_key "$KEPT")) than these ($key): building"
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
export -f step_setup step_setup_dry step_build step_build_dry with_build

step_cuda_ops() {
  with_build
  local t reports=()
  for t in $CUDA_TESTS; do
    "$BUILD/tests/$t" --gtest_output=json:"$LOGS/$t.json" 2> >(tee "$LOGS/$t.stderr" >&2)
    reports+=("$LOGS/$t.json")
  done
  python3 scripts/gpu_compare.py gtest "${reports[@]}" | tee "$LOGS/cuda-ops.json"
  local rc=${PIPESTATUS[0]}
  # A free that fails (inside a CUDA graph's recording, say) is reported from a destructor, not thrown.
  if grep -l "cudaFreeAsync failed" "$LOGS"/test_cuda_*.stderr; then
    note "a device free failed (see the stderr files above)"
    rc=1
  fi
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

# The tiny step's runs and comparisons. GPU is the device compared with the cpu (cuda; the dry run's check
# gives cpu); with TINY_LIST set they are only printed.
tiny_plan() {
  local d
  # The fp32 runs save at step 10, which the other device resumes from.
  tiny_train gpu-fp32 --device "$GPU" --param-dtype fp32 --save-dir "$LOGS/save-gpu" --save-every 10
  tiny_train cpu-fp32 --device cpu --param-dtype fp32 --save-dir "$LOGS/save-cpu" --save-every 10
  tiny_train gpu-bf16 --device "$GPU" --param-dtype bf16
  tiny_train cpu-bf16 --device cpu --param-dtype bf16
  for d in fp32 bf16; do
    tiny_train "gpu-offload-$d" --device "$GPU" --param-dtype $d --offload optimizer
    tiny_train "gpu-recompute-$d" --device "$GPU" --param-dtype $d --activation-checkpointing blocks
  done
  tiny_train resumed-on-cpu --device cpu --param-dtype fp32 --resume "$LOGS/save-gpu/step-00000010"
  tiny_train resumed-on-gpu --device "$GPU" --param-dtype fp32 --resume "$LOGS/save-cpu/step-00000010"
  tiny_compare "fp32 cuda vs cpu" losses 1e-4 gpu-fp32 cpu-fp32
  tiny_compare "bf16 cuda vs cpu" within-effect 2 gpu-bf16 cpu-bf16 cpu-fp32 cpu-bf16
  tiny_compare "offloaded fp32 vs cpu" losses 1e-4 gpu-offload-fp32 cpu-fp32
  tiny_compare "offloaded bf16 vs cpu" within-effect 2 gpu-offload-bf16 cpu-bf16 cpu-fp32 cpu-bf16
  # Recomputing a block runs the same kernels on the same inputs: no more than rounding apart, if at all.
  tiny_compare "checkpointed fp32 vs not" losses 1e-6 gpu-recompute-fp32 gpu-fp32
  tiny_compare "checkpointed bf16 vs not" within-effect 0.5 gpu-recompute-bf16 gpu-bf16 cpu-fp32 cpu-bf16
  tiny_compare "saved on cuda, resumed on cpu" resumed 1e-4 resumed-on-cpu cpu-fp32
  tiny_compare "saved on cpu, resumed on cuda" resumed 1e-4 resumed-on-gpu gpu-fp32
}
tiny_list() {  # COMMAND...: the command as the dry run lists it, with $BUILD and $LOGS for those folders
  local line="$*"
  line=${line//$LOGS/\$LOGS}
  echo "${line//$BUILD/\$BUILD}"
}
tiny_train() {  # NAME FLAGS...: 20 steps of the tiny model, the losses in LOGS/tiny_NAME.jsonl
  local name=$1
  shift
  local cmd=("$BUILD/zshard-train" --model tiny --steps 20 --log-every 10 "$@" --log-json "$LOGS/tiny_$name.jsonl")
  [ -z "${TINY_LIST:-}" ] || { tiny_list "train $name:" "${cmd[@]}"; return; }
  "${cmd[@]}" >"$LOGS/tiny_$name.out" 2>&1 || { TINY_RC=1; note "$name failed: $(first_error "$LOGS/tiny_$name.out")"; }
}
tiny_compare() {  # WHAT MODE LAST RUN...: gpu_compare.py MODE with the runs' losses, then LAST
  local what=$1 mode=$2 last=$3 run files=()
  shift 3
  for run in "$@"; do files+=("$LOGS/tiny_$run.jsonl"); done
  local cmd=(python3 scripts/gpu_compare.py "$mode" "${files[@]}" "$last") out="$LOGS/tiny_vs_$1.json"
  [ -z "${TINY_LIST:-}" ] || { tiny_list "compare $what:" "${cmd[@]}"; return; }
  "${cmd[@]}" >"$out" 2>"$LOGS/tiny_vs_$1.err" || TINY_RC=1
  note "$what: $(python3 -c "import json, sys; r = json.load(open(sys.argv[1]))
print(f\"{r['max_rel_diff']:.1e} (tol {r['tol']:.1e})\" + ('' if r['max_rel_diff'] <= r['tol'] else ' FAIL'))" "$out" 2>/dev/null ||
    echo "FAIL, $(first_error "$LOGS/tiny_vs_$1.err")")"
}
step_tiny() {
  with_build
  TINY_RC=0 GPU=cuda
  tiny_plan
  exit $TINY_RC
}
# Lists the runs and comparisons; with ZSHARD_GPU_DRY_BUILD (a CPU build) runs them there, cpu for cuda:
# every flag, path and comparison of the step checked but the GPU.
step_tiny_dry() {
  GPU=cuda TINY_LIST=1 tiny_plan
  [ -n "${ZSHARD_GPU_DRY_BUILD:-}" ] || exit 0
  TINY_RC=0 GPU=cpu BUILD=$ZSHARD_GPU_DRY_BUILD
  note "with cpu for cuda, on this machine:"
  tiny_plan
  exit $TINY_RC
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

# The steps that measure speed (gpt2, torch-peer, profile, llama, async-save).
# shellcheck source=gpu-bench-steps.sh
source scripts/gpu-bench-steps.sh

export -f tiny_plan tiny_list tiny_train tiny_compare step_tiny_dry
export -f step_cuda_ops step_nccl step_tiny step_mpi step_memcheck

# ---- the plan, in order of what it proves ----
[ "$MODE" = dry ] && echo "dry run: the plan of one call, budget ${BUDGET}s; nothing runs on a GPU"
step setup 45 step_setup "the bundle unpacks and its MPI runs; the GPU, driver, nvcc, NCCL and CUDA libraries it finds"
step build "$BUILD_LIMIT" step_build "the CUDA path compiles and links against the bundle (or the packed build is of these sources and starts)"
step cuda-ops 45 step_cuda_ops "every kernel, fp32 and bf16, matches the CPU op; GPT-2 on cuda matches cpu"
step tiny 45 step_tiny "training on cuda matches the cpu, the optimizer offloaded too; checkpointing changes nothing; saves resume across devices"
step memcheck 40 step_memcheck "no out-of-bounds or misaligned device access in the kernels, the runtime and the copy stream"
step gpt2 90 step_gpt2 "gpt2 124M bf16 at T=1024, fused attention: tokens/s and MFU at the largest batch that fits and at 8, each switch (blocks attention too) on and off"
step torch-peer 180 step_torch_peer "PyTorch eager and torch.compile at the same batches on the same GPU: the ratios"
step nccl 30 step_nccl "NCCL's collectives, in place and out of place, split, stream order and the watchdog's abort"
step profile 90 step_profile "where one gpt2 step's device time goes, by kind of kernel (ncu), and the GPU's busy share"
step mpi 60 step_mpi "ddp, zero3 and hybrid at np 2 and 4 over mpi with device buffers, fp32 and bf16, match one process"
step llama 60 step_llama "llama-3.2-1b bf16 at T=1024, batch 8: tokens/s and MFU (no peer)"
step async-save 150 step_async_save "the async checkpoint's cost at np 2 with cores to spare (cpu device, the machine's cores)" optional
step finetune-host 420 step_finetune_host "llama-3.2-1b full fine-tuning at 16 layers, np 4, every strategy (cpu device, the machine's host memory)" optional
[ "$MODE" = dry ] && echo "dry run: the limits add up to ${LIMITS}s, the budget is ${BUDGET}s"

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
# A dry run skips every GPU step: it fails only where what it checks here failed.
[ "$MODE" = dry ] && ! printf '%s\n' "${RESULTS[@]}" | grep -q '|FAIL|' && exit 0
! printf '%s\n' "${RESULTS[@]}" | grep -qE '\|(FAIL|SKIP)\|'
