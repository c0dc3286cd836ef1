# Set-up's collectives obey --comm-timeout: a rank stalled before its first collective (ZSHARD_TEST_STALL_SET_UP)
# ends the job within the timeout plus 2 s of what the same job takes without the stall, with a line naming
# the collective that timed out and a non-zero exit, for zshard-train (ddp; hybrid, whose plan gathers the
# hosts) and zshard-bench. So does a rank stalled before its engine splits the process groups (MPI's split
# has no deadline of its own). ZSHARD_FAULT_SLACK (2 by default) is the allowance over the timeout.
# zshard-test-timing
source "$(dirname "$0")/lib.sh"
TIMEOUT=3
SLACK=${ZSHARD_FAULT_SLACK:-2}
BENCH="$ZSHARD_BIN/zshard-bench"

run_timed() {  # run_timed COMMAND...: sets $took (seconds) and $code (its exit status)
  local start
  start=$(date +%s.%N)
  timeout 120 "$@" >"$WORK/out" 2>"$WORK/err"
  code=$?
  took=$(echo "$(date +%s.%N) - $start" | bc)
}

check() {  # check NAME COMMAND...; STALL (1:60000) is ZSHARD_TEST_STALL_SET_UP's value
  local name=$1 base stalled
  shift
  run_timed "${MPIRUN[@]}" -np 2 "$@"
  base=$took
  if [ "$code" != 0 ]; then echo "FAIL $name: the run without a stall failed"; cat "$WORK/err"; failures=$((failures + 1)); return; fi
  run_timed "${MPIRUN[@]}" -x ZSHARD_TEST_STALL_SET_UP="${STALL:-1:60000}" -np 2 "$@"
  stalled=$took
  if [ "$code" = 0 ] || [ "$code" = 124 ]; then echo "FAIL $name: exit $code, want a failure before the deadline's end"; failures=$((failures + 1)); return; fi
  if ! grep -q "timed out" "$WORK/err"; then echo "FAIL $name: no line names the timed-out collective:"; cat "$WORK/err"; failures=$((failures + 1)); return; fi
  if [ "$(echo "$stalled - $base > $TIMEOUT + $SLACK" | bc)" = 1 ]; then
    echo "FAIL $name: ${stalled}s with the stall, ${base}s without: over --comm-timeout $TIMEOUT + $SLACK s"
    failures=$((failures + 1)); return
  fi
  echo "ok   $name (${stalled}s stalled, ${base}s without)"
}

check "zshard-train ddp" "$TRAIN" --steps 0 --comm-timeout $TIMEOUT
check "zshard-train hybrid" "$TRAIN" --strategy hybrid --steps 0 --comm-timeout $TIMEOUT
STALL=1:60000:engine check "zshard-train zero3, stalled before its engine's split" "$TRAIN" --strategy zero3 --steps 0 \
  --comm-timeout $TIMEOUT
check "zshard-bench" "$BENCH" --strategies ddp --steps 1 --warmup-steps 0 --comm-timeout $TIMEOUT
finish
