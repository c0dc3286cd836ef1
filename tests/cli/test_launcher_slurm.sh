# zshard-run inside a real Slurm allocation: munged, slurmctld (on the head host) and one slurmd per host
# (scripts/multihost.sh --head: hosta and hostb with 2 CPUs each), started here. Under salloc the launcher
# reads the node list and task counts from Slurm, mpirun starts its daemons through srun, and a probe is an
# srun on the node. hostb is killed (its ranks, its daemon and its slurmd) at step 3: the job goes on on
# hosta's 2 ranks with the uninterrupted run's losses within 1e-5. Exit 77 (skipped) where Slurm is not
# installed (scripts/install-deps.sh installs it) or the hosts cannot be made.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/checkpoint_lib.sh"
source "$(dirname "$0")/launcher_lib.sh"

for tool in munged slurmctld slurmd salloc srun sinfo; do
  command -v $tool >/dev/null || { echo "skipped: no $tool (Debian: munge, slurmctld, slurmd, slurm-client)"; exit 77; }
done
if [ -z "${MULTIHOST_CONTROL:-}" ]; then  # not yet on the head host: make the hosts, then run there
  bash "$ZSHARD_SRC/scripts/multihost.sh" --hosts 2,2 --head -- bash "$0" 2>"$WORK/hosts.err"
  code=$?
  [ $code = 77 ] && echo "skipped: $(cat "$WORK/hosts.err")"
  exit $code
fi

# ---- the cluster: everything under $WORK, ended with the hosts ----
S="$WORK/slurm"
mkdir -p "$S/munge" "$S/state" "$S/spool" "$S/log"
head -c 1024 /dev/urandom >"$S/munge/key"
chmod 600 "$S/munge/key"
munged --socket="$S/munge/sock" --key-file="$S/munge/key" --pid-file="$S/munge/pid" \
  --log-file="$S/munge/log" --seed-file="$S/munge/seed" --force
cat >"$S/slurm.conf" <<EOF
ClusterName=zshard
SlurmctldHost=head(10.77.0.254)
SlurmctldPort=16817
SlurmdPort=16818
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$S/munge/sock
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$S/state
SlurmdSpoolDir=$S/spool/%n
SlurmctldPidFile=$S/slurmctld.pid
SlurmdPidFile=$S/slurmd.%n.pid
SlurmctldLogFile=$S/log/slurmctld.log
SlurmdLogFile=$S/log/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName=hosta NodeAddr=10.77.0.1 CPUs=2 State=UNKNOWN
NodeName=hostb NodeAddr=10.77.0.2 CPUs=2 State=UNKNOWN
PartitionName=all Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF="$S/slurm.conf"
slurmctld -f "$SLURM_CONF"
# shellcheck disable=SC2154  # set by multihost.sh --head
for host in hosta hostb; do "$OMPI_MCA_plm_rsh_agent" $host "slurmd -f $SLURM_CONF"; done
# Under Slurm, mpirun starts its daemons with srun and the launcher probes with srun: not with the hosts' rsh.
unset OMPI_MCA_plm_rsh_agent
both_idle() { [ "$(sinfo -h -N -o %T | grep -c idle)" = 2 ]; }
expect_true "a Slurm cluster of hosta and hostb is up" wait_for 60 both_idle

# 30 steps: the kill at step 3 lands well before the end, even on a loaded machine.
FLAGS=(--strategy zero3 --steps 30 --batch 8 --seq 32 --log-every 1 --save-every 2)
ALLOC=(timeout 300 salloc --nodes 2 --ntasks-per-node 2 --no-kill --quiet)
expect_ok "the uninterrupted run on 4 ranks" "${ALLOC[@]}" mpirun "$TRAIN" "${FLAGS[@]}" --save-dir "$WORK/ref" \
  --log-json "$WORK/ref.json"
D="$WORK/run"
"${ALLOC[@]}" "$RUN" --min-ranks 2 --probe-timeout 5 -- "$TRAIN" "${FLAGS[@]}" --save-dir "$D" \
  --log-json "$WORK/run.json" >"$WORK/out" 2>"$WORK/err" &
run=$!
wait_for 120 step_logged 3 "$D/zshard-run/attempt-1.jsonl"
"$MULTIHOST_CONTROL" kill hostb
ended_well "hostb lost"
expect_true "the launcher read the allocation: hosta:2,hostb:2" \
  grep -q "^zshard-run: attempt 1 on hosta:2,hostb:2 (4 ranks)" "$WORK/err"
record=$(cat "$D/zshard-run/restarts.jsonl")
expect_true "hostb lost, the job went on on hosta's 2 ranks ($record)" \
  test "$(field hosts_lost <<<"$record") $(field hosts <<<"$record")" = '["hostb"] "hosta:2"'
expect_true "--log-json has steps 1..30, each once" test "$(steps "$WORK/run.json")" = "$(seq -s ' ' 30) "
same_losses "every step's loss is the uninterrupted run's within 1e-5" "$WORK/ref.json" "$WORK/run.json" 1e-5
[ $failures = 0 ] || grep -v "^step" "$WORK/err" | tail -30
finish
