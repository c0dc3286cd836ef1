# shellcheck shell=bash
# benchmarks/kernel_profile.py, the GPU plan's profile summary, on a hand-made Nsight Compute CSV: the
# program's own output before the header is skipped, durations in any of ncu's units add up, kernels fall
# into their kinds, the busy share comes from --step-ms, --from leaves out the set-up before a step's
# first kernel, zshard's own kernels are named costliest first;
# a file with no ncu table or an unknown unit is refused with the reason.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/checkpoint_lib.sh"
PROFILE=(python3 "$ZSHARD_SRC/benchmarks/kernel_profile.py")

header='"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"'
row() {  # ID NAME GRID UNIT VALUE
  printf '"%s","1","zshard-bench","h","%s","1","7","(256, 1, 1)","%s","0","9.0","Command line profiler metrics","gpu__time_duration.sum","%s","%s"\n' "$@"
}
{
  echo "==PROF== Connected to process 1"
  echo "ddp even: median 25.0 ms"
  echo "$header"
  row 0 "nvjet_sm90_tst_192x128_64x5_1x2_h_bz_coopB_NNT" "(2, 66, 1)" us "3,000"
  row 1 "void zshard::<unnamed>::causal_softmax_kernel<__nv_bfloat16, 8>(T1 *, int, int)" "(12288, 1, 1)" ns "1,500,000"
  row 2 "void zshard::<unnamed>::causal_softmax_kernel<__nv_bfloat16, 8>(T1 *, int, int)" "(12288, 1, 1)" ms "0.5"
  row 3 "void zshard::<unnamed>::layernorm_dinp_kernel<__nv_bfloat16, 8>(T1 *, const T1 *)" "(1024, 1, 1)" us "1000"
} >"$WORK/ncu.csv"

expect_ok "a profile of 4 kernels" "${PROFILE[@]}" "$WORK/ncu.csv" --step-ms 8 --json "$WORK/profile.json"
cp "$WORK/out" "$WORK/summary"
expect_true "the device time adds up across units, and the busy share of an 8 ms step" \
  grep -q "^4 kernels, 6.00 ms of device time; per step 6.00 ms of a 8.00 ms step: the GPU busy 75%" "$WORK/summary"
expect_true "kinds, costliest first, with their shares" python3 - "$WORK/summary" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
kinds = re.findall(r"^(matmul \(cuBLAS\)|attention softmax|norms)\s+(\d+)\s+([\d.]+)\s+([\d.]+)%", text, re.M)
assert kinds == [("matmul (cuBLAS)", "1", "3.00", "50.0"), ("attention softmax", "2", "2.00", "33.3"),
                 ("norms", "1", "1.00", "16.7")], kinds
PY
expect_true "the JSON names zshard's own kernels, costliest first" python3 - "$WORK/profile.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
assert doc["own_kernels"] == ["causal_softmax_kernel", "layernorm_dinp_kernel"], doc["own_kernels"]
assert abs(doc["device_ms"] - 6.0) < 1e-9 and doc["step_ms"] == 8.0, doc
assert doc["kinds"]["attention softmax"]["kernels"] == 2, doc["kinds"]
PY

expect_ok "from the step's first kernel" "${PROFILE[@]}" "$WORK/ncu.csv" --from causal_softmax --step-ms 8
expect_true "the set-up before it is left out" \
  grep -q "^3 kernels, 3.00 ms of device time; per step 3.00 ms of a 8.00 ms step: the GPU busy 38%" "$WORK/out"
expect_failure "a --from that matches nothing" nonzero "no kernel matches --from 'embedding'" -- \
  "${PROFILE[@]}" "$WORK/ncu.csv" --from embedding

echo "no table here" >"$WORK/empty.csv"
expect_failure "a file without ncu's table" nonzero "empty.csv: no ncu CSV header" -- "${PROFILE[@]}" "$WORK/empty.csv"
{ echo "$header"; row 0 "k" "(1, 1, 1)" fortnight 1; } >"$WORK/odd.csv"
expect_failure "an unknown time unit" nonzero "odd.csv: unknown time unit 'fortnight'" -- "${PROFILE[@]}" "$WORK/odd.csv"
finish
