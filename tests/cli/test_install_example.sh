# `cmake --install` gives a package that an outside project finds with find_package(zshard): the example
# model of its own, built against the public headers only, is a full trainer through the one call. It
# trains under every strategy at np 1-4 and with parameters frozen, writes a checkpoint and a memory
# report, resumes on another world size, and offers zshard-bench, zshard-mem, zshard-tune and zshard-export
# for its model.
# zshard-test-seconds: 26
source "$(dirname "$0")/lib.sh"
cmake --install "$ZSHARD_BIN" --prefix "$WORK/prefix" >/dev/null || { echo "FAIL install"; exit 1; }
# The prefix holds the public headers and nothing else: include/zshard/*.h as in the source tree.
installed=$(cd "$WORK/prefix/include" && find . -type f | sort)
public=$(cd "$ZSHARD_SRC/include" && find . -type f | sort)
if [ "$installed" != "$public" ]; then
  echo "FAIL the prefix's headers are not exactly include/zshard:"; diff <(echo "$public") <(echo "$installed")
  failures=$((failures + 1)); fi
# So a file including an internal header does not compile against it, while the public ones do.
probe() {  # probe HEADER ok|fails
  local dir="$WORK/probe-${1//\//_}"
  cmake -S "$ZSHARD_SRC/tests/cli/install_probe" -B "$dir" -DCMAKE_PREFIX_PATH="$WORK/prefix" -DPROBE_HEADER="$1" \
    >"$WORK/probe.log" 2>&1 && cmake --build "$dir" >>"$WORK/probe.log" 2>&1
  local built=$?
  if [ "$2" = ok ] && [ $built -ne 0 ]; then
    echo "FAIL $1 does not compile against the prefix"; cat "$WORK/probe.log"; failures=$((failures + 1))
  elif [ "$2" = fails ] && { [ $built -eq 0 ] || ! grep -q "No such file" "$WORK/probe.log"; }; then
    echo "FAIL $1 is reachable from the prefix"; cat "$WORK/probe.log"; failures=$((failures + 1))
  else echo "ok   $1 $2 against the prefix"; fi
}
for header in zshard/train.h zshard/testing.h; do probe $header ok; done
for header in shard/sharded_params.h kernels/allocator.h kernels/cpu/ops.h runtime/train/trainer.h; do
  probe $header fails; done
# The core library stands alone: a program of the engine and a model links zshard::core, which needs
# neither the tools' library nor a command-line parser, and trains.
if ldd "$WORK/probe-zshard_train.h/engine_program" | grep -q "libzshard_tools"; then
  echo "FAIL a program of the engine alone loads the tools' library"; failures=$((failures + 1))
else echo "ok   a program of the engine alone links the core library only"; fi
if readelf -d "$(find "$WORK/prefix" -name libzshard_core.so)" | grep NEEDED | grep -q "zshard_tools"; then
  echo "FAIL the core library needs the tools' library"; failures=$((failures + 1))
else echo "ok   the core library needs nothing of the tools"; fi
if grep -rq "CLI11" "$(dirname "$(find "$WORK/prefix" -name zshardTargets.cmake)")"; then
  echo "FAIL the installed targets name CLI11"; failures=$((failures + 1))
else echo "ok   no installed target links CLI11"; fi
if "$WORK/probe-zshard_train.h/engine_program" >"$WORK/engine.out" 2>&1; then echo "ok   it trains: $(cat "$WORK/engine.out")"
else echo "FAIL the engine program"; cat "$WORK/engine.out"; failures=$((failures + 1)); fi
# The installed headers hold the API, no flag plumbing: no command-line parser, no flag spelling.
if plumbing=$(grep -rnE "CLI/|CLI::|dtype_flag|join_sizes|check_group_sizes|apply_comm_timeout|plan_on_hosts|trace_group|collectives_failed|ShardedParams&|collective_world" \
    "$WORK/prefix/include"); then
  echo "FAIL flag plumbing in the installed headers:"; echo "$plumbing"; failures=$((failures + 1))
else echo "ok   the installed headers hold no flag plumbing"; fi
cmake -S "$ZSHARD_SRC/examples/own_model" -B "$WORK/example" -DCMAKE_PREFIX_PATH="$WORK/prefix" >"$WORK/log" 2>&1 \
  || { cat "$WORK/log"; echo "FAIL configure"; exit 1; }
cmake --build "$WORK/example" >"$WORK/log" 2>&1 || { cat "$WORK/log"; echo "FAIL build"; exit 1; }
OWN="$WORK/example/own_model"

check() {  # check NAME COMMAND...: the command must succeed
  local name=$1
  shift
  if timeout 120 "$@" >"$WORK/out" 2>"$WORK/err"; then echo "ok   $name"; else
    echo "FAIL $name (exit $?)"; cat "$WORK/out" "$WORK/err"; failures=$((failures + 1)); fi
}

for np in 1 2 3 4; do
  for strategy in ddp zero1 zero2 zero3 hybrid; do
    check "own model, $strategy at np $np" "${MPIRUN[@]}" -np $np "$OWN" --strategy $strategy --steps 20 --batch 8 \
      --seq 32 --log-every 100
  done
done
# Frozen parameters: their grads() entries are undefined tensors, whose data() is the null pointer the
# ops skip, so the model's backward needs no case of its own.
for frozen in wte head.weight; do
  check "own model with $frozen frozen, zero3 at np 2" "${MPIRUN[@]}" -np 2 "$OWN" --strategy zero3 --steps 5 \
    --batch 8 --seq 32 --log-every 100 --freeze $frozen
done
# A checkpoint with a frozen parameter exports only through a binary that has the model: its export mode.
check "own model with wte frozen saves" "${MPIRUN[@]}" -np 2 "$OWN" --strategy zero3 --steps 2 --batch 8 --seq 32 \
  --freeze wte --save-dir "$WORK/frozen-ck"
check "own_model export of that checkpoint" "$OWN" export "$WORK/frozen-ck/step-00000002" "$WORK/frozen.safetensors"
check "the exported weights load" "$OWN" --init-from "$WORK/frozen.safetensors" --steps 1 --batch 8 --seq 32
expect_failure "zshard-export names the model it does not have" 2 \
  "trained on model 'bigram', which this binary does not have .*BINARY export" -- \
  "$ZSHARD_BIN/zshard-export" "$WORK/frozen-ck/step-00000002" "$WORK/other.safetensors"
check "it learns at np 2" "${MPIRUN[@]}" -np 2 "$OWN" --strategy zero3 --steps 100 --batch 8 --seq 32 --lr 0.01
cp "$WORK/out" "$WORK/learn.out"
check "its loss falls by half" python3 -c "
import re, sys
loss = re.search(r'loss ([0-9.]+) -> ([0-9.]+)', open('$WORK/learn.out').read())
sys.exit(not (loss and float(loss.group(2)) < 0.5 * float(loss.group(1))))"
check "checkpoint and memory report at np 2" "${MPIRUN[@]}" -np 2 "$OWN" --strategy zero3 --steps 10 --batch 8 \
  --seq 32 --save-dir "$WORK/ck" --mem-report "$WORK/m.json"
check "memory report" python3 -c "import json; r = json.load(open('$WORK/m.json')); assert r['ranks']"
check "resume latest at np 3" "${MPIRUN[@]}" -np 3 "$OWN" --strategy zero2 --steps 15 --batch 8 --seq 32 \
  --save-dir "$WORK/ck" --resume latest
cp "$WORK/out" "$WORK/resume.out"
check "resumed from step 10" grep -q "resumed from .*step-00000010 at step 10" "$WORK/resume.out"
check "manifest names the model" grep -q '"name": "bigram"' "$WORK/ck/step-00000015/manifest.json"
# At np 3 and seq 16 the shards are uneven and the activations small beside the states: the estimate of
# the peak is the model's own (keeps_gradients_open) more than the activations'.
check "own_model bench at np 3" "${MPIRUN[@]}" -np 3 "$OWN" bench --steps 2 --warmup-steps 1 --batch 6 --seq 16 \
  --json "$WORK/bench.json"
check "bench JSON" python3 -c "
import json
d = json.load(open('$WORK/bench.json'))
assert d['model']['name'] == 'bigram' and [r['strategy'] for r in d['results']] == ['ddp', 'zero1', 'zero2', 'zero3']"
check "own_model mem" "$OWN" mem --world 1,2,4 --strategy ddp,zero3 --json "$WORK/mem.json"
check "mem JSON" python3 -c "
import json
d = json.load(open('$WORK/mem.json'))
assert d['model'] == 'bigram' and len(d['rows']) == 6"
expect_failure "own model refuses recomputation" 2 "--activation-checkpointing blocks: this model does not" -- \
  "$OWN" --activation-checkpointing blocks --steps 1
# Its attention is its own: auto leaves it be (the runs above), fused is refused in one line on every rank.
expect_failure "own model refuses fused attention" 2 "--attention fused: this model has no fused attention" -- \
  "${MPIRUN[@]}" -np 2 "$OWN" --attention fused --steps 1
expect_one_line "own model refuses fused attention" "--attention fused"
check "own_model mem --check on its bench" "$OWN" mem --check "$WORK/bench.json"
expect_failure "zshard-mem --check names the model it does not have" 2 \
  "benchmarked model 'bigram', which this binary does not have .*BINARY mem --check" -- \
  "$ZSHARD_BIN/zshard-mem" --check "$WORK/bench.json"
# Its tune mode times candidates with its own bench mode (zshard-bench has no bigram), without checkpointing
# (the model cannot recompute), and prints its own command line.
check "own_model tune at np 2" "$OWN" tune --np 2 --global-batch 8 --seq 32 --mem-budget 1GB --strategies ddp,zero2 \
  --grad-accum 1 --offload none --rank-batches even --top 1 --steps 2 --time-budget 100 --launcher "${MPIRUN[*]}" \
  --json "$WORK/tune.json"
check "tune JSON" python3 -c "
import json
d = json.load(open('$WORK/tune.json'))
assert d['model']['name'] == 'bigram' and len(d['candidates']) == 2, d['candidates']
assert d['winner']['command'].split(' -np 2 ')[1].startswith('$OWN --model bigram --seq 32 --strategy '), d['winner']"
expect_failure "own model tune refuses recomputation" 2 "--activation-checkpointing blocks: the model cannot recompute" -- \
  "$OWN" tune --np 2 --global-batch 8 --activation-checkpointing blocks
finish
