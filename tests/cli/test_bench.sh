# Smoke test of the benchmark tools: zshard-bench at np 2 on tiny writes valid JSON with every strategy
# the world allows, zshard-commbench finds no wrong element, zshard-mem prints and checks the bench JSON,
# zshard-project prints its table.
source "$(dirname "$0")/lib.sh"
BIN="$ZSHARD_BIN"

check() {  # check NAME COMMAND...: the command must succeed
  local name=$1
  shift
  if "$@" >"$WORK/out" 2>"$WORK/err"; then echo "ok   $name"; else
    echo "FAIL $name (exit $?)"; cat "$WORK/out" "$WORK/err"; failures=$((failures + 1)); fi
}

check "bench np 2" timeout 120 "${MPIRUN[@]}" -np 2 "$BIN/zshard-bench" --model tiny --warmup-steps 1 --steps 2 \
  --json "$WORK/bench.json"
check "bench JSON" python3 -c "
import json, sys
d = json.load(open('$WORK/bench.json'))
got = [r['strategy'] for r in d['results']]
assert got == ['ddp', 'zero1', 'zero2', 'zero3'], got  # hybrid needs a group between 1 and the world
for r in d['results']:
    assert r['world'] == 2 and r['step_ms']['median'] > 0 and r['tokens_per_s'] > 0
ddp = d['results'][0]['model_states_bytes']
assert ddp['measured'] == ddp['theory'], ddp  # 16 bytes per parameter, nothing sharded
"
check "mem vs bench" "$BIN/zshard-mem" --check "$WORK/bench.json"

check "commbench np 2" timeout 120 "${MPIRUN[@]}" -np 2 "$BIN/zshard-commbench" --max-size 64KiB \
  --round-ms 5 --rounds 1
grep -q "wrong elements: 0" "$WORK/out" || { echo "FAIL commbench: wrong elements"; failures=$((failures + 1)); }

check "mem 7.5e9" "$BIN/zshard-mem" --params 7.5e9 --dtype mixed --world 1,4,16,64,1024
grep -Eq "zero3 +64 +64 +.*1\.88 GB" "$WORK/out" || { echo "FAIL mem: no 1.88 GB row"; cat "$WORK/out"; failures=$((failures + 1)); }
check "project" "$BIN/zshard-project" --compute-ms 100 --params 124000000 --units 14 --max-world 64
grep -Eq "^ +64 " "$WORK/out" || { echo "FAIL project: no N=64 row"; failures=$((failures + 1)); }
expect_failure "mem bad size" 2 "--device-mem" -- "$BIN/zshard-mem" --model gpt2 --device-mem 80furlongs
finish
