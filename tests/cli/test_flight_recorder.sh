# The flight recorder from the command line: a rank stopped (SIGSTOP) under each strategy, and then the
# dumps in --trace-dir, read by zshard-trace, name that rank and the collective in the first line; SIGUSR1
# dumps and the run goes on; a fatal signal dumps; --check-collectives stops a run whose rank skipped a
# unit's gather, naming the rank and the collective, passes the runs that agree, and leaves a rank's own
# failure its own line; a --trace-dir that cannot be written, a damaged dump and a FIFO among the dumps
# are one line and a non-zero exit each.
# zshard-test-seconds: 30
# zshard-test-timing
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/checkpoint_lib.sh"
TRACE="$ZSHARD_BIN/zshard-trace"
RUN=(--batch 8 --seq 32 --log-every 1)
TIMEOUT=2

# rank_pid JOB RANK: the pid of world rank RANK among the children of the mpirun JOB.
rank_pid() {
  local p
  for p in $(children_of "$1"); do
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2" && echo "$p"
  done
}

job_gone() { ! kill -0 "$1" 2>/dev/null; }

# hit NAME SIGNAL NP RANK ARGS...: a run of zshard-train ARGS on NP ranks, dumping to $WORK/traces; at step
# 3, SIGNAL goes to world rank RANK (to mpirun, which forwards it to every rank, for "all"), and the job
# is given --comm-timeout and 30 s to end (not waited for after USR1, which it survives). The first line of
# zshard-trace's verdict is in $WORK/verdict.
hit() {
  local name=$1 signal=$2 np=$3 rank=$4 job victim
  shift 4
  rm -rf "$WORK/traces"
  : >"$WORK/out"
  "${MPIRUN[@]}" -np "$np" "$TRAIN" "${RUN[@]}" --comm-timeout $TIMEOUT --trace-dir "$WORK/traces" "$@" \
    >"$WORK/out" 2>"$WORK/err" &
  job=$!
  if ! wait_for 60 grep -qs '^step *3/' "$WORK/out"; then
    kill -KILL $job; wait $job
    echo "FAIL $name: the job did not reach step 3"; failures=$((failures + 1)); return 1
  fi
  if [ "$rank" = all ]; then victim=$job; else victim=$(rank_pid $job "$rank"); fi
  kill -"$signal" "$victim"
  if [ "$signal" != USR1 ]; then
    wait_for $((TIMEOUT + 30)) job_gone $job || echo "FAIL $name: the job still runs 30 s past the deadline"
    kill -KILL $job "$victim" 2>/dev/null
    wait $job 2>/dev/null
  fi
  "$TRACE" "$WORK/traces" >"$WORK/trace" 2>&1
  head -1 "$WORK/trace" >"$WORK/verdict"
  return 0
}

# names_stalled_rank RANK FILE: FILE's line names RANK as the one that stopped, did not enter or left no
# dump, and a collective by number and op.
names_stalled_rank() {
  grep -Eq "^rank $1 (stopped running|never entered|left no dump|stalled outside any wait)" "$2" &&
    grep -Eq "collective #[0-9]+ \((all_gather|reduce_scatter|all_reduce|broadcast)" "$2"
}

# A stalled rank under every strategy: the verdict names it and the collective.
for spec in "ddp 2" "zero1 2" "zero2 3" "zero3 3" "hybrid 4"; do
  set -- $spec
  last=$(($2 - 1))
  hit "stop $1 np $2" STOP "$2" $last --strategy "$1" || continue
  expect_true "stop $1 np $2: zshard-trace names rank $last and the collective first ($(cat "$WORK/verdict"))" \
    names_stalled_rank $last "$WORK/verdict"
done
expect_true "stop hybrid np 4: a row per rank" test "$(grep -c '^[0-3] ' "$WORK/trace")" = 4

# SIGUSR1: every rank dumps, and the run goes on to its end.
# 200 steps: the signal reaches the ranks well before their end, even on a loaded machine.
hit "usr1" USR1 2 all --strategy zero3 --steps 200
wait_for 60 test -s "$WORK/traces/rank-00000.trace"
wait_for 60 test -s "$WORK/traces/rank-00001.trace"
"$TRACE" "$WORK/traces" >"$WORK/trace" 2>&1
expect_true "usr1: both ranks dumped on request" test "$(grep -c 'on request (SIGUSR1)' "$WORK/trace")" = 2
wait_for 120 grep -qs '^step *200/200' "$WORK/out"
expect_true "usr1: the run went on to step 200" grep -q '^step *200/200' "$WORK/out"

# A fatal signal dumps before the process ends.
hit "segv" SEGV 2 1 --strategy zero2
expect_true "segv: rank 1's dump says so" grep -Eq '^1 .*fatal signal \(signal 11\)' "$WORK/trace"

# --check-collectives: the ranks that agree pass (groups of unequal sizes reduce over different
# communicators), and a rank that skips unit 1's gather stops the job, naming it and the collective.
expect_ok "check-collectives, hybrid 3,1" "${MPIRUN[@]}" -np 4 "$TRAIN" "${RUN[@]}" --steps 4 --strategy hybrid \
  --shard-group 3,1 --check-collectives
expect_ok "check-collectives, zero3 with accumulation and eval" "${MPIRUN[@]}" -np 2 "$TRAIN" "${RUN[@]}" --steps 4 \
  --strategy zero3 --grad-accum 2 --eval-every 2 --eval-data default --check-collectives
ZSHARD_TEST_SKIP_GATHER=2:1 expect_failure "check-collectives: rank 2 skips unit 1's gather" nonzero \
  "^zshard-train: error: collective check, step 1.*: shard group 0 \(ranks 0-2\) parts at its collective #[0-9]+: rank 2 skipped all_gather of [0-9]+ f32 \(params, unit 1\)" \
  -- "${MPIRUN[@]}" -np 3 "$TRAIN" "${RUN[@]}" --steps 3 --strategy zero3 --comm-timeout $TIMEOUT --check-collectives
# The ranks' own failures (a timed-out or truncated collective) are its consequences, left unsaid; MPI may
# still print its own lines.
expect_one_line "check-collectives: rank 2 skips unit 1's gather" "^zshard-train"
# A rank failing on its own (none of its collectives failed) is the cause: its peers, left in the
# collective it never issued, part from it there, which is no divergence. Its line alone is printed.
ZSHARD_TEST_FAIL_RANK=1:2 expect_failure "check-collectives: rank 1 fails on its own" 1 \
  "^zshard-train: rank 1: injected fault" \
  -- "${MPIRUN[@]}" -np 3 "$TRAIN" "${RUN[@]}" --steps 3 --strategy zero3 --comm-timeout $TIMEOUT --check-collectives
expect_one_line "check-collectives: rank 1 fails on its own" "^zshard-train"

# Bad input: one line, a non-zero exit, nothing lost.
: >"$WORK/file"
expect_every_rank_fails "trace dir under a file" 2 "error: --trace-dir $WORK/file/traces: cannot create the directory" \
  -- "${ARGS[@]}" --steps 1 --trace-dir "$WORK/file/traces"
expect_ok "a checkpoint" "$TRAIN" "${ARGS[@]}" --steps 2 --save-dir "$WORK/ck"
expect_failure "resume with a trace dir that cannot be written" 2 "--trace-dir" -- \
  "$TRAIN" "${ARGS[@]}" --steps 3 --save-dir "$WORK/ck" --resume latest --trace-dir "$WORK/file/x"
expect_true "the checkpoint is still there and whole" test -s "$WORK/ck/step-00000002/manifest.json"
hit "dumps for the damage tests" STOP 2 1 --strategy ddp
cp "$WORK/traces/rank-00000.trace" "$WORK/good.trace"
mkdir -p "$WORK/truncated" "$WORK/corrupt"
head -c 1000 "$WORK/good.trace" >"$WORK/truncated/rank-00000.trace"
cp "$WORK/good.trace" "$WORK/corrupt/rank-00000.trace"
# Byte 700 inverted, whatever it held (writing a fixed 'X' changed nothing where the byte was one already).
python3 -c "
import sys
data = bytearray(open(sys.argv[1], 'rb').read())
data[700] ^= 0xFF
open(sys.argv[1], 'wb').write(data)" "$WORK/corrupt/rank-00000.trace"
expect_failure "trace truncated" 1 "^zshard-trace: error: .*truncated/rank-00000.trace: truncated: 1000 bytes" -- \
  "$TRACE" "$WORK/truncated"
expect_one_line "trace truncated" "."
expect_failure "trace corrupt" 1 "^zshard-trace: error: .*corrupt/rank-00000.trace: corrupt: (group|record) [0-9]+ fails its checksum" \
  -- "$TRACE" "$WORK/corrupt"
expect_one_line "trace corrupt" "."
mkdir "$WORK/fifo"
cp "$WORK/good.trace" "$WORK/fifo/rank-00000.trace"
mkfifo "$WORK/fifo/rank-00001.trace"
expect_failure "trace dir holding a FIFO (no hang)" 2 \
  "^zshard-trace: error: $WORK/fifo/rank-00001.trace: is a FIFO \(named pipe\), not a flight-recorder dump$" -- "$TRACE" "$WORK/fifo"
expect_one_line "trace dir holding a FIFO (no hang)" "."
expect_failure "trace of no directory" 2 "^zshard-trace: error: .*nothing: not a directory" -- "$TRACE" "$WORK/nothing"
expect_failure "trace of a directory without dumps" 2 "holds no flight-recorder dumps" -- "$TRACE" "$WORK/ck"
finish
