# A rank that dies or stalls mid-run ends every rank of the job: killed (SIGKILL) or stopped (SIGSTOP) at
# np 2 to 4 under every strategy. A stall is caught by the collective's deadline: the job is gone within
# --comm-timeout + 2 s (ZSHARD_FAULT_SLACK, 3 by default for a loaded CI machine) and the first line of stderr names the collective that timed out. Prints one
# "reliability" line per fault kind (trials, passed, failed, seconds) for benchmarks/RESULTS.md.
# zshard-test-seconds: 125
# zshard-test-timing
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/checkpoint_lib.sh"

TIMEOUT=${ZSHARD_FAULT_COMM_TIMEOUT:-5}
# Seconds past the deadline the whole job may take to go: about 1 on an idle machine (mpirun's teardown);
# CI runs this beside other tests on 2 cores.
SLACK=${ZSHARD_FAULT_SLACK:-3}
declare -A trials passed took

job_gone() { ! kill -0 "$1" 2>/dev/null; }

# fault KIND STRATEGY NP: start a job, wait for its third step, hit one rank, time how long the job lives.
fault() {
  local kind=$1 strategy=$2 np=$3 signal victim job code started elapsed name="$1 $2 np$3" first
  # Emptied here, not by the job's redirection: that happens in the forked job, and until it does the
  # wait below would find the previous trial's step 3.
  : >"$WORK/out"
  : >"$WORK/err"
  "${MPIRUN[@]}" -np "$np" "$TRAIN" --strategy "$strategy" --batch 8 --seq 32 --steps 100000 --log-every 1 \
    --comm-timeout "$TIMEOUT" >"$WORK/out" 2>"$WORK/err" &
  job=$!
  if ! wait_for 60 grep -qs '^step *3/' "$WORK/out"; then
    kill -KILL $job; wait $job
    echo "FAIL $name: the job did not reach step 3"; failures=$((failures + 1)); return
  fi
  # The last rank for a stall, the first for a kill: both ends of the ring.
  if [ "$kind" = stall ]; then signal=STOP; victim=$(children_of $job | tr ' ' '\n' | grep . | tail -1)
  else signal=KILL; victim=$(children_of $job | tr ' ' '\n' | grep . | head -1); fi
  started=$(date +%s.%N)
  kill -$signal "$victim"
  wait_for $((TIMEOUT + 30)) job_gone $job
  elapsed=$(echo "$(date +%s.%N) - $started" | bc)
  kill -KILL $job "$victim" 2>/dev/null
  wait $job 2>/dev/null
  code=$?
  trials[$kind]=$((${trials[$kind]:-0} + 1))
  took[$kind]=$(echo "${took[$kind]:-0} + $elapsed" | bc)
  first=$(head -1 "$WORK/err")
  local limit=$((TIMEOUT + SLACK)) problem=""
  if [ "$(echo "$elapsed > $limit" | bc)" = 1 ]; then problem="still running ${elapsed}s after the fault (limit ${limit}s)"
  elif [ "$code" = 0 ]; then problem="exit 0"
  elif [ "$kind" = stall ] && ! [[ "$first" =~ (all_gather|reduce_scatter|all_reduce|broadcast).*timed\ out ]]; then
    problem="first line does not name the stalled collective: $first"
  fi
  if [ -z "$problem" ]; then
    passed[$kind]=$((${passed[$kind]:-0} + 1))
    printf 'ok   %s (%.1fs)\n' "$name" "$elapsed"
  else
    echo "FAIL $name: $problem"; cat "$WORK/err"; failures=$((failures + 1))
  fi
}

for np in 2 3 4; do
  for strategy in ddp zero1 zero2 zero3 hybrid; do
    [ $strategy = hybrid ] && [ $np != 4 ] && continue  # hybrid needs a shard group between 1 and the world
    fault stall $strategy $np
    fault kill $strategy $np
  done
done
for kind in stall kill; do
  printf 'reliability rank %s (--comm-timeout %s): trials %d, passed %d, failed %d, %.1f s in all\n' "$kind" \
    "$TIMEOUT" "${trials[$kind]:-0}" "${passed[$kind]:-0}" $((${trials[$kind]:-0} - ${passed[$kind]:-0})) "${took[$kind]:-0}"
done
finish
