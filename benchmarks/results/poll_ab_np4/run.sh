#!/bin/bash
# The A/B loop behind r5 and r6 (run from the repository root as: run.sh OUTDIR REPS 4 off on torch):
# per repeat zshard-bench with ZSHARD_POLL_BACKOFF=0 (off), with it =1 (on, what np 4 on 2 cores picks
# by itself), then PyTorch DDP; summarise.py OUTDIR prints the medians and the per-repeat paired ratios.
cd "$(dirname "$0")/../../.."  # the repository root
source scripts/mpi-env.sh
export OMP_NUM_THREADS=1
out=$1 reps=$2 np=$3; shift 3
mkdir -p $out
MF="--model tiny --layers 4 --dim 256 --heads 4 --batch 8 --seq 128"
for rep in $(seq $reps); do
  for mode in "$@"; do
    f=$out/${mode}_$rep.json
    case $mode in off) b=0 ;; on) b=1 ;; *) b= ;; esac
    load=$(cut -d' ' -f1 /proc/loadavg)
    if [ $mode = torch ]; then
      /usr/bin/time -f "%U %S %e" -o $out/${mode}_$rep.time mpirun --oversubscribe --bind-to none -np $np /usr/bin/python3 benchmarks/peers/torch_ddp.py $MF --json $f >/dev/null
    else
      ZSHARD_POLL_BACKOFF=$b /usr/bin/time -f "%U %S %e" -o $out/${mode}_$rep.time mpirun --oversubscribe --bind-to none -np $np -x ZSHARD_POLL_BACKOFF build-bench/zshard-bench $MF --strategies ddp,zero3 --json $f >/dev/null 2>&1
    fi
    echo "$mode $rep load $load $(cat $out/${mode}_$rep.time)"
  done
done
