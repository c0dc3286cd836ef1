# zshard-run across hosts made on this machine (scripts/multihost.sh --head: hosta, hostb, hostc with 2
# slots each; the launcher and mpirun on a host of their own). Every process of one host (its ranks and its
# Open MPI daemon) is killed at a random step while training with --save-every 2: the job carries on with 4
# ranks from the newest committed checkpoint, every step's loss equals the uninterrupted 6-rank run's
# within 1e-5, and at most 2 steps are redone (synchronous saves; asynchronous ones, whose save in flight
# is lost with the host, at most 4: docs/recovery.md); under zero3 saving synchronously, under hybrid
# asynchronously with a --mem-budget that makes the launcher cut each step into more micro-steps. A host started again is taken back at the next
# restart. A host killed in the middle of a save leaves the previous checkpoint, which the job resumes
# from. Exit 77 (skipped) where the hosts cannot be made.
# zshard-test-seconds: 70
# zshard-test-serial
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/checkpoint_lib.sh"
source "$(dirname "$0")/launcher_lib.sh"

if [ -z "${MULTIHOST_CONTROL:-}" ]; then  # not yet on the head host: make the hosts, then run there
  bash "$ZSHARD_SRC/scripts/multihost.sh" --hosts 2,2,2 --head -- bash "$0" 2>"$WORK/hosts.err"
  code=$?
  [ $code = 77 ] && echo "skipped: $(cat "$WORK/hosts.err")"
  exit $code
fi

HOSTS=(hosta hostb hostc)
# The kills come by step 9: the job is still running when they land, even on a loaded machine. Under
# hybrid the last lands after a host is started again, a few steps later still, so that job is longer
# (and not longer everywhere: 4 and 6 ranks sum in other orders, and over many steps their losses drift
# past 1e-5).
STEPS=24
FLAGS=(--batch 12 --seq 32 --log-every 1 --save-every 2 --comm-timeout 60)
# The hosts and steps of the kills are random; ZSHARD_LAUNCHER_SEED repeats a run's.
seed=${ZSHARD_LAUNCHER_SEED:-$$}
RANDOM=$seed
echo "seed $seed"

# reference STRATEGY: the uninterrupted 6-rank run's --log-json, $WORK/ref-STRATEGY.json.
reference() {
  expect_ok "$1: the uninterrupted run on 6 ranks" "${MPIRUN[@]}" --host "$MULTIHOST_HOSTS" -np 6 "$TRAIN" \
    --strategy "$1" --steps "$STEPS" "${FLAGS[@]}" --save-dir "$WORK/ref-$1" --log-json "$WORK/ref-$1.json"
}

# launch NAME ZSHARD-RUN-FLAGS... -- TRAIN-FLAGS...: zshard-run in the background ($run) on the three hosts,
# saving into $WORK/NAME; its step logs are $WORK/NAME/zshard-run/attempt-N.jsonl.
launch() {
  local name=$1
  shift
  D="$WORK/$name"
  rm -rf "$D"
  local flags=()
  while [ "$1" != -- ]; do flags+=("$1"); shift; done
  shift
  timeout 600 "$RUN" --hosts "$MULTIHOST_HOSTS" --min-ranks 4 "${flags[@]}" -- "$TRAIN" --steps "$STEPS" "${FLAGS[@]}" "$@" \
    --save-dir "$D" --log-json "$WORK/$name.json" >"$WORK/$name.out" 2>"$WORK/$name.err" &
  run=$!
}

# kill_host HOST: every process of HOST ends (ranks, daemon, the host itself).
kill_host() {
  echo "     killing $1 after step $(tail -1 "$(ls -t "$D"/zshard-run/attempt-*.jsonl | head -1)" | field step)"
  "$MULTIHOST_CONTROL" kill "$1"
}

# finished NAME: zshard-run ended with 0, and --log-json has every step once.
finished() {
  ended_well "$1" || tail -20 "$WORK/$1.err"
  expect_true "$1: --log-json has steps 1..$STEPS, each once" test "$(steps "$WORK/$1.json")" = "$(seq -s ' ' "$STEPS") "
}

# restart NAME N KEY=VALUE...: restart N's record (restarts.jsonl) holds each KEY's VALUE, and at most
# REDONE_BOUND steps were redone.
REDONE_BOUND=2
restart() {
  local name=$1 n=$2 record kv
  shift 2
  record=$(grep "\"restart\":$n," "$WORK/$name/zshard-run/restarts.jsonl")
  for kv in "$@"; do
    expect_true "$name: restart $n: ${kv%%=*} is ${kv#*=} ($(field "${kv%%=*}" <<<"$record"))" \
      test "$(field "${kv%%=*}" <<<"$record")" = "${kv#*=}"
  done
  local redone
  redone=$(field steps_redone <<<"$record")
  expect_true "$name: restart $n: at most $REDONE_BOUND steps redone ($redone), recovered in $(field recover_s <<<"$record") s" \
    test "${redone:-9}" -le "$REDONE_BOUND" -a "$(field recover_s <<<"$record")" != null
}

# ---- zero3: a random host lost at a random step; 4 ranks go on ----
reference zero3
victim=${HOSTS[RANDOM % 3]}
at=$((3 + RANDOM % 6))
launch zero3 -- --strategy zero3 --save-mode sync
wait_for 300 step_logged $at "$D/zshard-run/attempt-1.jsonl"
kill_host "$victim"
finished zero3
restart zero3 1 hosts_lost="[\"$victim\"]" ranks=4 batch=12 grad_accum=1
expect_true "zero3: the relaunch ran zero3 on 4 ranks" grep -q "zshard-train: zero3 on 4 rank(s)" "$WORK/zero3.out"
same_losses "zero3: every step's loss is the uninterrupted 6-rank run's within 1e-5" "$WORK/ref-zero3.json" "$WORK/zero3.json" 1e-5
"$MULTIHOST_CONTROL" start "$victim"

# ---- hybrid (node groups of 2) under a budget that holds 2 sequences a rank, not 3: on 4 ranks the step
# is cut into more micro-steps, and a host started again is taken back at the next restart ----
STEPS=64
reference hybrid
# The job saves asynchronously (--save-every): the estimate holds the snapshot, as the job's own check does.
expect_ok "the estimate for 2 sequences a rank" "$ZSHARD_BIN/zshard-mem" --model tiny --strategy hybrid --world 4 \
  --shard-group 2 --batch 8 --seq 32 --async-saves --json "$WORK/mem.json"
budget=$(($(grep -o '"total_bytes": [0-9]*' "$WORK/mem.json" | cut -d' ' -f2) + 200000))
v=$((RANDOM % 3))
victim=${HOSTS[v]} other=${HOSTS[(v + 1 + RANDOM % 2) % 3]}
at=$((3 + RANDOM % 3))
REDONE_BOUND=4
launch hybrid --mem-budget "$budget" -- --strategy hybrid
wait_for 300 step_logged $at "$D/zshard-run/attempt-1.jsonl"
kill_host "$victim"
# Any step of the relaunch: it resumes from the newest checkpoint, which may already be past step at + 2
# (the kill lands a step or two after step at), and then never logs that step.
wait_for 300 grep -qs '"step":' "$D/zshard-run/attempt-2.jsonl"
"$MULTIHOST_CONTROL" start "$victim"
# One rank of another host ends: the host stays up, the job fails, and the relaunch has all three hosts.
rank=$(for pid in $("$MULTIHOST_CONTROL" pids "$other"); do
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = zshard-train ] && echo "$pid"; done | head -1)
echo "     killing rank $rank on $other after step $(tail -1 "$D/zshard-run/attempt-2.jsonl" | field step)"
kill -KILL "$rank"
finished hybrid
restart hybrid 1 hosts_lost="[\"$victim\"]" ranks=4 batch=6 grad_accum=2
restart hybrid 2 hosts_lost="[]" hosts_back="[\"$victim\"]" ranks=6 batch=12 grad_accum=1
REDONE_BOUND=2
same_losses "hybrid: every step's loss is the uninterrupted 6-rank run's within 1e-5" "$WORK/ref-hybrid.json" \
  "$WORK/hybrid.json" 1e-5
STEPS=24

# ---- a host killed in the middle of a save: the previous checkpoint is the one resumed from ----
# kill_during_save NAME HOST STEP [TRAIN-FLAGS...]: rank 0 holds 3 s between the rank files and the
# manifest of every save (ZSHARD_TEST_PAUSE_IN_SAVE); HOST is killed while step STEP is in that state.
kill_during_save() {
  local name=$1 host=$2 step=$3 dir
  shift 3
  dir="$WORK/$name/$(printf 'step-%08d' "$step")"
  # shellcheck disable=SC2154  # set by multihost.sh --head: the variables mpirun forwards
  ZSHARD_TEST_PAUSE_IN_SAVE=3000 OMPI_MCA_mca_base_env_list="$OMPI_MCA_mca_base_env_list;ZSHARD_TEST_PAUSE_IN_SAVE" \
    launch "$name" -- --strategy zero3 "$@"
  mid_save() { [ -f "$dir/rank-00005.safetensors" ] && [ ! -f "$dir/manifest.json" ]; }
  wait_for 300 mid_save
  kill_host "$host"
  expect_true "$name: $host killed in the middle of saving step $step" mid_save
  finished "$name"
  restart "$name" 1 hosts_lost="[\"$host\"]" ranks=4 resumed_step=$((step - 2))
  same_losses "$name: every step's loss is the uninterrupted 6-rank run's within 1e-5" "$WORK/ref-zero3.json" \
    "$WORK/$name.json" 1e-5
  "$MULTIHOST_CONTROL" start "$host"
}
# hosta holds rank 0, which writes the manifest: killed with it, the save cannot commit.
kill_during_save save hosta 4

finish
