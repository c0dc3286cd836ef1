#!/usr/bin/env bash
# Runs an MPI job across two or more hosts made on this machine, so that ranks on different hosts talk
# over TCP as on a real cluster (docs/multihost.md):
#   bash scripts/multihost.sh [--hosts 4,2] -- COMMAND [ARGS...]
# Each host is a set of namespaces (UTS, network, mount) with its own host name, hosta, hostb, ..., an
# address 10.77.0.N/24 on a private bridge and an /etc/hosts naming them all. mpirun runs on hosta and
# reaches the others through a small rsh agent in place of ssh. Exits with the command's status, or 77
# with one line saying why when the hosts cannot be made here (not root, no namespaces).
set -euo pipefail
# shellcheck source=scripts/mpi-env.sh
source "$(dirname "$0")/mpi-env.sh"

usage() {
  echo "usage: $0 [--hosts SLOTS,SLOTS[,...]] -- COMMAND [ARGS...]" >&2
  exit 2
}
hosts_arg=4,2
while [ $# -gt 0 ]; do
  case $1 in
    --hosts) [ $# -ge 2 ] || usage; hosts_arg=$2; shift 2 ;;
    --) shift; break ;;
    *) usage ;;
  esac
done
[ $# -gt 0 ] || usage
IFS=, read -ra slots <<<"$hosts_arg"
if [ ${#slots[@]} -lt 2 ] || [ ${#slots[@]} -gt 26 ]; then
  echo "multihost: --hosts wants 2 to 26 slot counts" >&2
  exit 2
fi
for n in "${slots[@]}"; do
  [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "multihost: bad slot count '$n' in --hosts $hosts_arg" >&2; exit 2; }
done

skip() {
  echo "multihost: cannot make hosts here: $*" >&2
  exit 77
}
[ "$(id -u)" = 0 ] || skip "not root"
for tool in ip unshare nsenter mount; do
  command -v "$tool" >/dev/null || skip "no $tool"
done

# Everything this run makes lives in namespaces held by its own processes, and in $dir: nothing has a
# global name, so runs at once cannot collide, and ending the holders removes the links and mounts.
subnet=10.77.0.0/24
dir=$(mktemp -d "${TMPDIR:-/tmp}/zshard-multihost.$$.XXXXXX")
holders=()
netns=()
job=""
# shellcheck disable=SC2317  # runs from the EXIT trap
cleanup() {
  trap "" INT TERM  # a second signal (timeout sends one to the group too) must not cut the cleanup short
  if [ -n "$job" ]; then
    kill -TERM "$job" 2>/dev/null || true
    wait "$job" 2>/dev/null || true
  fi
  if [ ${#holders[@]} -gt 0 ]; then
    kill -KILL "${holders[@]}" 2>/dev/null || true
    wait "${holders[@]}" 2>/dev/null || true
  fi
  # A namespace lives while any process is in it: a daemon or rank that outlived mpirun goes too.
  find /proc/[0-9]*/ns/net -maxdepth 0 -printf '%h %l\n' 2>/dev/null |
    awk -v held="${netns[*]}" 'BEGIN { split(held, ns, " "); for (i in ns) ours[ns[i]] = 1 }
                               $2 in ours { split($1, path, "/"); print path[3] }' |
    xargs -r kill -KILL 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# hold NAME SETUP UNSHARE_FLAGS...: starts a process in new namespaces that runs SETUP (sh) in them, says
# it is ready, then sleeps until the cleanup; its pid goes in $held_pid.
hold() {
  local name=$1 setup=$2
  shift 2
  unshare "$@" sh -c "$setup && touch '$dir/ready.$name' && exec sleep infinity" 2>"$dir/err.$name" &
  held_pid=$!
  holders+=("$held_pid")
  local tries=0
  until [ -e "$dir/ready.$name" ]; do
    if ! kill -0 "$held_pid" 2>/dev/null || [ $((tries += 1)) -gt 100 ]; then
      skip "$name: $(head -n 1 "$dir/err.$name")"
    fi
    sleep 0.05
  done
  netns+=("$(readlink "/proc/$held_pid/ns/net")")
}
# in_ns PID COMMAND...: a setup step inside a holder's network namespace; failing means no hosts here.
in_ns() {
  local pid=$1
  shift
  nsenter -t "$pid" -n "$@" 2>"$dir/err" || skip "$*: $(head -n 1 "$dir/err")"
}

names=()
letters=abcdefghijklmnopqrstuvwxyz
{
  echo "127.0.0.1 localhost"
  for i in "${!slots[@]}"; do
    names+=("host${letters:i:1}")
    echo "10.77.0.$((i + 1)) ${names[i]}"
  done
} >"$dir/hosts"

# The switch: a bridge in a network namespace of its own, with one veth to each host.
hold switch "ip link add br0 type bridge && ip link set br0 up" --net
switch=$held_pid
pids=()
for i in "${!slots[@]}"; do
  hold "${names[i]}" "hostname ${names[i]} && mount --bind '$dir/hosts' /etc/hosts && ip link set lo up" \
    --uts --net --mount
  pids+=("$held_pid")
  in_ns "$switch" ip link add "v$i" type veth peer name eth0 netns "$held_pid"
  in_ns "$switch" ip link set "v$i" master br0 up
  in_ns "$held_pid" ip addr add "10.77.0.$((i + 1))/24" dev eth0
  in_ns "$held_pid" ip link set eth0 up
  echo "${names[i]} slots=${slots[i]}" >>"$dir/hostfile"
  echo "${names[i]} $held_pid" >>"$dir/pids"
done

# Open MPI's rsh agent: "rsh HOST COMMAND..." runs COMMAND in HOST's namespaces through sh, as ssh would,
# with a login's bare environment (mpirun forwards OMPI_* and what -x names itself).
cat >"$dir/rsh" <<'EOF'
#!/usr/bin/env bash
set -euo pipefail
pid=$(awk -v host="$1" '$1 == host { print $2 }' "$(dirname "$0")/pids")
shift
exec nsenter -t "$pid" -u -n -m env -i PATH="$PATH" HOME="${HOME:-/}" sh -c "$*"
EOF
chmod +x "$dir/rsh"

# What ranks on the other hosts need from this environment: a login there would not have it.
forward=()
for var in OPENBLAS_NUM_THREADS OMP_NUM_THREADS $(compgen -e ZSHARD_); do
  if [ -n "${!var+set}" ]; then forward+=(-x "$var"); fi
done
total=0
for n in "${slots[@]}"; do total=$((total + n)); done
# Only the bridge's subnet for the daemons' and the ranks' TCP; ranks on one host may use shared memory.
mpi=("${MPIEXEC:-mpirun}" --hostfile "$dir/hostfile" -np "$total" --bind-to none
  --mca plm_rsh_agent "$dir/rsh" --mca btl "tcp,vader,self"
  --mca btl_tcp_if_include "$subnet" --mca oob_tcp_if_include "$subnet" "${forward[@]}")
layout=""
for i in "${!slots[@]}"; do layout+=" ${names[i]}=10.77.0.$((i + 1)) slots=${slots[i]}"; done
echo "multihost: ${#slots[@]} hosts on $subnet:${layout}; on ${names[0]}: ${mpi[*]} $*" >&2

nsenter -t "${pids[0]}" -u -n -m --wd="$PWD" "${mpi[@]}" "$@" &
job=$!
status=0
wait "$job" || status=$?
job=""
exit "$status"
