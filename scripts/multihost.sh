#!/usr/bin/env bash
# Runs an MPI job across two or more hosts made on this machine, so that ranks on different hosts talk
# over TCP as on a real cluster (docs/multihost.md):
#   bash scripts/multihost.sh [--hosts 4,2] -- COMMAND [ARGS...]
#   bash scripts/multihost.sh [--hosts 2,2,2] --head -- COMMAND [ARGS...]
#   bash scripts/multihost.sh [--hosts 2,2] --link-rate 1gbit -- COMMAND [ARGS...]
# Each host is a set of namespaces (UTS, network, mount) with its own host name, hosta, hostb, ..., an
# address 10.77.0.N/24 on a private bridge and an /etc/hosts naming them all. mpirun runs on hosta and
# reaches the others through a small rsh agent in place of ssh. With --head, COMMAND itself runs on one more
# host, head, that holds no slots, with an environment in which any mpirun it starts reaches the hosts
# (for zshard-run), and with $MULTIHOST_CONTROL, a script that takes hosts down and up:
#   "$MULTIHOST_CONTROL" kill hostb    # every process of hostb ends, hostb with them: it no longer answers
#   "$MULTIHOST_CONTROL" start hostb   # hostb again, new and empty, at the same name and address
#   "$MULTIHOST_CONTROL" pids hostb    # the pids of every process of hostb
# With --link-rate RATE each host's link carries at most RATE each way (a token bucket on both ends of its
# veth); there is no added latency (the kernel has no netem).
# Exits with the command's status, or 77 with one line saying why when the hosts cannot be made here (not
# root, no namespaces).
set -euo pipefail
# shellcheck source=scripts/mpi-env.sh
source "$(dirname "$0")/mpi-env.sh"

usage() {
  echo "usage: $0 [--hosts SLOTS,SLOTS[,...]] [--head] [--link-rate RATE] -- COMMAND [ARGS...]" >&2
  exit 2
}
skip() {
  echo "multihost: cannot make hosts here: $*" >&2
  exit 77
}

# hold NAME SETUP UNSHARE_FLAGS...: starts a process in new namespaces that runs SETUP (sh) in them, says
# it is ready, then sleeps until the cleanup; its pid goes in $held_pid.
hold() {
  local name=$1 setup=$2
  shift 2
  rm -f "$dir/ready.$name"
  # setsid: a host outlives the shell that made it (a control command), as a machine would.
  setsid unshare "$@" sh -c "$setup && touch '$dir/ready.$name' && exec sleep infinity" 2>"$dir/err.$name" &
  held_pid=$!
  disown "$held_pid"  # ended by the cleanup or a control command, never waited for
  local tries=0
  until [ -e "$dir/ready.$name" ]; do
    if ! kill -0 "$held_pid" 2>/dev/null || [ $((tries += 1)) -gt 100 ]; then
      skip "$name: $(head -n 1 "$dir/err.$name")"
    fi
    sleep 0.05
  done
}
# in_ns PID COMMAND...: a setup step inside a holder's network namespace; failing means no hosts here.
in_ns() {
  local pid=$1
  shift
  nsenter -t "$pid" -n "$@" 2>"$dir/err" || skip "$*: $(head -n 1 "$dir/err")"
}
# make_host NAME ADDRESS: the host's namespaces, a veth from the switch to its eth0 with ADDRESS/24; its
# holder's pid goes in $dir/pids as "NAME PID".
make_host() {
  local name=$1 address=$2 switch
  switch=$(cat "$dir/switch")
  hold "$name" "hostname $name && mount --bind '$dir/hosts' /etc/hosts && ip link set lo up" --uts --net --mount
  in_ns "$switch" ip link add "v$held_pid" type veth peer name eth0 netns "$held_pid"
  in_ns "$switch" ip link set "v$held_pid" master br0 up
  in_ns "$held_pid" ip addr add "$address/24" dev eth0
  in_ns "$held_pid" ip link set eth0 up
  if [ -s "$dir/link_qdisc" ]; then
    # Egress of both ends: eth0 holds what the host sends, the bridge's end what it receives, so each
    # direction of the link, as on a full-duplex NIC, and several senders to one host share its rate.
    local shape
    read -ra shape <"$dir/link_qdisc"
    in_ns "$held_pid" tc qdisc add dev eth0 root "${shape[@]}"
    in_ns "$switch" tc qdisc add dev "v$held_pid" root "${shape[@]}"
  fi
  echo "$name $held_pid" >>"$dir/pids"
}
# host_pid NAME: the holder of a host that is up (nothing for one that was killed).
host_pid() { awk -v host="$1" '$1 == host && $2 != "-" { print $2 }' "$dir/pids"; }
# in_netns PID...: every process in the network namespaces of those holders.
in_netns() {
  local held=""
  for pid in "$@"; do held+=" $(readlink "/proc/$pid/ns/net" 2>/dev/null)"; done
  find /proc/[0-9]*/ns/net -maxdepth 0 -printf '%h %l\n' 2>/dev/null |
    awk -v held="$held" 'BEGIN { split(held, ns, " "); for (i in ns) ours[ns[i]] = 1 }
                         $2 in ours { split($1, path, "/"); print path[3] }'
}

# multihost.sh --control DIR kill|start|pids NAME: what $MULTIHOST_CONTROL runs.
if [ "${1:-}" = --control ]; then
  [ $# = 4 ] || usage
  dir=$2 action=$3 name=$4
  address=$(awk -v host="$name" '$2 == host { print $1 }' "$dir/hosts")
  [ -n "$address" ] || { echo "multihost: no host $name" >&2; exit 2; }
  pid=$(host_pid "$name")
  case $action in
    kill)
      [ -n "$pid" ] || { echo "multihost: $name is down already" >&2; exit 1; }
      sed -i "s/^$name .*/$name -/" "$dir/pids"
      ns=$(readlink "/proc/$pid/ns/net")
      in_netns "$pid" | xargs -r kill -KILL 2>/dev/null || true  # some may end by themselves meanwhile
      # Down once no process is left in its namespace (the holder may stay a zombie until the cleanup).
      for _ in $(seq 500); do
        find /proc/[0-9]*/ns/net -maxdepth 0 -printf '%l\n' 2>/dev/null | grep -qxF "$ns" || exit 0
        sleep 0.02
      done
      echo "multihost: $name: processes left after SIGKILL" >&2
      exit 1 ;;
    pids) [ -z "$pid" ] || in_netns "$pid" ;;
    start)
      [ -z "$pid" ] || { echo "multihost: $name is up already" >&2; exit 1; }
      sed -i "/^$name /d" "$dir/pids"
      make_host "$name" "$address" ;;
    *) usage ;;
  esac
  exit 0
fi

hosts_arg=4,2
head=0
unset link_rate
while [ $# -gt 0 ]; do
  case $1 in
    --hosts) [ $# -ge 2 ] || usage; hosts_arg=$2; shift 2 ;;
    --head) head=1; shift ;;
    --link-rate) [ $# -ge 2 ] || usage; link_rate=$2; shift 2 ;;
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

# The rate in bits per second, from tc's form: a number and bit, kbit, mbit, gbit or tbit.
link_bits=""
if [ -n "${link_rate+set}" ]; then
  link_bits=$(awk -v rate="$link_rate" 'BEGIN {
    rate = tolower(rate)
    if (match(rate, /^([0-9]+(\.[0-9]*)?|\.[0-9]+)(k|m|g|t)?bit$/) == 0) exit
    unit = substr(rate, length(rate) - 3, 1)
    bits = (rate + 0) * (unit == "k" ? 1e3 : unit == "m" ? 1e6 : unit == "g" ? 1e9 : unit == "t" ? 1e12 : 1)
    if (bits >= 1e7 && bits <= 1e11) printf "%.0f", bits }')
  if [ -z "$link_bits" ]; then
    echo "multihost: bad --link-rate '$link_rate': want 10mbit to 100gbit in tc's form" \
      "(100mbit, 1gbit, 10gbit)" >&2
    exit 2
  fi
fi

[ "$(id -u)" = 0 ] || skip "not root"
for tool in ip unshare nsenter mount ${link_bits:+tc}; do
  command -v "$tool" >/dev/null || skip "no $tool"
done

# Everything this run makes lives in namespaces held by its own processes, and in $dir: nothing has a
# global name, so runs at once cannot collide, and ending the holders removes the links and mounts.
subnet=10.77.0.0/24
dir=$(mktemp -d "${TMPDIR:-/tmp}/zshard-multihost.$$.XXXXXX")
: >"$dir/pids"
job=""
if [ -n "$link_bits" ]; then
  # tbf sends a packet once its bucket holds the packet's bytes; the bucket fills at the rate, up to the
  # burst. The burst is 10 ms of the rate: at least what the rate brings in one timer tick (rate/HZ, for
  # HZ 100 and up), or tbf sends less than the rate, and from 10mbit up several full frames (tbf drops a
  # frame larger than the burst); a larger one would let the link run at line speed for longer after an
  # idle spell. latency caps the queue behind the bucket at rate x latency plus the burst: enough to keep
  # the link busy while TCP backs off from a drop, short enough not to add a deep buffer's queueing delay.
  echo "tbf rate ${link_bits}bit burst $((link_bits / 8 / 100)) latency 10ms" >"$dir/link_qdisc"
fi
# shellcheck disable=SC2317  # runs from the EXIT trap
cleanup() {
  trap "" INT TERM  # a second signal (timeout sends one to the group too) must not cut the cleanup short
  if [ -n "$job" ]; then
    kill -TERM "$job" 2>/dev/null || true
    wait "$job" 2>/dev/null || true
  fi
  # The holders (those a control command started too), and every process left in their namespaces (a
  # daemon or rank that outlived mpirun): a namespace lives while any process is in it.
  local held
  held=$(awk '$2 != "-" { print $2 }' "$dir/pids"; cat "$dir/switch" 2>/dev/null)
  # shellcheck disable=SC2086  # one pid a word
  { echo "$held"; in_netns $held; } | xargs -r kill -KILL 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

names=()
letters=abcdefghijklmnopqrstuvwxyz
{
  echo "127.0.0.1 localhost"
  for i in "${!slots[@]}"; do
    names+=("host${letters:i:1}")
    echo "10.77.0.$((i + 1)) ${names[i]}"
  done
  echo "10.77.0.254 head"
} >"$dir/hosts"

# The switch: a bridge in a network namespace of its own, with one veth to each host.
hold switch "ip link add br0 type bridge && ip link set br0 up" --net
echo "$held_pid" >"$dir/switch"
for i in "${!slots[@]}"; do
  make_host "${names[i]}" "10.77.0.$((i + 1))"
  echo "${names[i]} slots=${slots[i]}" >>"$dir/hostfile"
done
[ $head = 0 ] || make_host head 10.77.0.254
first=$(host_pid "$([ $head = 1 ] && echo head || echo "${names[0]}")")

# Open MPI's rsh agent: "rsh HOST COMMAND..." runs COMMAND in HOST's namespaces through sh, as ssh would,
# with a login's bare environment (mpirun forwards OMPI_* and what -x names itself). A host that is down
# does not answer, as ssh to a machine that is off.
cat >"$dir/rsh" <<'EOF'
#!/usr/bin/env bash
set -euo pipefail
pid=$(awk -v host="$1" '$1 == host && $2 != "-" { print $2 }' "$(dirname "$0")/pids")
[ -n "$pid" ] || { echo "rsh: $1: no route to host" >&2; exit 255; }
shift
exec nsenter -t "$pid" -u -n -m env -i PATH="$PATH" HOME="${HOME:-/}" sh -c "$*"
EOF
chmod +x "$dir/rsh"

# What ranks on the other hosts need from this environment: a login there would not have it.
forward=()
for var in OPENBLAS_NUM_THREADS OMP_NUM_THREADS $(compgen -e ZSHARD_); do
  if [ -n "${!var+set}" ]; then forward+=("$var"); fi
done
total=0
for n in "${slots[@]}"; do total=$((total + n)); done
layout=""
for i in "${!slots[@]}"; do layout+=" ${names[i]}=10.77.0.$((i + 1)) slots=${slots[i]}"; done
layout+="${link_bits:+, each link $link_rate each way}"
# Only the bridge's subnet for the daemons' and the ranks' TCP; ranks on one host may use shared memory.
mca=(plm_rsh_agent "$dir/rsh" btl "tcp,vader,self" btl_tcp_if_include "$subnet" oob_tcp_if_include "$subnet")
if [ $head = 1 ]; then
  # The same settings in the environment of any mpirun the command starts (Open MPI reads OMPI_MCA_*).
  run=(env MULTIHOST_CONTROL="$dir/control" MULTIHOST_HOSTS="$(sed 's/ slots=/:/' "$dir/hostfile" | paste -sd,)"
    OMPI_MCA_hwloc_base_binding_policy=none)
  for ((k = 0; k < ${#mca[@]}; k += 2)); do run+=("OMPI_MCA_${mca[k]}=${mca[k + 1]}"); done
  run+=("OMPI_MCA_mca_base_env_list=$(IFS=";"; echo "${forward[*]}")")
  printf '#!/usr/bin/env bash\nexec bash %q --control %q "$@"\n' "$(realpath "$0")" "$dir" >"$dir/control"
  chmod +x "$dir/control"
  echo "multihost: ${#slots[@]} hosts on $subnet:${layout}; on head (10.77.0.254): $*" >&2
else
  run=("${MPIEXEC:-mpirun}" --hostfile "$dir/hostfile" -np "$total" --bind-to none)
  for ((k = 0; k < ${#mca[@]}; k += 2)); do run+=(--mca "${mca[k]}" "${mca[k + 1]}"); done
  for var in "${forward[@]}"; do run+=(-x "$var"); done
  echo "multihost: ${#slots[@]} hosts on $subnet:${layout}; on ${names[0]}: ${run[*]} $*" >&2
fi

nsenter -t "$first" -u -n -m --wd="$PWD" "${run[@]}" "$@" &
job=$!
status=0
wait "$job" || status=$?
job=""
exit "$status"
