# shellcheck shell=bash
# scripts/gpu_compare.py, the verdicts of the GPU plan's steps, where a GPU is not needed to check them:
# GoogleTest's own JSON reports (a passing binary, the CUDA op tests that skip without a GPU, a report
# with a failure) and zshard-train's --log-json losses against a tolerance, absolute and relative
# to what bf16 changes, and a resumed run's against the same steps of the run it continues.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/checkpoint_lib.sh"
COMPARE=(python3 "$ZSHARD_SRC/scripts/gpu_compare.py")

# verdict NAME PASS|FAIL ARGS...: gpu_compare.py's exit status is its verdict (0 pass, 1 fail), given
# cleanly (nothing on stderr: a traceback also exits 1); its JSON line is left in $WORK/out.
verdict() {
  local name=$1 want=$2 rc
  shift 2
  "${COMPARE[@]}" "$@" >"$WORK/out" 2>"$WORK/err"
  rc=$?
  if [ -s "$WORK/err" ] || { [ "$want" = PASS ] && [ $rc != 0 ]; } || { [ "$want" = FAIL ] && [ $rc != 1 ]; }; then
    echo "FAIL $name: exit $rc, want $want"
    cat "$WORK/err"
    failures=$((failures + 1))
  else
    echo "ok   $name"
  fi
}

"$ZSHARD_BIN/tests/test_causal_blocks" --gtest_output=json:"$WORK/pass.json" >/dev/null
verdict "a passing report" PASS gtest "$WORK/pass.json"
expect_true "its tests counted, none failed or skipped" python3 -c "
import json, sys; r = json.load(open(sys.argv[1]))
assert r['tests'] > 0 and not r['failed'] and not r['skipped'], r" "$WORK/out"

# Here, without a GPU, the CUDA op tests skip (every one, or the single one of a build without CUDA):
# not a pass.
"$ZSHARD_BIN/tests/test_cuda_ops" --gtest_output=json:"$WORK/skip.json" >/dev/null
verdict "a report whose tests skipped" FAIL gtest "$WORK/pass.json" "$WORK/skip.json"
expect_true "the skipped tests named" python3 -c "
import json, sys; r = json.load(open(sys.argv[1]))
assert r['skipped'] and all(n.startswith('CudaOps.') for n in r['skipped']) and not r['failed'], r" "$WORK/out"

python3 - "$WORK/pass.json" "$WORK/fail.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
doc["testsuites"][0]["testsuite"][0]["failures"] = [{"failure": "expected 1, got 2"}]
json.dump(doc, open(sys.argv[2], "w"))
PY
verdict "a report with a failure" FAIL gtest "$WORK/fail.json"
expect_true "the failed test named" python3 -c "
import json, sys; r = json.load(open(sys.argv[1]))
assert len(r['failed']) == 1 and not r['skipped'], r" "$WORK/out"

# Losses: 4 steps of tiny in fp32 and bf16, and an fp32 run altered by 1e-3 at its last step.
for dtype in fp32 bf16; do
  "$TRAIN" --model tiny --steps 4 --log-every 1 --param-dtype $dtype --log-json "$WORK/$dtype.jsonl" >/dev/null 2>&1
done
python3 - "$WORK/fp32.jsonl" "$WORK/off.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows[-1]["loss"] *= 1.001
open(sys.argv[2], "w").writelines(json.dumps(r) + "\n" for r in rows)
PY
verdict "the same run within 1e-4" PASS losses "$WORK/fp32.jsonl" "$WORK/fp32.jsonl" 1e-4
verdict "a loss 1e-3 off, against 1e-4" FAIL losses "$WORK/off.jsonl" "$WORK/fp32.jsonl" 1e-4
expect_true "the difference reported" python3 -c "
import json, sys; r = json.load(open(sys.argv[1]))
assert abs(r['max_rel_diff'] - 1e-3) < 1e-9 and r['steps'] == 4 and r['tol'] == 1e-4, r" "$WORK/out"
# bf16 against fp32 is its own effect: within twice of it, not within half.
verdict "bf16 within twice what bf16 changes" PASS within-effect "$WORK/bf16.jsonl" "$WORK/fp32.jsonl" \
  "$WORK/fp32.jsonl" "$WORK/bf16.jsonl" 2
verdict "bf16 not within half of it" FAIL within-effect "$WORK/bf16.jsonl" \
  "$WORK/fp32.jsonl" "$WORK/fp32.jsonl" "$WORK/bf16.jsonl" 0.5
head -2 "$WORK/fp32.jsonl" >"$WORK/short.jsonl"
verdict "runs of different lengths" FAIL losses "$WORK/short.jsonl" "$WORK/fp32.jsonl" 1
# A run resumed from the step-2 save of a run like fp32.jsonl: its steps 3 and 4 against the same steps.
"$TRAIN" --model tiny --steps 4 --log-every 1 --save-dir "$WORK/saves" --save-every 2 >/dev/null 2>&1
"$TRAIN" --model tiny --steps 4 --log-every 1 --resume "$WORK/saves/step-00000002" --log-json "$WORK/resumed.jsonl" \
  >/dev/null 2>&1
verdict "a resumed run against the same steps" PASS resumed "$WORK/resumed.jsonl" "$WORK/fp32.jsonl" 0
expect_true "the steps compared reported" python3 -c "
import json, sys; r = json.load(open(sys.argv[1]))
assert r['steps'] == 2 and r['from_step'] == 3 and r['max_rel_diff'] == 0, r" "$WORK/out"
tail -2 "$WORK/off.jsonl" >"$WORK/resumed-off.jsonl"
verdict "a resumed run a loss 1e-3 off, against 1e-4" FAIL resumed "$WORK/resumed-off.jsonl" "$WORK/fp32.jsonl" 1e-4
verdict "a resumed run that ends before the full run" FAIL resumed "$WORK/short.jsonl" "$WORK/fp32.jsonl" 1
finish
