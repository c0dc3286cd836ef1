# Crashes and signals around checkpoints: a job killed (SIGKILL) in the middle of a save leaves the
# previous checkpoint loadable (--keep 1 deletes it only once the next one is committed) and the partial
# one ignored; SIGTERM to one rank (schedulers signal the ranks) or SIGINT to a single process ends the
# job after the current step with a checkpoint of that step and exit 0; so does --stop-file, whose file the
# job removes. A second run on a --save-dir in use is refused.
# zshard-test-timing
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/checkpoint_lib.sh"

# ---- SIGKILL while step 6 is being saved: rank files written, manifest not yet ----
# Step 4's prune made step 2 the spare directory, so the save of step 6 writes over step 2's rank files.
D="$WORK/kill"
JOB=("${MPIRUN[@]}" -np 2 "$TRAIN" --strategy zero2 "${ARGS[@]}" --steps 8 --save-every 2 --keep 1)
expect_ok "uninterrupted reference run" "${JOB[@]}" --save-dir "$WORK/ref" --log-json "$WORK/ref.json"
# Rank 0 holds 2 s between the rank files and the manifest of every save.
ZSHARD_TEST_PAUSE_IN_SAVE=2000 "${JOB[@]}" --save-dir "$D" >"$WORK/kill.out" 2>&1 &
job=$!
# Step 6's directory is step 2's, renamed, with step 2's rank files in it until they are written over (each
# moved aside while it is rewritten): mid-save is both rank files newer than step 4's manifest.
mid_save() {
  [ -f "$D/step-00000004/manifest.json" ] && [ ! -f "$D/step-00000006/manifest.json" ] &&
    [ "$(find "$D/step-00000006" -name 'rank-0000[01].safetensors' -newer "$D/step-00000004/manifest.json" \
         2>/dev/null | wc -l)" = 2 ]
}
wait_for 60 mid_save  # on a timeout the kill still ends the job and the checks below fail
for pid in $(children_of $job); do kill -KILL "$pid"; done
kill -KILL $job
wait $job
expect_true "killed in the middle of saving step 6" mid_save
expect_true "only step 4 and the partial step 6 are left" \
  test "$(ls "$D")" = "$(printf 'step-00000004\nstep-00000006')"
expect_ok "--resume latest after the kill" "${JOB[@]}" --save-dir "$D" --resume latest \
  --log-json "$WORK/resumed.json"
expect_true "it resumed from step 4, ignoring the partial step 6" \
  grep -q "resumed from .*step-00000004 at step 4" "$WORK/out"
same_losses "resumed losses are the uninterrupted run's, bit for bit" "$WORK/ref.json" "$WORK/resumed.json" 0
expect_true "the resumed run overwrote the partial step 6 and kept only step 8" \
  test "$(ls "$D")" = step-00000008 -a -f "$D/step-00000008/manifest.json"

# ---- SIGTERM to one rank of an mpirun job ----
D="$WORK/term"
# Progress goes to stdout every step (--log-json is written only when the run ends).
STREAM_ARGS=(--batch 8 --seq 32 --log-every 1)
"${MPIRUN[@]}" -np 2 "$TRAIN" --strategy zero3 "${STREAM_ARGS[@]}" --steps 100000 --save-dir "$D" \
  --log-json "$WORK/term.json" >"$WORK/term.out" 2>&1 &
job=$!
three_steps() { [ "$(grep -c '^step ' "$WORK/term.out")" -ge 3 ]; }
wait_for 60 three_steps
kill -TERM "$(children_of $job | tr ' ' '\n' | grep . | tail -1)"
wait $job
code=$?
expect_true "SIGTERM to one rank: exit 0 (got $code)" test $code = 0
expect_true "--log-json was written when the run stopped" grep -q '"step":3' "$WORK/term.json"
stopped=$(sed -n 's/.*stop signal received; stopping after step \([0-9]*\).*/\1/p' "$WORK/term.out")
expect_true "the ranks agreed to stop after the current step (${stopped:-none})" test -n "$stopped"
last=$(ls "$D")
expect_true "a checkpoint of that step ($last) was committed" \
  test "$last" = "$(printf 'step-%08d' "${stopped:-0}")" -a -f "$D/$last/manifest.json"
expect_ok "it resumes in one process" "$TRAIN" "${ARGS[@]}" --steps $((stopped + 1)) --resume "$D/$last"
expect_true "from that step" grep -q "resumed from .*$last at step $stopped " "$WORK/out"

# ---- SIGINT to a single process ----
D="$WORK/int"
"$TRAIN" "${STREAM_ARGS[@]}" --steps 100000 --save-dir "$D" --log-json "$WORK/int.json" >"$WORK/int.out" 2>&1 &
job=$!
wait_for 60 grep -qs '^step *2/' "$WORK/int.out"
kill -INT $job
wait $job
code=$?
expect_true "SIGINT: exit 0 (got $code)" test $code = 0
last=$(ls "$D" | tail -1)
expect_true "a checkpoint ($last) was committed" test -f "$D/$last/manifest.json"
expect_ok "it resumes from --resume latest" "$TRAIN" "${ARGS[@]}" --steps $((10#${last#step-} + 1)) \
  --save-dir "$D" --resume latest

# ---- one run a --save-dir: a second, resuming the first's checkpoints beside it, is refused ----
D="$WORK/locked"
"$TRAIN" "${STREAM_ARGS[@]}" --steps 100000 --save-dir "$D" --save-every 2 >"$WORK/locked.out" 2>&1 &
job=$!
wait_for 60 test -f "$D/step-00000002/manifest.json"
expect_failure "a second run resuming in the same --save-dir" 2 \
  "^zshard-train: error: --save-dir .*locked: another run is saving there; wait for it to end, or choose another directory$" \
  -- "${MPIRUN[@]}" -np 2 "$TRAIN" "${STREAM_ARGS[@]}" --steps 100000 --save-dir "$D" --resume latest
expect_one_line "... in one line" "another run is saving there"
kill -INT $job
wait $job
code=$?
expect_true "the first run stops as asked (exit $code)" test $code = 0
last=$(ls "$D" | tail -1)
expect_ok "and its newest checkpoint ($last) resumes" "$TRAIN" "${STREAM_ARGS[@]}" --steps $((10#${last#step-} + 1)) \
  --save-dir "$D" --resume latest

# ---- --stop-file: the job stops after the step at whose end the file exists, and takes the request ----
D="$WORK/stopfile"
touch "$WORK/stop"
expect_ok "a stop file present from the start" "${MPIRUN[@]}" -np 2 "$TRAIN" "${ARGS[@]}" --steps 6 --save-dir "$D" \
  --stop-file "$WORK/stop"
expect_true "stopped after step 1, saved, the file removed" \
  eval 'grep -q "stop requested (--stop-file $WORK/stop); stopping after step 1" "$WORK/out" &&
        [ -f "$D/step-00000001/manifest.json" ] && [ ! -e "$WORK/stop" ]'
expect_ok "the same command resumes and goes on to the end" "${MPIRUN[@]}" -np 2 "$TRAIN" "${ARGS[@]}" --steps 6 \
  --save-dir "$D" --stop-file "$WORK/stop" --resume latest
expect_true "step 6 saved" test -f "$D/step-00000006/manifest.json"
finish
