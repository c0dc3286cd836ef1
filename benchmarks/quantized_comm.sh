#!/bin/bash
# Quantized communication (--quantize-gathers, --quantize-reductions: ZeRO++'s qwZ and qgZ) across two
# hosts of two ranks made on this machine (scripts/multihost.sh): zero3's loss curves with each
# quantization against none (and ddp's, the same sums rounded in another order) on an unshaped link, and
# on a shaped link the step time, the bytes that
# crossed hosts and the final loss of ddp, zero3 and quantized zero3; benchmarks/quantized_comm_summary.py
# writes OUT_DIR/summary.json and prints the tables (benchmarks/RESULTS.md, "Quantized gathers and
# reductions across hosts").
#   sudo benchmarks/quantized_comm.sh BUILD_DIR OUT_DIR
# Every run is zshard-train with --log-json (each step's loss, time and exposed communication) inside
# count_eth0.sh (the bytes each host's eth0 sent), evaluated after its last step (the mean token loss over
# EVAL_BATCHES fixed batches: a final loss that does not hang on one batch); each shaped run is also
# replayed by zshard-bench for its collectives' time on the link alone. The parts: accuracy (the curves),
# seeds (the link's model unshaped at each of SEEDS: how far the final loss moves with the seed alone, and
# whether a quantization's difference outlasts it) and link (the shaped comparison). Environment: STEPS
# (every training run's), WARMUP (its first steps, left out of the step times), TINY_FLAGS and GPT2_FLAGS
# (the accuracy runs' models), LINK_FLAGS and LINK (the comparison's model and link rate), SEEDS,
# SEED_RUNS (which of the link's runs the seeds part makes: ddp zero3 zero3+gathers-int8+reductions-int4
# zero3+gathers-int8+reductions-int8), EVAL_BATCHES, PARTS (default "accuracy seeds link"; runs already
# in WORK_DIR stay in the summary, so the parts may run at different times: the link's step times want a
# quiet machine, the losses do not);
# WORK_DIR keeps every run's output (default: a new directory under /tmp).
set -euo pipefail
# shellcheck source=benchmarks/build_out_dirs.sh
source "$(dirname "$0")/build_out_dirs.sh"
build_out_dirs zshard-train "zshard-train and zshard-bench" "$@"
steps=${STEPS:-300}
warmup=${WARMUP:-5}
# Why these sizes: GPT-2 at its width (dim 768, 53.6M parameters with 2 layers) takes 1.6 s a step here
# unquantized at 4 x 8 tokens and 3.5 s quantized at 4 x 16, as the gathers and the quantization on the
# CPU scale with the parameters, not the tokens: 8-17 minutes a run of 300 steps. At the network sweep's
# width (dim 256, 14.7M parameters) a run takes 1.5-5 minutes.
declare -A accuracy_flags=(
  [tiny]=${TINY_FLAGS:---model tiny --batch 8 --seq 64}
  [gpt2]=${GPT2_FLAGS:---model gpt2 --layers 2 --dim 256 --heads 4 --batch 4 --seq 32}
)
link_flags=${LINK_FLAGS:---model gpt2 --layers 4 --dim 256 --heads 4 --batch 8 --seq 32}
link=${LINK:-1gbit}
seeds=${SEEDS:-1 2 3}
seed_runs=${SEED_RUNS:-ddp zero3 zero3+gathers-int8+reductions-int4 zero3+gathers-int8+reductions-int8}
eval_batches=${EVAL_BATCHES:-16}
parts=" ${PARTS:-accuracy seeds link} "
work=${WORK_DIR:-$(mktemp -d /tmp/quantized_comm.XXXXXX)}
mkdir -p "$work"
touch "$work/runs.tsv" "$work/loads.txt"
# The commit of each part's runs; the summary names them all.
echo "${parts:1:-1}: $(git -C "$src" describe --always --dirty)" >>"$work/commit"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
echo "quantized_comm: runs in $work" >&2

# run TAG PART MODEL LINK FLAGS...: zshard-train on 2 hosts of 2 ranks, each host's eth0 counted; the run
# goes in runs.tsv, the load and the time before and after it in loads.txt.
run() {
  local tag=$1 part=$2 model=$3 link=$4 rate=()
  shift 4
  [ "$link" = none ] || rate=(--link-rate "$link")
  # A run made again replaces its earlier line.
  grep -v "^$tag"$'\t' "$work/runs.tsv" >"$work/runs.tsv.new" || true
  printf '%s\t%s\t%s\t%s\t%s\n' "$tag" "$part" "$model" "$link" "$*" >>"$work/runs.tsv.new"
  mv "$work/runs.tsv.new" "$work/runs.tsv"
  echo "$tag before $(date -u +%FT%T) $(cut -d' ' -f1-3 /proc/loadavg)" >>"$work/loads.txt"
  bash "$src/scripts/multihost.sh" --hosts 2,2 "${rate[@]}" -- sh "$src/benchmarks/count_eth0.sh" "$work/$tag" \
    "$build/zshard-train" --steps "$steps" --log-json "$work/$tag.json" --eval-data default --eval-every "$steps" \
    --eval-batches "$eval_batches" "$@" >"$work/$tag.out" 2>&1
  echo "$tag after $(date -u +%FT%T) $(cut -d' ' -f1-3 /proc/loadavg)" >>"$work/loads.txt"
}

# Each quantization, as NAME|FLAGS.
quantizations=(
  "none|"
  "gathers-int8|--quantize-gathers int8"
  "reductions-int8|--quantize-reductions int8"
  "reductions-int4|--quantize-reductions int4"
  "gathers-int8+reductions-int4|--quantize-gathers int8 --quantize-reductions int4"
)
for model in tiny gpt2; do
  [[ $parts == *" accuracy "* ]] || break
  for quantization in "${quantizations[@]}"; do
    # shellcheck disable=SC2086  # the flags split into one argument each
    run "accuracy_${model}_${quantization%%|*}" accuracy "$model" none ${accuracy_flags[$model]} --strategy zero3 \
      ${quantization#*|}
  done
  # ddp unquantized: zero3's sums in another order, so how far rounding alone moves a run's final loss.
  # shellcheck disable=SC2086
  run "accuracy_${model}_ddp" accuracy "$model" none ${accuracy_flags[$model]} --strategy ddp
done
# The last quantization again, for whether its losses repeat bit for bit.
# shellcheck disable=SC2086
[[ $parts != *" accuracy "* ]] ||
  run accuracy_tiny_repeat repeat tiny none ${accuracy_flags[tiny]} --strategy zero3 ${quantizations[-1]#*|}

# The shaped link: each strategy and quantization trained, then replayed by zshard-bench (a warm-up step
# and 3 timed), whose replay of the step's collectives alone times the link without the compute.
# Each as NAME|STRATEGY|QUANTIZATION FLAGS.
comparisons=(
  "ddp|ddp|"
  "zero3|zero3|"
  "zero3+gathers-int8+reductions-int4|zero3|--quantize-gathers int8 --quantize-reductions int4"
  "zero3+gathers-int8+reductions-int8|zero3|--quantize-gathers int8 --quantize-reductions int8"
)
# The link's model unshaped at each seed (a shaped run's losses are an unshaped run's: the same world and
# strategy give the same bits), for the seed's own spread of the final loss.
for seed in $seeds; do
  [[ $parts == *" seeds "* ]] || break
  for comparison in "${comparisons[@]}"; do
    IFS='|' read -r name strategy quantization <<<"$comparison"
    [[ " $seed_runs " == *" $name "* ]] || continue
    # shellcheck disable=SC2086
    run "seed${seed}_$name" "seed$seed" gpt2 none $link_flags --seed "$seed" --strategy "$strategy" $quantization
  done
done
for comparison in "${comparisons[@]}"; do
  [[ $parts == *" link "* ]] || break
  IFS='|' read -r name strategy quantization <<<"$comparison"
  # shellcheck disable=SC2086
  run "link_$name" link gpt2 "$link" $link_flags --strategy "$strategy" $quantization
  # shellcheck disable=SC2086
  bash "$src/scripts/multihost.sh" --hosts 2,2 --link-rate "$link" -- "$build/zshard-bench" $link_flags \
    --strategies "$strategy" $quantization --steps 3 --warmup-steps 1 --json "$work/link_$name.bench.json" \
    >"$work/link_$name.bench.out" 2>&1
done

python3 "$src/benchmarks/quantized_comm_summary.py" "$work" "$out/summary.json" --warmup "$warmup" \
  --steps "$steps"
