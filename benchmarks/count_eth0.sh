#!/bin/sh
# Runs COMMAND as one rank of a scripts/multihost.sh job, counting the bytes that cross hosts: the host's
# first rank reads its eth0's kernel byte counters before and after COMMAND and writes
# "RANKS_ON_HOST TX_BEFORE RX_BEFORE TX_AFTER RX_AFTER" to PREFIX.wire.HOSTNAME (network_sweep_summary.py's
# wire_bytes reads them); the other ranks just run COMMAND. Exits with COMMAND's status.
#   bash scripts/multihost.sh --hosts 2,2 -- sh benchmarks/count_eth0.sh PREFIX COMMAND [ARGS...]
set -eu
# /proc/net/dev shows the network namespace of the host, /sys/class/net that of the machine. Past 8 digits
# a count runs into "eth0:": take what follows the colon.
counters() { sed -n 's/^ *eth0: *//p' /proc/net/dev | awk '{ print $9, $1 }'; }
wire=$1.wire.$(hostname)
shift
if [ "$OMPI_COMM_WORLD_LOCAL_RANK" != 0 ]; then
  exec "$@"
fi
before=$(counters)
code=0
"$@" || code=$?
echo "$OMPI_COMM_WORLD_LOCAL_SIZE $before $(counters)" >"$wire"
exit $code
