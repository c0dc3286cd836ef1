#!/bin/sh
# Runs a rank of an Open MPI job at unequal priority: ranks 0 and 1 at nice 5, rank 2 at the launcher's.
# Where other processes keep both cores busy they fill the core that benchmarks/skewed_pin.sh leaves to
# rank 2 alone, and the pinned ranks end up equally fast; the scheduler's weights keep these ranks
# unequal however busy the cores are, so zshard-tune's detection of unequal speeds can be seen. Not the
# gain of --rank-batches auto: the ranks draw on the same cores' time, so work moved to rank 2 runs on
# time taken from ranks 0 and 1.
#   mpirun ... -np 3 benchmarks/skewed_nice.sh CMD
case "$OMPI_COMM_WORLD_RANK" in 0|1) exec nice -n 5 "$@" ;; *) exec "$@" ;; esac
