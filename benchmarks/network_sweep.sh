#!/bin/bash
# Step time and exposed communication of ddp, zero2, zero3 and hybrid (one shard group per host), and of
# zero3 with the slow-link modes (quantized gathers and reductions, a secondary shard in the host), across
# hosts made on this machine (scripts/multihost.sh), for each topology and link rate, beside
# zshard-project's prediction for the same topology and link; benchmarks/network_sweep_summary.py writes
# OUT_DIR/summary.json and prints the table (benchmarks/RESULTS.md, "A network sweep").
#   sudo benchmarks/network_sweep.sh BUILD_DIR OUT_DIR
# Each strategy runs alone, so that the bytes each host's eth0 sent over the run (its kernel counter, read
# by the host's first rank before and after) belong to that strategy. Environment: MODEL_FLAGS, STEPS
# (timed, after WARMUP warm-up steps), TOPOLOGIES (multihost --hosts lists), LINKS (link rates, "none" for
# an unshaped link), STRATEGIES (variants as network_sweep_summary.py's VARIANTS name them); WORK_DIR keeps
# every run's JSON (default: a new directory under /tmp).
set -euo pipefail
# shellcheck source=benchmarks/build_out_dirs.sh
source "$(dirname "$0")/build_out_dirs.sh"
build_out_dirs zshard-bench "zshard-bench, zshard-project and zshard-commbench" "$@"
# Why this size: 16.3M parameters (4 layers of dim 256 and GPT-2's 50257-token tied embedding) on 256
# tokens a step, so that on 1gbit ddp's all-reduce (about 0.8 s) outlasts the 4 ranks' compute (about
# 0.2 s on 2 cores), and unshaped takes about half as long as it.
model_flags=${MODEL_FLAGS:---model gpt2 --layers 4 --dim 256 --heads 4 --batch 8 --seq 32}
steps=${STEPS:-6}
warmup=${WARMUP:-2}
topologies=${TOPOLOGIES:-2,2 1,1,1,1}
links=${LINKS:-none 10gbit 1gbit}
strategies=${STRATEGIES:-ddp zero2 zero3 hybrid zero3+int8g+int4r zero3+hpz zero3+int8g+int4r+hpz}
work=${WORK_DIR:-$(mktemp -d /tmp/network_sweep.XXXXXX)}
mkdir -p "$work"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
echo "network_sweep: runs in $work" >&2

# A single rank's step, the compute time zshard-project scales.
# shellcheck disable=SC2086
mpirun --allow-run-as-root -np 1 "$build/zshard-bench" $model_flags --strategies ddp --steps "$steps" \
  --warmup-steps "$warmup" --json "$work/single.json" >/dev/null

# The links as the collectives see them: zshard-commbench's all-reduce bus bandwidth (GB/s) at 4 MiB
# between two ranks of one host (shared memory), and between two hosts of one rank each on every link.
commbench=("$build/zshard-commbench" --rounds 3 --round-ms 200)
link_ops=(--ops all_reduce --min-size 4MiB --max-size 4MiB)
mpirun --allow-run-as-root --oversubscribe -np 2 "${commbench[@]}" "${link_ops[@]}" \
  --json "$work/link_intra.json" >/dev/null
for link in $links; do
  rate=()
  [ "$link" = none ] || rate=(--link-rate "$link")
  bash "$src/scripts/multihost.sh" --hosts 1,1 "${rate[@]}" -- "${commbench[@]}" "${link_ops[@]}" \
    --json "$work/link_$link.json" >/dev/null
done

# And each collective on each topology and link at 16 MiB (a little over a third of the gathered embedding
# unit's 49 MiB), for the bandwidth each strategy's own collectives reach.
for hosts in $topologies; do
  for link in $links; do
    rate=()
    [ "$link" = none ] || rate=(--link-rate "$link")
    bash "$src/scripts/multihost.sh" --hosts "$hosts" "${rate[@]}" -- "${commbench[@]}" \
      --ops all_gather,reduce_scatter,all_reduce,all_to_all --min-size 16MiB --max-size 16MiB \
      --json "$work/collectives_${hosts//,/-}_$link.json" >/dev/null
  done
done

# run_one TAG HOSTS LINK VARIANT: one zshard-bench run on the hosts, with each host's eth0 counters
# (count_eth0.sh).
run_one() {
  local tag=$1 hosts=$2 link=$3 variant=$4 rate=() flags
  [ "$link" = none ] || rate=(--link-rate "$link")
  read -ra flags <<<"$(python3 "$src/benchmarks/network_sweep_summary.py" bench-flags "$variant")"
  echo "$tag $(cut -d' ' -f1-3 /proc/loadavg)" >>"$work/loads.txt"
  # shellcheck disable=SC2086  # model_flags splits into flags
  bash "$src/scripts/multihost.sh" --hosts "$hosts" "${rate[@]}" -- sh "$src/benchmarks/count_eth0.sh" \
    "$work/$tag" "$build/zshard-bench" $model_flags "${flags[@]}" \
    --steps "$steps" --warmup-steps "$warmup" --json "$work/$tag.json" >"$work/$tag.out" 2>&1
}

for hosts in $topologies; do
  for link in $links; do
    for strategy in $strategies; do
      # A host of one rank would be a shard group of one, which hybrid refuses (it would be ddp), and a
      # secondary group of one, which --secondary-shard host refuses (it would be no resharding).
      if [[ ",$hosts," == *,1,* ]]; then
        case $strategy in
          hybrid*) why="its shard group would be 1, which hybrid refuses" ;;
          *+hpz*) why="its secondary group would be 1, which --secondary-shard host refuses" ;;
          *) why= ;;
        esac
        if [ -n "$why" ]; then
          echo "a host of one rank: $why" >"$work/${hosts//,/-}_${link}_$strategy.skipped"
          continue
        fi
      fi
      run_one "${hosts//,/-}_${link}_$strategy" "$hosts" "$link" "$strategy"
    done
  done
done

# zshard-project on each topology and link, for each variant: as it models them (every rank its own
# device); with the compute of ranks sharing this machine's cores (--compute-ms scaled by ranks per core,
# at least 1); and with that compute, each collective at the bandwidth it reached on the topology, and
# one NIC per host.
cores=$(getconf _NPROCESSORS_ONLN)  # nproc would answer OMP_NUM_THREADS
for hosts in $topologies; do
  for link in $links; do
    # shellcheck disable=SC2086  # the list splits into one argument per variant
    python3 "$src/benchmarks/network_sweep_summary.py" project-flags "$work" "$hosts" "$link" "$cores" \
      $strategies >"$work/project_args"
    while read -r name flags; do
      # shellcheck disable=SC2086
      "$build/zshard-project" $flags --json "$work/project_${hosts//,/-}_${link}_$name.json" >/dev/null
    done <"$work/project_args"
  done
done
# shellcheck disable=SC2086  # the lists split into one argument per item
python3 "$src/benchmarks/network_sweep_summary.py" summarise "$work" "$out/summary.json" \
  --topologies $topologies --links $links --strategies $strategies --steps "$steps" --warmup "$warmup" \
  --cores "$cores"
