# examples/own_loop, a training loop of its own around the engine, built against `cmake --install` output
# alone: under mpirun at np 1-4 with ddp, zero2, zero3 and hybrid its losses equal zshard-train's on the
# same model, data and schedule to 1e-6; it saves, and resumes at another world size, continuing the
# uninterrupted run's losses. Bad options end it with one line.
# zshard-test-seconds: 26
source "$(dirname "$0")/lib.sh"
cmake --install "$ZSHARD_BIN" --prefix "$WORK/prefix" >/dev/null || { echo "FAIL install"; exit 1; }
cmake -S "$ZSHARD_SRC/examples/own_loop" -B "$WORK/example" -DCMAKE_PREFIX_PATH="$WORK/prefix" >"$WORK/log" 2>&1 \
  && cmake --build "$WORK/example" >"$WORK/log" 2>&1 || { cat "$WORK/log"; echo "FAIL build"; exit 1; }
LOOP="$WORK/example/own_loop"
DATA="$ZSHARD_SRC/models/data/default_corpus.txt"

# Its options are checked as zshard's own tools check theirs: one line, exit code 2.
expect_failure "own loop, a misspelt option" 2 "^own_loop: error: --stpes: unknown option$" -- "$LOOP" --stpes 2 --data "$DATA"
expect_failure "own loop, a number that is not one" 2 "^own_loop: error: --steps: 'abc' is not an integer >= 0$" -- \
  "$LOOP" --steps abc --data "$DATA"
: >"$WORK/empty.txt"
expect_failure "own loop, empty data (was SIGFPE)" 2 "^own_loop: error: --data: '$WORK/empty.txt' is empty$" -- \
  "$LOOP" --data "$WORK/empty.txt"
STEPS=12
FLAGS=(--batch 8 --seq 32 --lr 0.003 --warmup 3)

# The reference: zshard-train on one process, the same model (tiny), data (the file's bytes) and schedule
# (linear warmup, cosine to 0), its losses from --log-json.
"$TRAIN" --model tiny --data "$DATA" --steps $STEPS "${FLAGS[@]}" --lr-schedule cosine --log-json "$WORK/ref.json" \
  --log-every 100 >/dev/null || { echo "FAIL the zshard-train reference run"; exit 1; }
python3 -c "
import json
print('\n'.join(repr(json.loads(l)['loss']) for l in open('$WORK/ref.json')))" >"$WORK/ref.losses"

compare() {  # compare NAME FILE: FILE's 'step N loss X' lines against the reference from step $3 on
  local name=$1 file=$2 from=${3:-1}
  if python3 - "$WORK/ref.losses" "$file" "$from" <<'PY'; then echo "ok   $name"; else echo "FAIL $name"; failures=$((failures + 1)); fi
import sys
ref = [float(x) for x in open(sys.argv[1])]
got = {int(l.split()[1]): float(l.split()[3]) for l in open(sys.argv[2]) if l.startswith("step ")}
first = int(sys.argv[3])
want = {s: ref[s - 1] for s in range(first, len(ref) + 1)}
if sorted(got) != sorted(want):
    sys.exit(print("  steps", sorted(got), "want", sorted(want)))
worst = max(abs(got[s] - want[s]) / abs(want[s]) for s in want)
print("  max relative loss difference %.2e" % worst)
sys.exit(worst > 1e-6)
PY
}

for np in 1 2 3 4; do
  for strategy in ddp zero2 zero3 hybrid; do
    if "${MPIRUN[@]}" -np $np "$LOOP" --strategy $strategy --data "$DATA" --steps $STEPS "${FLAGS[@]}" \
        >"$WORK/out" 2>"$WORK/err"; then
      compare "own loop, $strategy at np $np, equals zshard-train" "$WORK/out"
    else echo "FAIL own loop, $strategy at np $np"; cat "$WORK/err"; failures=$((failures + 1)); fi
  done
done

# Stop and save after half the steps on 2 ranks (zero3), resume on 3 (zero2): the rest equals the
# uninterrupted run.
"${MPIRUN[@]}" -np 2 "$LOOP" --strategy zero3 --data "$DATA" --steps $STEPS --stop-after $((STEPS / 2)) \
  "${FLAGS[@]}" --save "$WORK/ck" >"$WORK/out" 2>"$WORK/err" || { cat "$WORK/err"; echo "FAIL save"; failures=$((failures + 1)); }
if [ -f "$WORK/ck/manifest.json" ]; then echo "ok   saved a committed checkpoint"; else
  echo "FAIL no manifest in $WORK/ck"; failures=$((failures + 1)); fi
expect_failure "own loop, --save into a checkpoint (refused before training, not after)" 2 \
  "^own_loop: error: --save: '$WORK/ck' holds a checkpoint already$" -- "$LOOP" --data "$DATA" --save "$WORK/ck"
if "${MPIRUN[@]}" -np 3 "$LOOP" --strategy zero2 --data "$DATA" --steps $STEPS "${FLAGS[@]}" --resume "$WORK/ck" \
    >"$WORK/out" 2>"$WORK/err"; then
  compare "resumed on 3 ranks from 2's checkpoint, equals zshard-train" "$WORK/out" $((STEPS / 2 + 1))
else cat "$WORK/err"; echo "FAIL resume"; failures=$((failures + 1)); fi
finish
