#!/bin/sh
# Runs a rank of an Open MPI job at unequal priority: ranks 0 and 1 at nice 5, rank 2 at the launcher's.
# Where other processes keep both cores busy they fill a core that benchmarks/skewed_pin.sh leaves to
# rank 2 alone, and the pinned ranks end up equally fast; the scheduler's weights (nice 5 is a third of
# nice 0's) keep the ranks unequal however busy the cores are. Unpinned, so on an idle 2-core machine
# the three ranks share the cores by the same weights.
#   mpirun ... -np 3 benchmarks/skewed_nice.sh CMD
case "$OMPI_COMM_WORLD_RANK" in 0|1) exec nice -n 5 "$@" ;; *) exec "$@" ;; esac
