# shellcheck shell=bash
# Jobs across two hosts made on this machine (scripts/multihost.sh: namespaces on a private bridge, Open MPI
# over TCP between them): MPI sees two nodes, and hybrid, zero3 and llama-tiny runs split over the hosts
# have the single-process run's losses, with node groups of equal (3 + 3) and unequal (4 + 2) sizes, and zero3
# with secondary groups on the hosts has plain zero3's. Exit 77 (skipped) where the hosts cannot be made.
# zshard-test-seconds: 60
# zshard-test-timing
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/checkpoint_lib.sh"
MULTIHOST=(bash "$ZSHARD_SRC/scripts/multihost.sh")
ARGS=(--steps 5 --batch 12 --seq 32 --log-every 1000)

# expect_nodes SLOTS WANT: on hosts SLOTS, every rank's host name and its node's rank count (as Open MPI
# placed it), counted, are WANT ("3 hosta 3, 3 hostb 3": 3 ranks on hosta, each seeing 3 on its node).
expect_nodes() {
  # shellcheck disable=SC2016  # expanded by each rank's shell
  timeout 60 "${MULTIHOST[@]}" --hosts "$1" -- sh -c 'echo "$(hostname) $OMPI_COMM_WORLD_LOCAL_SIZE"' \
    >"$WORK/out" 2>"$WORK/err"
  local code=$? got
  if [ $code = 77 ]; then
    echo "skipped: $(cat "$WORK/err")"
    exit 77
  fi
  got=$(sort "$WORK/out" | uniq -c | awk '{ printf "%s%s %s %s", (NR > 1 ? ", " : ""), $1, $2, $3 }')
  expect_true "hosts $1: ranks on two nodes ($got)" test "$got" = "$2"
}
expect_nodes 3,3 "3 hosta 3, 3 hostb 3"
expect_nodes 4,2 "4 hosta 4, 2 hostb 2"

# A short run with Open MPI's transport log: ranks on different hosts connect over TCP on the bridge
# (hosta's to 10.77.0.2, hostb's to 10.77.0.1), ranks on one host never do (they share memory).
expect_ok "a run with the transport log, hosts 3,3" env OMPI_MCA_btl_base_verbose=100 "${MULTIHOST[@]}" \
  --hosts 3,3 -- "$TRAIN" --steps 1 --batch 6 --seq 8 --log-every 1000
tcp=$(grep -Ec '^\[host[ab]:[0-9]+\] btl:tcp: now connected to ' "$WORK/err")
cross=$(grep -Ec '^\[hosta:[0-9]+\] btl:tcp: now connected to 10\.77\.0\.2,|^\[hostb:[0-9]+\] btl:tcp: now connected to 10\.77\.0\.1,' \
  "$WORK/err")
expect_true "TCP connections between the hosts only ($cross of $tcp)" test "$tcp" -gt 0 -a "$cross" = "$tcp"

# cross_host NAME SLOTS REFERENCE ARGS...: zshard-train ARGS on hosts SLOTS has the losses of REFERENCE
# (the single-process run's --log-json), within 1e-5 relative.
cross_host() {
  local name=$1 slots=$2 ref=$3
  shift 3
  expect_ok "$name: hosts $slots" "${MULTIHOST[@]}" --hosts "$slots" -- "$TRAIN" "${ARGS[@]}" "$@" \
    --log-json "$WORK/run.json"
  same_losses "$name: the single process's losses within 1e-5" "$ref" "$WORK/run.json" 1e-5
}
for model in tiny llama-tiny; do
  expect_ok "$model: one process" "$TRAIN" --model "$model" "${ARGS[@]}" --log-json "$WORK/$model.json"
done
cross_host "tiny hybrid, shard group 3" 3,3 "$WORK/tiny.json" --model tiny --strategy hybrid --shard-group 3
cross_host "tiny zero3" 4,2 "$WORK/tiny.json" --model tiny --strategy zero3
cross_host "llama-tiny hybrid, shard group 3" 3,3 "$WORK/llama-tiny.json" --model llama-tiny --strategy hybrid \
  --shard-group 3
# Node groups: each host's ranks shard, given as `node` or by default across hosts of equal size.
cross_host "tiny hybrid, shard group node" 3,3 "$WORK/tiny.json" --model tiny --strategy hybrid --shard-group node
expect_true "--shard-group node is the host's 3 ranks" grep -q "shard group 3," "$WORK/out"
cross_host "llama-tiny hybrid, default group" 3,3 "$WORK/llama-tiny.json" --model llama-tiny --strategy hybrid
expect_true "the default group across equal hosts is the host's 3 ranks" grep -q "shard group 3," "$WORK/out"
# Unequal hosts: each shards among its own ranks (a 1/4 shard on hosta, 1/2 on hostb), by request or by
# default, and every rank's model states are the prediction for its own group.
cross_host "tiny hybrid, shard group node" 4,2 "$WORK/tiny.json" --model tiny --strategy hybrid --shard-group node
expect_true "--shard-group node is each host's ranks" grep -q "shard group 4,2," "$WORK/out"
for g in 4 2; do
  expect_true "model states of the group of $g as predicted" \
    grep -Eq "^model states per rank \(shard groups of $g\): .* ratio 1\.000$" "$WORK/out"
done
# A checkpoint of the 4 + 2 node groups resumes on one host as zero2 on 3 ranks, and the other way round.
expect_ok "save node groups 4,2 at step 3" "${MULTIHOST[@]}" --hosts 4,2 -- "$TRAIN" "${ARGS[@]}" --strategy hybrid \
  --shard-group node --save-dir "$WORK/ck42" --save-every 3 --log-json "$WORK/42.json"
expect_ok "resume as zero2 np 3 on one host" "${MPIRUN[@]}" -np 3 "$TRAIN" "${ARGS[@]}" --strategy zero2 \
  --resume "$WORK/ck42/step-00000003" --log-json "$WORK/42-to-zero2.json"
same_losses "zero2 np 3 after node groups 4,2: losses within 1e-6" "$WORK/42.json" "$WORK/42-to-zero2.json" 1e-6
expect_ok "save zero2 np 3 at step 3" "${MPIRUN[@]}" -np 3 "$TRAIN" "${ARGS[@]}" --strategy zero2 \
  --save-dir "$WORK/ck3" --save-every 3 --log-json "$WORK/zero2.json"
expect_ok "resume as node groups 4,2" "${MULTIHOST[@]}" --hosts 4,2 -- "$TRAIN" "${ARGS[@]}" --strategy hybrid \
  --shard-group node --resume "$WORK/ck3/step-00000003" --log-json "$WORK/zero2-to-42.json"
same_losses "node groups 4,2 after zero2 np 3: losses within 1e-6" "$WORK/zero2.json" "$WORK/zero2-to-42.json" 1e-6
cross_host "llama-tiny hybrid, default group" 4,2 "$WORK/llama-tiny.json" --model llama-tiny --strategy hybrid
expect_true "the default group across unequal hosts is each host's ranks" grep -q "shard group 4,2," "$WORK/out"
expect_failure "a list of groups across the hosts" 2 \
  "^zshard-train: error: --shard-group 3,3: a group spans two hosts \(the hosts hold 4,2 ranks" -- \
  "${MULTIHOST[@]}" --hosts 4,2 -- "$TRAIN" "${ARGS[@]}" --strategy hybrid --shard-group 3,3
expect_one_line "a list of groups across the hosts" "error: --shard-group"

# Secondary groups on the hosts (--secondary-shard host): backward gathers inside each host from the shares
# its forward kept, so a zero3 run has plain zero3's losses exactly, on hosts of equal and unequal sizes
# (4 + 2: shares of a quarter and a half), and moves what its theory says.
for hosts in 3,3:3 4,2:4,2; do  # slots:the groups as the report writes them (one size for equal groups)
  slots=${hosts%:*}
  expect_ok "tiny zero3: hosts $slots" "${MULTIHOST[@]}" --hosts "$slots" -- "$TRAIN" "${ARGS[@]}" --strategy zero3 \
    --log-json "$WORK/zero3.json"
  expect_ok "tiny zero3, secondary shard host: hosts $slots" "${MULTIHOST[@]}" --hosts "$slots" -- "$TRAIN" \
    "${ARGS[@]}" --strategy zero3 --secondary-shard host --log-json "$WORK/hpz.json"
  expect_true "the secondary groups are the hosts' ranks, $slots" grep -q "secondary groups ${hosts#*:}," "$WORK/out"
  same_losses "secondary shard host on hosts $slots: zero3's losses exactly" "$WORK/zero3.json" "$WORK/hpz.json" 0
  expect_true "hosts $slots: the measured communication is the theory's, each line's" comm_as_theory
done
expect_failure "a secondary shard on hosts of one rank" 2 \
  "^zshard-train: error: --secondary-shard host: every host runs one rank" -- \
  "${MULTIHOST[@]}" --hosts 1,1 -- "$TRAIN" "${ARGS[@]}" --strategy zero3 --secondary-shard host
expect_one_line "a secondary shard on hosts of one rank" "error: --secondary-shard"
expect_failure "node groups on hosts of one rank (would be ddp)" 2 \
  "^zshard-train: error: --shard-group node: every one of the 2 hosts holds one rank" -- \
  "${MULTIHOST[@]}" --hosts 1,1 -- "$TRAIN" "${ARGS[@]}" --strategy hybrid --shard-group node

# A stall on a remote host: hostb's last rank stopped at step 3 under zero3. The other ranks time out at
# --comm-timeout and the job must be gone soon after, as on one host: the median of 5 trials within
# ZSHARD_FAULT_SLACK (3 s) past the deadline. It took about 3.6 s past it (median of 8) while every failing
# rank kept on through mpirun's SIGTERM until its SIGKILL and the woken stalled rank asked for a second abort.
# The times fall in steps of mpirun's 1 s SIGKILL timeout; five trials keep a loaded machine's slow ones
# from deciding.
stall_seconds() {
  local job victim started
  : >"$WORK/out"
  "${MULTIHOST[@]}" --hosts 2,2 -- "$TRAIN" --strategy zero3 --batch 8 --seq 32 --steps 100000 --log-every 1 \
    --comm-timeout "$STALL_TIMEOUT" --trace-dir "$WORK/traces" >"$WORK/out" 2>"$WORK/err" &
  job=$!
  wait_for 60 grep -qs '^step *3/' "$WORK/out" || { kill -TERM $job; wait $job; echo 999; return; }
  victim=$(rank_pids $job | awk '$2 == 3 { print $1 }')
  started=$(date +%s.%N)
  kill -STOP "$victim"
  wait_for $((STALL_TIMEOUT + 30)) eval '! kill -0 $job 2>/dev/null'
  echo "$(date +%s.%N) - $started - $STALL_TIMEOUT" | bc
  kill -KILL $job 2>/dev/null
  wait $job 2>/dev/null
}
STALL_TIMEOUT=3
past=()
for trial in 1 2 3 4 5; do past+=("$(stall_seconds)"); done
median=$(printf '%s\n' "${past[@]}" | sort -g | sed -n 3p)
expect_true "remote stall: the job ends within ${ZSHARD_FAULT_SLACK:-3} s of the deadline (median $median of ${past[*]})" \
  test "$(echo "$median <= ${ZSHARD_FAULT_SLACK:-3}" | bc)" = 1
expect_true "remote stall: zshard-trace names the stopped rank 3 first" \
  sh -c "'$ZSHARD_BIN/zshard-trace' '$WORK/traces' | head -1 | grep -Eq '^rank 3 (stopped running|never entered|left no dump|stalled outside any wait).* collective #'"

finish
