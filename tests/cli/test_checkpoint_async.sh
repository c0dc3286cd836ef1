# Asynchronous checkpoints (--save-mode async, the default with --save-every): a rank killed (SIGKILL)
# while a save is in flight leaves the previous committed checkpoint, which --resume latest continues bit
# for bit; a save that training overtakes in the middle still writes the sync save's bytes; a sync
# save's step is in the step log before the save commits; a save whose files cannot be written fails the
# run in one line naming the file, leaving nothing;
# a bad --save-mode is refused in one line with exit 2.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/checkpoint_lib.sh"
FULL="$WORK/full"
mkdir -p "$FULL"
trap 'umount "$FULL" 2>/dev/null; rm -rf "$WORK"' EXIT

expect_failure "--save-mode bogus" 2 "^zshard-train: error: --save-mode: bogus not in \{async,sync\}$" -- \
  "$TRAIN" --save-mode bogus
expect_one_line "--save-mode bogus" "--save-mode"

# ---- SIGKILL of one rank while step 4's save is in flight ----
D="$WORK/kill"
JOB=("${MPIRUN[@]}" -np 2 "$TRAIN" --strategy zero3 "${ARGS[@]}" --steps 8 --save-every 2)
expect_ok "uninterrupted reference run (--save-mode sync)" "${JOB[@]}" --save-mode sync --save-dir "$WORK/ref" \
  --log-json "$WORK/ref.json"
# Every writer holds 3 s before it writes: training goes on meanwhile, and the save cannot commit before.
ZSHARD_TEST_SLOW_WRITER=3000 "${JOB[@]}" --save-dir "$D" --step-log "$WORK/steps.jsonl" >"$WORK/kill.out" 2>&1 &
job=$!
in_flight() {
  [ -f "$WORK/steps.jsonl" ] && [ "$(wc -l <"$WORK/steps.jsonl")" -ge 5 ] && [ -d "$D/step-00000004" ] &&
    [ ! -f "$D/step-00000004/manifest.json" ]
}
wait_for 60 in_flight  # on a timeout the kill still ends the job and the checks below fail
expect_true "step 5 ran while step 4's save was in flight" in_flight
kill -KILL "$(children_of $job | tail -1)"
wait $job
expect_true "the killed job did not commit step 4" test ! -f "$D/step-00000004/manifest.json"
expect_true "step 2, the newest committed, is there" test -f "$D/step-00000002/manifest.json"
expect_ok "--resume latest after the kill" "${JOB[@]}" --save-dir "$D" --resume latest --log-json "$WORK/resumed.json"
expect_true "it resumed from step 2, ignoring the partial step 4" \
  grep -q "resumed from .*step-00000002 at step 2" "$WORK/out"
same_losses "resumed losses are the uninterrupted run's, bit for bit" "$WORK/ref.json" "$WORK/resumed.json" 0
for step in 2 4 6 8; do
  s=$(printf 'step-%08d' $step)
  expect_true "$s matches the sync save byte for byte" diff -r "$WORK/ref/$s" "$D/$s"
done

# ---- a writer that is overtaken in the middle of a save ----
# Each slice a writer claims is held 5 ms, so the next step's optimizer finds some slices written, one
# being written (it waits) and the rest not reached (it copies them): the files are still the sync ones.
# With bf16 parameters the master is a buffer of its own, with fp32 a part of the compute copy.
overtaken() {  # the memory report measured a copy: the optimizer did overtake the writer
  python3 -c 'import json, sys; sys.exit(json.load(open(sys.argv[1]))["measured_checkpoint_snapshot"] <= 0)' "$1"
}
for dtype in fp32 bf16; do
  D="$WORK/slices-$dtype"
  expect_ok "sync reference, $dtype" "${JOB[@]}" --param-dtype $dtype --save-mode sync --save-dir "$D-ref" \
    --log-json "$WORK/slices-ref.json"
  ZSHARD_TEST_SLOW_SLICES=5 expect_ok "saves with slow slices, $dtype" "${JOB[@]}" --param-dtype $dtype \
    --save-dir "$D" --log-json "$WORK/slices.json" --mem-report "$WORK/slices.mem.json"
  expect_true "training overtook the writer ($dtype)" overtaken "$WORK/slices.mem.json"
  same_losses "losses with slow slices are the reference's ($dtype)" "$WORK/slices-ref.json" "$WORK/slices.json" 0
  for step in 2 4 6 8; do
    s=$(printf 'step-%08d' $step)
    expect_true "$s, written while training overtook the writer, matches the sync save ($dtype)" \
      diff -r "$D-ref/$s" "$D/$s"
  done
done

# ---- the step log is never behind a checkpoint: a sync save commits after its step's line ----
# (zshard-run merges the step logs and resumes from the newest checkpoint: a checkpoint ahead of the log
# would leave its step out of the merged --log-json.) Rank 0 holds 3 s before step 2's manifest.
D="$WORK/sync"
ZSHARD_TEST_PAUSE_IN_SAVE=3000 "${JOB[@]}" --save-mode sync --save-dir "$D" --step-log "$WORK/sync.jsonl" \
  >"$WORK/sync.out" 2>&1 &
job=$!
mid_save() { [ -f "$D/step-00000002/rank-00001.safetensors" ] && [ ! -f "$D/step-00000002/manifest.json" ]; }
wait_for 60 mid_save
expect_true "step 2's line is logged before its save commits" grep -q '"step":2,' "$WORK/sync.jsonl"
kill -KILL "$(children_of $job | tail -1)"
wait $job

# ---- a save that cannot be written: the run fails in one line naming the file, and leaves nothing ----
if mount -t tmpfs -o size=256k tmpfs "$FULL" 2>"$WORK/mount.err"; then
  expect_every_rank_fails "async save on a full disk" 1 \
    "^zshard-train: error: .*full/ck/step-00000001/rank-0000[01]\.safetensors.*No space left on device" \
    -- --strategy zero2 "${ARGS[@]}" --steps 3 --save-dir "$FULL/ck" --save-every 1
  expect_true "nothing is left on the disk" test -z "$(ls -A "$FULL")"
else
  echo "skip full disk: cannot mount a small tmpfs ($(cat "$WORK/mount.err"))"
fi
finish
