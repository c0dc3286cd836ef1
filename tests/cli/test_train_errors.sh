# Bad input to zshard-train: one clear line naming the culprit, non-zero exit on every rank, no hang.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/checkpoint_lib.sh"

expect_failure "bad value" 2 "--batch must be >= 1" -- "$TRAIN" --batch 0
expect_one_line "bad value" "--batch"
expect_failure "unknown flag" 2 "--no-such-flag" -- "$TRAIN" --no-such-flag 3
expect_failure "non-numeric value" 2 "--steps" -- "$TRAIN" --steps many
expect_failure "unknown model" 2 "unknown.*gpt2-xl|gpt2-xl.*" -- "$TRAIN" --model gpt5
# A missing input is a bad flag value (exit 2), which zshard-run does not relaunch.
expect_failure "missing data file" 2 "^zshard-train: error: --data $WORK/no/such/file: no such file$" -- \
  "$TRAIN" --data "$WORK/no/such/file"
# What the data holds is a bad value as much as a missing file: the same data fails the same way, so exit 2
# (zshard-run relaunches nothing).
printf 'not tokens' >"$WORK/bad.bin"
expect_failure "a damaged token file" 2 "^zshard-train: error: --data file $WORK/bad.bin: llm.c token file of 10 bytes is shorter than its 1024-byte header" -- \
  "$TRAIN" --data "$WORK/bad.bin"
expect_failure "seq beyond context" 2 "--seq 4096 exceeds" -- "$TRAIN" --seq 4096
expect_failure "missing weights" 2 "^zshard-train: error: --init-from $WORK/missing.safetensors: no such file$" -- \
  "$TRAIN" --init-from "$WORK/missing.safetensors"
expect_failure "weights a directory" 2 "--init-from $WORK: is a directory, not a safetensors file" -- "$TRAIN" --init-from "$WORK"
mkfifo "$WORK/weights.fifo"  # opening it would block until a writer came, before any deadline
expect_failure "weights a FIFO" 2 "--init-from $WORK/weights.fifo: is a FIFO \(named pipe\), not a safetensors file" -- \
  "$TRAIN" --init-from "$WORK/weights.fifo"
"$TRAIN" --steps 1 --save-dir "$WORK/saves" >/dev/null
expect_failure "a --save-dir given to --resume" 2 \
  "--resume $WORK/saves: not a checkpoint but a directory of them \(.*step-00000001\); resume its newest with --save-dir $WORK/saves --resume latest" -- \
  "$TRAIN" --resume "$WORK/saves"
# A resume its checks refuse leaves the --step-log as it was (zshard-run reads it); a run that starts empties it.
"$TRAIN" --steps 2 --step-log "$WORK/kept.jsonl" >/dev/null
cp "$WORK/kept.jsonl" "$WORK/kept.before"
expect_failure "a refused resume with a --step-log" 2 "--resume $WORK/saves: not a checkpoint but a directory" -- \
  "$TRAIN" --resume "$WORK/saves" --step-log "$WORK/kept.jsonl"
expect_true "... leaves the step log as it was" cmp -s "$WORK/kept.before" "$WORK/kept.jsonl"
"$TRAIN" --steps 1 --step-log "$WORK/kept.jsonl" >/dev/null
expect_true "a run that starts holds its own steps only" test "$(grep -c '"step"' "$WORK/kept.jsonl")" = 1
expect_failure "--step-log over --log-json" 2 "--step-log $WORK/log.json names the same file as --log-json" -- \
  "$TRAIN" --steps 1 --log-json "$WORK/log.json" --step-log "$WORK/log.json"
# Checked with the other outputs: under --batch auto it was refused after a measured training step.
expect_failure "--step-log in no directory, under --batch auto" 2 \
  "^zshard-train: error: --step-log $WORK/nowhere/x.jsonl: directory .*nowhere does not exist$" -- \
  "$TRAIN" --steps 1 --batch auto --step-log "$WORK/nowhere/x.jsonl"
[ ! -s "$WORK/out" ] || { echo "FAIL --step-log under --batch auto: printed before its error"; cat "$WORK/out"; failures=$((failures + 1)); }
expect_failure "a refused set-up with a new --step-log" 2 "--seq 100000 exceeds the model's context" -- \
  "$TRAIN" --steps 1 --seq 100000 --step-log "$WORK/new-steps.jsonl"
expect_true "... leaves no step log behind (it is made when the run starts)" test ! -e "$WORK/new-steps.jsonl"
mkfifo "$WORK/steps.fifo"
expect_failure "--step-log a FIFO without a reader (was a hang before any collective)" 2 \
  "^zshard-train: error: --step-log $WORK/steps.fifo: cannot open \(a FIFO that no process reads\)$" -- \
  "$TRAIN" --steps 1 --step-log "$WORK/steps.fifo"
# A --step-log FIFO whose reader leaves: one warning, and training goes on (SIGPIPE ended it silently). The
# reader opens the FIFO before zshard-train does (which refuses a FIFO without one), then leaves as soon as
# zshard-train has opened it too, before the first step's line: every line is written after it left.
python3 - "$WORK/steps.fifo" "$WORK/reader-ready" <<'PY' &
import os, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_NONBLOCK)
open(sys.argv[2], "w").close()
for _ in range(6000):  # at most a minute
    try:
        if os.read(fd, 1 << 16) == b"":  # no writer yet
            time.sleep(0.01)
            continue
    except BlockingIOError:  # a writer, nothing written yet
        pass
    break
PY
reader=$!
for _ in $(seq 200); do [ -e "$WORK/reader-ready" ] && break; sleep 0.05; done
if timeout 60 "$TRAIN" --steps 20 --log-every 10 --step-log "$WORK/steps.fifo" >"$WORK/out" 2>"$WORK/err" &&
  grep -q "^step    20/20" "$WORK/out"; then
  echo "ok   --step-log reader gone"
else
  echo "FAIL --step-log reader gone"; cat "$WORK/err"; failures=$((failures + 1))
fi
kill "$reader" 2>/dev/null; wait "$reader" 2>/dev/null
expect_one_line "--step-log reader gone" "--step-log $WORK/steps.fifo: write failed \(Broken pipe\); training goes on without it"
expect_failure "--save-mode without --save-dir" 2 "--save-mode requires --save-dir" -- "$TRAIN" --steps 1 --save-mode sync
expect_failure "unknown device" 2 "--device: gpu not in" -- "$TRAIN" --device gpu
expect_failure "unknown checkpointing" 2 "--activation-checkpointing: layers not in" -- \
  "$TRAIN" --activation-checkpointing layers
expect_one_line "unknown checkpointing" "--activation-checkpointing"
expect_failure "unknown attention" 2 "--attention: flash not in" -- "$TRAIN" --attention flash
expect_one_line "unknown attention" "--attention"
expect_failure "unknown fused epilogues" 2 "--fused-epilogues: yes not in" -- "$TRAIN" --fused-epilogues yes
expect_failure "cuda graphs on cpu" 2 "--cuda-graphs on: CUDA graphs record GPU work; this run is on the cpu" -- \
  "$TRAIN" --cuda-graphs on
expect_one_line "cuda graphs on cpu" "--cuda-graphs"
expect_failure "unknown dtype" 2 "--param-dtype: fp16 not in" -- "$TRAIN" --param-dtype fp16
expect_failure "nccl on cpu" 2 "--comm nccl needs --device cuda" -- "$TRAIN" --comm nccl

# Under mpirun: rank 0 prints the line once, every rank exits non-zero, the job ends promptly.
expect_failure "unknown strategy" 2 "unknown strategy 'zero4'" -- "${MPIRUN[@]}" -np 2 "$TRAIN" --strategy zero4
expect_one_line "unknown strategy" "zero4"
expect_failure "rank-batches count" 2 "--rank-batches has 3 entries but the world has 4" -- \
  "${MPIRUN[@]}" -np 4 "$TRAIN" --batch 8 --rank-batches 3,3,2
expect_one_line "rank-batches count" "rank-batches"
expect_failure "rank-batches sum" 2 "--rank-batches sums to 7 but --batch is 8" -- \
  "${MPIRUN[@]}" -np 4 "$TRAIN" --batch 8 --rank-batches 3,1,2,1
expect_failure "shard group" 2 "--shard-group 3 does not divide the world size 4" -- \
  "${MPIRUN[@]}" -np 4 "$TRAIN" --strategy hybrid --shard-group 3
expect_failure "node groups on one host" 2 "--shard-group node: all 2 ranks run on one host" -- \
  "${MPIRUN[@]}" -np 2 "$TRAIN" --strategy hybrid --shard-group node
expect_one_line "node groups on one host" "shard-group node"
expect_failure "shard group neither node nor a size" 2 "--shard-group: must be node, a group size >= 0 or a list of sizes >= 1, got .nodes." -- \
  "$TRAIN" --strategy hybrid --shard-group nodes
expect_failure "batch smaller than world" 2 "--batch 3 is smaller than the world size 4" -- \
  "${MPIRUN[@]}" -np 4 "$TRAIN" --batch 3
# --device cuda on a build without the CUDA path or a machine without a GPU (where it trains, skip).
if "$TRAIN" --device cuda --steps 0 >/dev/null 2>&1; then
  echo "skip cuda unavailable: a GPU is usable here"
else
  expect_failure "cuda unavailable" 2 "--device cuda: (this zshard was built without|no CUDA device)" -- \
    "${MPIRUN[@]}" -np 2 "$TRAIN" --device cuda
  expect_one_line "cuda unavailable" "--device cuda"
fi

# A launch that gives rank 1 other flags (MPMD: mpirun -np 1 A : -np 1 B) would train other steps, or a
# diverging replica, or wait in a collective rank 0 never reaches: refused on every rank. A flag whose value
# checks out on rank 0 alone (a relative --data, each rank in its own directory) ends every rank as well.
RANK_PRELUDE='[ "$OMPI_COMM_WORLD_RANK" = 1 ] && set -- "$@" --lr 1e-3' expect_every_rank_fails \
  "other flags on rank 1" 2 \
  "^zshard-train: error: rank 1 is given other arguments than rank 0 \(its argument 3 is '--lr', rank 0's none\)" \
  -- --steps 2
mkdir -p "$WORK/rank0" "$WORK/rank1" && head -c 20000 "$0" >"$WORK/rank0/text.txt"
RANK_PRELUDE='cd "$WORK/rank$OMPI_COMM_WORLD_RANK"' expect_every_rank_fails "a --data file rank 1 cannot find" 2 \
  "^zshard-train: error: --data text.txt: no such file$" -- --data text.txt --steps 1

# A malformed test hook (kernels/test_hooks.h) ends each rank at start with one line naming it.
ZSHARD_TEST_PAUSE_IN_SAVE=2s expect_failure "malformed test hook" 1 \
  "^zshard-train: error: ZSHARD_TEST_PAUSE_IN_SAVE='2s' is malformed: expected MS$" -- "$TRAIN" --steps 1
expect_one_line "malformed test hook" "ZSHARD_TEST_PAUSE_IN_SAVE"
ZSHARD_TEST_FAIL_RANK=1 expect_failure "malformed test hook, np 2" nonzero \
  "^zshard-train: error: ZSHARD_TEST_FAIL_RANK='1' is malformed: expected RANK:STEP$" -- \
  "${MPIRUN[@]}" -np 2 "$TRAIN" --steps 1
if [ "$(grep -c "ZSHARD_TEST_FAIL_RANK='1' is malformed" "$WORK/err")" != 2 ]; then
  echo "FAIL malformed test hook, np 2: not one line from each rank:"; cat "$WORK/err"; failures=$((failures + 1))
fi

# One rank fails in the middle of step 3 while its peers wait in collectives: the whole job ends
# within seconds with that rank's message.
for strategy in ddp zero3; do
  ZSHARD_TEST_FAIL_RANK=2:3 expect_failure "rank fails mid-run ($strategy)" nonzero \
    "rank 2: injected fault" -- "${MPIRUN[@]}" -np 4 "$TRAIN" --strategy $strategy --steps 10
done
finish
