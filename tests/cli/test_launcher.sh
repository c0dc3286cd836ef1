# zshard-run on this machine alone (localhost): bad input gets one line and a non-zero exit without
# running anything; a rank killed mid-run is relaunched from the newest checkpoint and the merged --log-json
# has every step once, with the uninterrupted run's losses bit for bit; a job that keeps failing ends when
# --max-restarts are spent, its checkpoints intact; a damaged newest checkpoint is set aside and the
# relaunch resumes from the one before it; a host that answers again is not taken back where the flags
# cannot run on the larger world; run again, it goes on with its --log-json, which a full disk does not
# stop; SIGTERM stops the job after a step, saved, without a
# restart. The runs across hosts that are lost and come back are in test_launcher_hosts.sh.
# zshard-test-timing
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/checkpoint_lib.sh"
source "$(dirname "$0")/launcher_lib.sh"
LOCAL=(--hosts localhost:2 --mpirun-args "--oversubscribe --bind-to none")
# Synchronous saves: the bound on the steps redone checked here (--save-every) is theirs; an asynchronous
# save still in flight when a rank dies is lost with it (docs/recovery.md), test_launcher_hosts runs those.
JOB=("$TRAIN" --strategy zero2 --batch 8 --seq 32 --log-every 1 --save-every 2 --save-mode sync)

# ---- bad input: one line, a non-zero exit, nothing run ----
expect_failure "--min-ranks above the hosts' slots" 2 "^zshard-run: error: --min-ranks 5 exceeds the 4 slots of the hosts \(a:2,b:2\)$" -- \
  "$RUN" --hosts a:2,b:2 --min-ranks 5 -- "${JOB[@]}" --steps 4 --save-dir "$WORK/bad"
expect_one_line "--min-ranks above the hosts' slots" "."
expect_failure "a host of zero slots" 2 "^zshard-run: error: --hosts a:2,b:0: host b has 0 slots" -- \
  "$RUN" --hosts a:2,b:0 -- "${JOB[@]}" --steps 4 --save-dir "$WORK/bad"
expect_one_line "a host of zero slots" "."
printf 'a slots=2\nb slots=0  # drained\n' >"$WORK/hostfile"
expect_failure "a hostfile host of zero slots" 2 "^zshard-run: error: --hostfile .*hostfile: host b has 0 slots" -- \
  "$RUN" --hostfile "$WORK/hostfile" -- "${JOB[@]}" --steps 4 --save-dir "$WORK/bad"
mkdir -p "$WORK/hostdir"
expect_failure "a hostfile that is a directory" 2 "^zshard-run: error: --hostfile .*hostdir: is a directory, not a hostfile" -- \
  "$RUN" --hostfile "$WORK/hostdir" -- "${JOB[@]}" --steps 4 --save-dir "$WORK/bad"
expect_failure "an empty item in --hosts" 2 "^zshard-run: error: --hosts a:2,,b:2: an empty item" -- \
  "$RUN" --hosts a:2,,b:2 -- "${JOB[@]}" --steps 4 --save-dir "$WORK/bad"
expect_failure "a training command that is not there" 2 "^zshard-run: error: the training command $WORK/no/zshard-train: no such executable here$" -- \
  "$RUN" "${LOCAL[@]}" -- "$WORK/no/zshard-train" --save-dir "$WORK/none"
expect_failure "a training command without --save-dir" 2 "^zshard-run: error: the training command has no --save-dir" -- \
  "$RUN" "${LOCAL[@]}" -- "$TRAIN" --steps 4
expect_failure "a --resume that is not there" 2 "^zshard-run: error: --resume $WORK/nowhere: no such directory$" -- \
  "$RUN" "${LOCAL[@]}" -- "${JOB[@]}" --steps 4 --resume "$WORK/nowhere" --save-dir "$WORK/bad"
expect_failure "an --mpirun that is not there" 2 "^zshard-run: error: --mpirun $WORK/no/mpirun: no such executable here$" \
  -- "$RUN" "${LOCAL[@]}" --mpirun "$WORK/no/mpirun" -- "${JOB[@]}" --steps 4 --save-dir "$WORK/bad"
expect_failure "an empty value in the training command" 2 "^zshard-run: error: the training command: --log-json: empty value" \
  -- "$RUN" "${LOCAL[@]}" -- "${JOB[@]}" --steps 4 --save-dir "$WORK/bad" --log-json ""
expect_failure "--batch auto" 2 "^zshard-run: error: the training command has --batch auto" -- \
  "$RUN" "${LOCAL[@]}" -- "$TRAIN" --batch auto --save-dir "$WORK/bad"
expect_failure "a flag the training command refuses: not restarted" 2 \
  "^zshard-run: error: the training command exited with 2 \(its flags or input data: see the line above\); not restarted$" -- \
  "$RUN" "${LOCAL[@]}" -- "${JOB[@]}" --steps 4 --lr 7 --save-dir "$WORK/bad"
expect_true "... after the training command's own line" grep -q "^zshard-train: error: --lr" "$WORK/err"
expect_failure "an option mpirun refuses: not restarted" 1 \
  "^zshard-run: error: mpirun refused the launch \(.*(mpirun|mpiexec): Error: unknown option .*--bogus-mpi-arg.*\); not restarted$" -- \
  "$RUN" --hosts localhost:2 --mpirun-args "--bogus-mpi-arg" -- "${JOB[@]}" --steps 4 --save-dir "$WORK/bad"
expect_true "... at its first attempt" test "$(grep -c "^zshard-run: attempt" "$WORK/err")" = 1
expect_failure "a --mem-budget that no micro-batch fits" 2 \
  "^zshard-run: error: --mem-budget 1KB: no micro-batch fits on the 2 ranks of localhost:2: the smallest, batch 2 x grad-accum 4, needs [0-9.]+ MB per rank by the estimate$" -- \
  "$RUN" "${LOCAL[@]}" --mem-budget 1KB -- "${JOB[@]}" --steps 4 --save-dir "$WORK/bad"
expect_one_line "a --mem-budget that no micro-batch fits" "."
expect_true "nothing was saved by the refused runs" test ! -e "$WORK/bad/step-00000002"
# zshard-train makes its --save-dir before it opens its --log-json; zshard-run refused one inside it.
expect_ok "--log-json inside a --save-dir not yet made" \
  "$RUN" "${LOCAL[@]}" -- "${JOB[@]}" --steps 2 --save-dir "$WORK/fresh-ck" --log-json "$WORK/fresh-ck/log.jsonl"
expect_true "... which holds its steps" test "$(steps "$WORK/fresh-ck/log.jsonl")" = "1 2 "

# ---- a rank killed mid-run: relaunched on the same host, one record per step in --log-json ----
# 150 steps (5 ms each here): the kill lands well before the end, even on a loaded machine.
expect_ok "uninterrupted reference" "${MPIRUN[@]}" -np 2 "${JOB[@]}" --steps 150 --keep 3 --save-dir "$WORK/ref" \
  --log-json "$WORK/ref.json"
D="$WORK/kill"
"$RUN" "${LOCAL[@]}" -- "${JOB[@]}" --steps 150 --keep 3 --save-dir "$D" --log-json "$WORK/kill.json" >"$WORK/out" 2>"$WORK/err" &
run=$!
wait_for 120 step_logged 5 "$D/zshard-run/attempt-1.jsonl"
mpirun_pid=$(children_of $run | head -1)
kill -KILL "$(children_of "$mpirun_pid" | tail -1)"
ended_well "a rank killed"
expect_true "one restart, logged with its cause" \
  grep -Eq '^zshard-run: restart 1 of 3: .*(exited on signal 9|killed|MPI_ABORT|rank)' "$WORK/err"
record=$(cat "$D/zshard-run/restarts.jsonl")
ranks=$(field ranks <<<"$record") redone=$(field steps_redone <<<"$record") resumed=$(field resumed_step <<<"$record")
expect_true "the restart's record: 2 ranks ($ranks), from step 4 or later ($resumed), at most 2 steps redone ($redone)" \
  test "$ranks" = 2 -a "$resumed" -ge 4 -a "$redone" -le 2
expect_true "the time to recover is recorded ($(field recover_s <<<"$record") s)" \
  eval '[[ $(field recover_s <<<"$record") =~ ^[0-9.e-]+$ ]]'
expect_true "--log-json has steps 1..150, each once" test "$(steps "$WORK/kill.json")" = "$(seq -s ' ' 150) "
same_losses "the merged log's losses are the uninterrupted run's, bit for bit" "$WORK/ref.json" "$WORK/kill.json" 0

# ---- the launcher killed outright: the job it left running holds the --save-dir; a rerun refuses until it
# ends, then goes on with every step that job's attempt logged ----
D="$WORK/orphan"
ORPHAN=("$RUN" "${LOCAL[@]}" -- "${JOB[@]}" --steps 150 --keep 3 --save-dir "$D" --log-json "$WORK/orphan.json")
"${ORPHAN[@]}" >"$WORK/out" 2>"$WORK/err" &
run=$!
wait_for 120 step_logged 5 "$D/zshard-run/attempt-1.jsonl"
job=$(sed -n 's/^mpirun pid \([0-9]*\) .*/\1/p' "$D/zshard-run/job")
kill -STOP $(session_pids "$job")  # mpirun and its ranks held still: the job must not end before the rerun
kill -KILL $run
wait $run 2>/dev/null
expect_failure "a rerun while the job of a killed launcher runs" 2 \
  "^zshard-run: error: --save-dir .*orphan: another zshard-run, or a job one started \(mpirun pid [0-9]+ of zshard-run pid $run\), still runs on it" -- \
  "${ORPHAN[@]}"
kill -KILL $(session_pids "$job")
session_gone() { ! session_pids "$1" | grep -q .; }
wait_for 60 session_gone "$job"
logged=$(wc -l <"$D/zshard-run/attempt-1.jsonl")
expect_ok "the rerun once that job ended" "${ORPHAN[@]}"
expect_true "--log-json has steps 1..150, each once (the killed launcher's attempt logged $logged)" \
  test "$(steps "$WORK/orphan.json")" = "$(seq -s ' ' 150) "
same_losses "... with the uninterrupted run's losses" "$WORK/ref.json" "$WORK/orphan.json" 0

# A killed launcher's step log is replayed once: left behind (here attempt-7, steps 9 and 10), a later
# launch would replay it after a --log-json gone past it and drop the newer steps.
D="$WORK/replayed"
expect_ok "a run of 10 steps" "$RUN" "${LOCAL[@]}" -- "${JOB[@]}" --steps 10 --save-dir "$D" --log-json "$WORK/replayed.json"
tail -2 "$WORK/replayed.json" >"$D/zshard-run/attempt-7.jsonl"
expect_ok "on to step 12, the step log replayed" "$RUN" "${LOCAL[@]}" -- "${JOB[@]}" --steps 12 --save-dir "$D" \
  --log-json "$WORK/replayed.json"
expect_ok "on to step 14" "$RUN" "${LOCAL[@]}" -- "${JOB[@]}" --steps 14 --save-dir "$D" --log-json "$WORK/replayed.json"
expect_true "--log-json has steps 1..14, each once" test "$(steps "$WORK/replayed.json")" = "$(seq -s ' ' 14) "

# ---- SIGTERM to mpirun, not to the launcher: the job stops as asked, and is not relaunched ----
D="$WORK/term-mpirun"
"$RUN" "${LOCAL[@]}" -- "${JOB[@]}" --steps 100000 --save-dir "$D" >"$WORK/out" 2>"$WORK/err" &
run=$!
wait_for 120 step_logged 5 "$D/zshard-run/attempt-1.jsonl"
kill -TERM "$(sed -n 's/^mpirun pid \([0-9]*\) .*/\1/p' "$D/zshard-run/job")"
wait_for 60 eval '! kill -0 $run 2>/dev/null'
wait $run
expect_true "a job stopped by SIGTERM to mpirun is not relaunched (exit $?)" \
  eval 'grep -q "^zshard-run: the job stopped on a signal sent to it, not to zshard-run: not restarted" "$WORK/err" &&
        [ "$(grep -c "^zshard-run: attempt" "$WORK/err")" = 1 ]'

# ---- a job that keeps failing: --max-restarts spent ----
D="$WORK/fail"
expect_failure "--max-restarts spent" 1 \
  "^zshard-run: error: the job failed \(zshard-train: rank 1: injected fault .*\) and --max-restarts 1 are spent; the newest checkpoint is .*/step-00000002$" -- \
  env ZSHARD_TEST_FAIL_RANK=1:3 "$RUN" "${LOCAL[@]}" --max-restarts 1 -- "${JOB[@]}" --steps 6 \
  --save-dir "$D" --log-json "$WORK/fail.json"
expect_one_line "--max-restarts spent" "^zshard-run: error"
expect_true "two attempts were made" test "$(grep -c '^zshard-run: attempt' "$WORK/err")" = 2
expect_ok "no checkpoint lost: step 2 resumes" "$TRAIN" --strategy zero2 --batch 8 --seq 32 --steps 3 \
  --resume "$D/step-00000002"
expect_true "--log-json holds the steps done: 1 and 2" test "$(steps "$WORK/fail.json")" = "1 2 "
# Started from a weights file: the relaunch resumes from the checkpoint alone, which holds every trained
# weight (--resume and --init-from exclude each other), and fails again at step 3 rather than on its flags.
expect_ok "a weights file to start from" "$TRAIN" --batch 8 --seq 32 --steps 0 --save "$WORK/init.safetensors"
expect_failure "started from --init-from: relaunched from the checkpoint" 1 \
  "and --max-restarts 1 are spent; the newest checkpoint is .*/init-ck/step-00000002$" -- \
  env ZSHARD_TEST_FAIL_RANK=1:3 "$RUN" "${LOCAL[@]}" --max-restarts 1 -- "${JOB[@]}" --steps 6 \
  --save-dir "$WORK/init-ck" --init-from "$WORK/init.safetensors"
# LoRA on that base: the checkpoint holds the adapters, so the relaunch takes the base from --init-from again.
expect_failure "LoRA on a base file: relaunched beside the same base" 1 \
  "and --max-restarts 1 are spent; the newest checkpoint is .*/lora-ck/step-00000002$" -- \
  env ZSHARD_TEST_FAIL_RANK=1:3 "$RUN" "${LOCAL[@]}" --max-restarts 1 -- "${JOB[@]}" --steps 6 --lora-rank 2 \
  --save-dir "$WORK/lora-ck" --init-from "$WORK/init.safetensors"

# ---- a host answering again is not taken back where the flags cannot run on so many ranks ----
# The hosts are names the probe answers for ($WORK/up-NAME), and their ranks all run here: an mpirun that
# turns --host a:2,b:1 into localhost:3. At a scenario's first launch (no $MARK yet) the hosts of $UP start
# answering, those of $DOWN stop, and rank 1 fails at step 3.
cat >"$WORK/fake-mpirun" <<EOF
#!/bin/bash
args=()
while [ \$# -gt 0 ]; do
  if [ "\$1" = --host ]; then
    n=0; IFS=, read -ra hs <<<"\$2"; for h in "\${hs[@]}"; do n=\$((n + \${h##*:})); done
    args+=(--host localhost:\$n); shift 2; continue
  fi
  args+=("\$1"); shift
done
if [ ! -e "\$MARK" ]; then
  touch "\$MARK"
  for h in \$UP; do touch "$WORK/up-\$h"; done
  for h in \$DOWN; do rm -f "$WORK/up-\$h"; done
  export ZSHARD_TEST_FAIL_RANK=1:3
fi
exec mpirun "\${args[@]}"
EOF
chmod +x "$WORK/fake-mpirun"
FAKE=(--probe "test -e $WORK/up-\$1" --mpirun "$WORK/fake-mpirun" --mpirun-args "--oversubscribe --bind-to none")
touch "$WORK/up-a"
D="$WORK/back"
expect_ok "batch 2: relaunched on a's 2 ranks" env MARK="$WORK/mark1" UP=b "$RUN" --hosts a:2,b:1 "${FAKE[@]}" -- \
  "$TRAIN" --batch 2 --seq 32 --steps 5 --save-every 2 --save-mode sync --save-dir "$D"
expect_true "... saying why b is not taken back" grep -q \
  "^zshard-run: b answering again, not taken back: on 3 ranks --batch 2 is smaller than the world size 3" "$WORK/err"
expect_true "... and the restart took no host back, and recorded it left out" eval \
  '[ "$(field hosts_back <"$D/zshard-run/restarts.jsonl")" = "[]" ] && grep -q "^zshard-run: attempt 2 on a:2 " "$WORK/err" &&
   [ "$(field hosts_left_out <"$D/zshard-run/restarts.jsonl")" = "[\"b\"]" ]'
rm -f "$WORK/up-b"
expect_ok "hybrid --shard-group 2: relaunched on a's 4 ranks, not 5" env MARK="$WORK/mark2" UP=b "$RUN" \
  --hosts a:4,b:1 "${FAKE[@]}" -- "$TRAIN" --strategy hybrid --shard-group 2 --batch 20 --seq 32 --steps 5 \
  --save-every 2 --save-mode sync --save-dir "$WORK/back-hybrid"
expect_true "... saying why" grep -q "^zshard-run: b answering again, not taken back: on 5 ranks --shard-group 2" "$WORK/err"
# Every host of the first launch lost and another back: launched there, where the flags fail on their own.
rm -f "$WORK/up-b"
expect_failure "only a host that answers again: relaunched there" 2 "the training command exited with 2" -- \
  env MARK="$WORK/mark3" UP=b DOWN=a "$RUN" --hosts a:2,b:4 "${FAKE[@]}" -- "$TRAIN" --batch 2 --seq 32 \
  --steps 5 --save-every 2 --save-mode sync --save-dir "$WORK/back-only"
expect_true "... after the job's own line" grep -q "^zshard-train: error: --batch 2 is smaller than the world size 4" "$WORK/err"

# ---- a damaged newest checkpoint: set aside, and the relaunch resumes from the one before it ----
D="$WORK/damaged"
# The 6-step run is the reference; without its step 6 it is what a run that died after step 4 leaves.
expect_ok "checkpoints at steps 2, 4 and 6" "${MPIRUN[@]}" -np 2 "${JOB[@]}" --steps 6 --save-dir "$D" \
  --log-json "$WORK/ref6.json"
rm -r "$D/step-00000006"
f="$D/step-00000004/rank-00001.safetensors"
printf '\x5a' | dd of="$f" bs=1 seek=$(($(stat -c %s "$f") - 7)) conv=notrunc status=none
cp "$f" "$WORK/damaged-file"
expect_ok "the run goes on" "$RUN" "${LOCAL[@]}" -- "${JOB[@]}" --steps 6 --save-dir "$D" \
  --log-json "$WORK/damaged.json"
expect_true "the restart names the damage and where the checkpoint went" grep -Eq \
  "^zshard-run: restart 1 of 3: .*rank-00001.safetensors: checksum mismatch.*; the damaged $D/step-00000004 set aside as $D/step-00000004.damaged; resuming from $D/step-00000002," \
  "$WORK/err"
expect_true "nothing of it deleted" cmp -s "$WORK/damaged-file" "$D/step-00000004.damaged/rank-00001.safetensors"
expect_true "--log-json has steps 3..6" test "$(steps "$WORK/damaged.json")" = "3 4 5 6 "
same_losses "their losses are the uninterrupted run's, bit for bit" "$WORK/ref6.json" "$WORK/damaged.json" 0
# A checkpoint the command names itself is not the launcher's to move: not restarted, exit 3.
expect_failure "its own --resume damaged: not restarted" 3 \
  "^zshard-run: error: the checkpoint the training command resumes from is damaged \(see the line above\); not restarted$" -- \
  "$RUN" "${LOCAL[@]}" -- "${JOB[@]}" --steps 6 --save-dir "$WORK/damaged-2" --resume "$D/step-00000004.damaged"
expect_true "... after the training command's own line" grep -q "^zshard-train: error: .*checksum mismatch" "$WORK/err"
# Its manifest damaged: refused before any launch, with the job's own exit code for damage.
mkdir -p "$WORK/trunc-own" && cp -r "$D/step-00000002" "$WORK/trunc-own/"
head -c 100 "$D/step-00000002/manifest.json" >"$WORK/trunc-own/step-00000002/manifest.json"
expect_failure "its own --resume with a damaged manifest: exit 3 before any launch" 3 \
  "^zshard-run: error: .*trunc-own/step-00000002/manifest.json: truncated or not JSON" -- \
  "$RUN" "${LOCAL[@]}" -- "${JOB[@]}" --steps 6 --save-dir "$WORK/trunc-ck" --resume "$WORK/trunc-own/step-00000002"
expect_true "... nothing launched" eval '! grep -q "^zshard-run: attempt" "$WORK/err"'
# The same inside the --save-dir: still the command's own, not moved.
mkdir -p "$WORK/damaged-own" && cp -r "$D/step-00000004.damaged" "$WORK/damaged-own/step-00000004"
expect_failure "its own --resume inside --save-dir damaged: not restarted" 3 "; not restarted$" -- \
  "$RUN" "${LOCAL[@]}" -- "${JOB[@]}" --steps 6 --save-dir "$WORK/damaged-own" --resume "$WORK/damaged-own/step-00000004"
expect_true "... and left where it is" test -f "$WORK/damaged-own/step-00000004/manifest.json"
# The only checkpoint damaged: set aside, and the launcher stops rather than start the run over.
mkdir -p "$WORK/damaged-only" && cp -r "$D/step-00000004.damaged" "$WORK/damaged-only/step-00000004"
expect_failure "the only checkpoint damaged: not started over" 3 \
  "^zshard-run: error: the damaged .*/step-00000004 set aside as .*/step-00000004.damaged, and no checkpoint is left to resume from; not restarted \(run again to start over\)$" -- \
  "$RUN" "${LOCAL[@]}" -- "${JOB[@]}" --steps 6 --save-dir "$WORK/damaged-only"

# ---- zshard-run run again over its --save-dir goes on with its --log-json ----
expect_failure "a launcher whose job fails at step 5" 1 "and --max-restarts 0 are spent" -- \
  env ZSHARD_TEST_FAIL_RANK=1:5 "$RUN" "${LOCAL[@]}" --max-restarts 0 -- "${JOB[@]}" --steps 6 \
  --save-dir "$WORK/again" --log-json "$WORK/again.json"
expect_ok "run again" "$RUN" "${LOCAL[@]}" -- "${JOB[@]}" --steps 6 --save-dir "$WORK/again" \
  --log-json "$WORK/again.json"
expect_true "--log-json has steps 1..6, each once" test "$(steps "$WORK/again.json")" = "1 2 3 4 5 6 "
same_losses "... the uninterrupted run's, bit for bit" "$WORK/ref6.json" "$WORK/again.json" 0

# ---- --log-json on a full disk: a warning at each write, and the job is still relaunched ----
FULL="$WORK/full"
mkdir "$FULL"
if mount -t tmpfs -o size=64k tmpfs "$FULL" 2>"$WORK/mount.err"; then
  dd if=/dev/zero of="$FULL/fill" bs=4k count=16 status=none 2>/dev/null
  expect_failure "--log-json on a full disk: relaunched until --max-restarts" 1 "and --max-restarts 1 are spent" -- \
    env ZSHARD_TEST_FAIL_RANK=1:3 "$RUN" "${LOCAL[@]}" --max-restarts 1 -- "${JOB[@]}" --steps 6 \
    --save-dir "$WORK/full-log" --log-json "$FULL/log.json"
  expect_true "two attempts, a warning after each" eval \
    '[ "$(grep -c "^zshard-run: attempt" "$WORK/err")" = 2 ] &&
     [ "$(grep -c "^zshard-run: warning: .*log.json: cannot write" "$WORK/err")" = 2 ]'
  umount "$FULL"
else
  echo "skipped --log-json on a full disk: $(head -1 "$WORK/mount.err")"
fi

# ---- SIGTERM to the launcher: the job saves after its step and stops, no restart ----
# The stop outlasts mpirun's one second between SIGTERM and SIGKILL: it waits for an asynchronous save
# held 3 s (ZSHARD_TEST_SLOW_WRITER), then saves its step.
D="$WORK/term"
ZSHARD_TEST_SLOW_WRITER=3000 "$RUN" "${LOCAL[@]}" -- "${JOB[@]/sync/async}" --steps 100000 --save-dir "$D" \
  >"$WORK/out" 2>"$WORK/err" &
run=$!
wait_for 120 step_logged 3 "$D/zshard-run/attempt-1.jsonl"
kill -TERM $run
wait $run
code=$?
last=$(tail -1 "$D/zshard-run/attempt-1.jsonl" | field step)
expect_true "SIGTERM: exit 0 (got $code), no restart" eval '[ $code = 0 ] && ! grep -q "restart 1" "$WORK/err"'
expect_true "the last step ($last) was saved" test -f "$D/$(printf 'step-%08d' "$last")/manifest.json"
expect_true "the job was asked through its --stop-file, now gone" \
  eval 'grep -q "stop requested (--stop-file .*/zshard-run/stop)" "$WORK/out" && [ ! -e "$D/zshard-run/stop" ]'

# ---- the step is --batch x --grad-accum: resuming with the same product is no change worth a note ----
expect_ok "save at batch 8" "$TRAIN" --batch 8 --seq 32 --steps 3 --save-every 2 --save-dir "$WORK/note"
expect_ok "resume at batch 4 x grad-accum 2" "$TRAIN" --batch 4 --grad-accum 2 --seq 32 --steps 3 --resume "$WORK/note/step-00000002"
expect_true "no note on the batch" eval '! grep -q "note: --" "$WORK/out"'
expect_ok "resume at batch 4" "$TRAIN" --batch 4 --seq 32 --steps 3 --resume "$WORK/note/step-00000002"
expect_true "a note on the batch" grep -q "note: --batch was 8 when saved" "$WORK/out"

finish
