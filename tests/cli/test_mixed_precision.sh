# shellcheck shell=bash
# Mixed precision from the command line on the cpu: --param-dtype bf16 with --reduce-dtype bf16 over mpi,
# the memory report's model states as the mixed-precision formulas (ratio 1.000), the optimizer offloaded
# in bf16 with the same losses as without, and zshard-bench in bf16.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/checkpoint_lib.sh"
NP2=("${MPIRUN[@]}" -np 2 -x OPENBLAS_NUM_THREADS=1)
BF16=(--param-dtype bf16 --reduce-dtype bf16 --steps 4 --batch 8 --seq 32 --log-every 1000)

expect_ok "help" "$TRAIN" --help
expect_true "--param-dtype and --reduce-dtype offer bf16 on every device" \
  grep -q "parameters and gradients: fp32, or bf16 with an fp32 master copy and Adam state$" "$WORK/out"

for strategy in ddp zero3; do
  expect_ok "bf16 $strategy np 2" "${NP2[@]}" "$TRAIN" "${BF16[@]}" --strategy $strategy --log-json "$WORK/$strategy.json"
  expect_true "$strategy: the run says its dtypes" grep -q "(bf16 params, bf16 reduce, mpi)" "$WORK/out"
  expect_true "$strategy: the report's model states are the mixed-precision formulas" \
    grep -Eq "^model states per rank: .*\(params [0-9.]+ \+ grads [0-9.]+ \+ optimizer [0-9.]+\), ratio 1\.000$" "$WORK/out"
done
expect_ok "bf16 zero3 np 2, optimizer offloaded" "${NP2[@]}" "$TRAIN" "${BF16[@]}" --strategy zero3 \
  --offload optimizer --log-json "$WORK/offload.json"
same_losses "offloaded: the same losses, bit for bit" "$WORK/zero3.json" "$WORK/offload.json" 0
expect_true "offloaded: the report's model states, host included, as predicted" \
  grep -Eq "^model states per rank: .* \+ host [0-9.]+\), ratio 1\.000$" "$WORK/out"
expect_ok "one process, bf16" "$TRAIN" "${BF16[@]}" --log-json "$WORK/single.json"
expect_true "a world of one says it reduces over itself" grep -q "(bf16 params, bf16 reduce, self)" "$WORK/out"
expect_ok "zshard-bench in bf16" "$ZSHARD_BIN/zshard-bench" --param-dtype bf16 --strategies ddp --steps 2 \
  --warmup-steps 1 --batch 4 --seq 32 --json "$WORK/bench.json"
expect_true "zshard-bench: bf16 step times" python3 -c "
import json
doc = json.load(open('$WORK/bench.json'))
assert doc['results'][0]['step_ms']['median'] > 0, doc"
finish
