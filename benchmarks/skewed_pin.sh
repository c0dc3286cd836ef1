#!/bin/sh
# Runs a rank of an Open MPI job pinned to make ranks of unequal speed on a 2-core machine: ranks 0 and 1
# share core 0, rank 2 has core 1 to itself (twice their speed). mpirun ... -np 3 benchmarks/skewed_pin.sh CMD
case "$OMPI_COMM_WORLD_RANK" in 0|1) core=0 ;; *) core=1 ;; esac
exec taskset -c "$core" "$@"
