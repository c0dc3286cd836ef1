# examples/own_loop, a training loop of its own around the engine, built against `cmake --install` output
# alone: under mpirun at np 1-4 with ddp, zero2, zero3 and hybrid its losses equal zshard-train's on the
# same model, data and schedule to 1e-6, on any bytes (UTF-8 text too), and from weights zshard-train
# wrote (Hugging Face's names, with or without their prefix); it saves in the background, waiting for a
# slow writer, and resumes at another world size, continuing the uninterrupted run's losses, or says there
# is nothing to train. Bad options and files end it with one line.
# zshard-test-seconds: 40
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
mkfifo "$WORK/data.fifo"
expect_failure "own loop, a directory as --data (was an uncaught std::ios_base::failure)" 2 \
  "^own_loop: error: --data: '$WORK' is not a regular file$" -- "$LOOP" --data "$WORK"
expect_failure "own loop, a FIFO as --data (was a hang)" 2 \
  "^own_loop: error: --data: '$WORK/data.fifo' is not a regular file$" -- "$LOOP" --data "$WORK/data.fifo"
expect_failure "own loop, a directory as --init-from" 2 \
  "^own_loop: error: --init-from: '$WORK' is not a regular file$" -- "$LOOP" --data "$DATA" --init-from "$WORK"
expect_failure "own loop, --batch 2 on 3 ranks (was 'B=0' deep in the model)" 2 \
  "^own_loop: error: --batch 2 is smaller than the world size 3: every rank needs at least one sequence$" -- \
  "${MPIRUN[@]}" -np 3 "$LOOP" --data "$DATA" --batch 2
expect_one_line "own loop, --batch 2 on 3 ranks" "--batch 2"
STEPS=12
FLAGS=(--batch 8 --seq 32 --lr 0.003 --warmup 3)

# A reference: zshard-train on one process, the same model (tiny), data (the file's bytes) and schedule
# (linear warmup, cosine to 0), its losses from --log-json. reference NAME ARGS...: into $WORK/NAME.losses.
reference() {
  local name=$1
  shift
  "$TRAIN" --model tiny --steps $STEPS "${FLAGS[@]}" --lr-schedule cosine --log-json "$WORK/$name.json" \
    --log-every 100 "$@" >/dev/null || { echo "FAIL the zshard-train reference run $name"; exit 1; }
  python3 -c "
import json
print('\n'.join(repr(json.loads(l)['loss']) for l in open('$WORK/$name.json')))" >"$WORK/$name.losses"
}
reference ref --data "$DATA"

compare() {  # compare NAME FILE [FROM [REF]]: FILE's 'step N loss X' lines against REF's from step FROM on
  local name=$1 file=$2 from=${3:-1} ref=${4:-ref}
  if python3 - "$WORK/$ref.losses" "$file" "$from" <<'PY'; then echo "ok   $name"; else echo "FAIL $name"; failures=$((failures + 1)); fi
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

# Bytes above 127 (UTF-8 text) are tokens 128..255, as zshard-train reads them: they ended deep in the model
# as negative tokens outside the vocabulary.
{ printf 'caf\xc3\xa9, na\xc3\xafve \xe2\x80\x94 \xc3\xbcber \xe2\x82\xac\n%.0s' {1..40}; cat "$DATA"; } >"$WORK/utf8.txt"
reference utf8 --data "$WORK/utf8.txt"
if "${MPIRUN[@]}" -np 2 "$LOOP" --strategy zero3 --data "$WORK/utf8.txt" --steps $STEPS "${FLAGS[@]}" \
    >"$WORK/out" 2>"$WORK/err"; then
  compare "own loop on UTF-8 text, zero3 at np 2, equals zshard-train" "$WORK/out" 1 utf8
else echo "FAIL own loop on UTF-8 text"; cat "$WORK/err"; failures=$((failures + 1)); fi

# Weights written by zshard-train --save (the model's Hugging Face names) start both loops alike, also with
# the "transformer." prefix of a GPT2LMHeadModel file.
"$TRAIN" --model tiny --data "$DATA" --steps 3 "${FLAGS[@]}" --save "$WORK/w.safetensors" >/dev/null ||
  { echo "FAIL zshard-train --save"; exit 1; }
python3 - "$WORK/w.safetensors" "$WORK/hf.safetensors" <<'PY'
import json, struct, sys
data = open(sys.argv[1], 'rb').read()
n = struct.unpack('<Q', data[:8])[0]
header = {k if k == '__metadata__' else 'transformer.' + k: v for k, v in json.loads(data[8:8 + n]).items()}
text = json.dumps(header).encode()
text += b' ' * (-len(text) % 8)
open(sys.argv[2], 'wb').write(struct.pack('<Q', len(text)) + text + data[8 + n:])
PY
reference init --data "$DATA" --init-from "$WORK/w.safetensors"
for weights in w hf; do
  if "${MPIRUN[@]}" -np 2 "$LOOP" --strategy zero3 --data "$DATA" --steps $STEPS "${FLAGS[@]}" \
      --init-from "$WORK/$weights.safetensors" >"$WORK/out" 2>"$WORK/err"; then
    compare "own loop --init-from $weights.safetensors, zero3 at np 2, equals zshard-train --init-from" "$WORK/out" 1 init
  else echo "FAIL own loop --init-from $weights.safetensors"; cat "$WORK/err"; failures=$((failures + 1)); fi
done

# Stop and save after half the steps on 2 ranks (zero3), resume on 3 (zero2): the rest equals the
# uninterrupted run. The save is written in the background, its writers held 2 s: the loop waits for them.
ZSHARD_TEST_SLOW_WRITER=2000 "${MPIRUN[@]}" -np 2 "$LOOP" --strategy zero3 --data "$DATA" --steps $STEPS \
  --stop-after $((STEPS / 2)) "${FLAGS[@]}" --save "$WORK/ck" >"$WORK/out" 2>"$WORK/err" ||
  { cat "$WORK/err"; echo "FAIL save"; failures=$((failures + 1)); }
if [ -f "$WORK/ck/manifest.json" ]; then echo "ok   saved a committed checkpoint"; else
  echo "FAIL no manifest in $WORK/ck"; failures=$((failures + 1)); fi
expect_failure "own loop, --save into a checkpoint (refused before training, not after)" 2 \
  "^own_loop: error: --save: '$WORK/ck' holds a checkpoint already$" -- "$LOOP" --data "$DATA" --save "$WORK/ck"
if "${MPIRUN[@]}" -np 3 "$LOOP" --strategy zero2 --data "$DATA" --steps $STEPS "${FLAGS[@]}" --resume "$WORK/ck" \
    >"$WORK/out" 2>"$WORK/err"; then
  compare "resumed on 3 ranks from 2's checkpoint, equals zshard-train" "$WORK/out" $((STEPS / 2 + 1))
else cat "$WORK/err"; echo "FAIL resume"; failures=$((failures + 1)); fi
# A checkpoint at or past the last step leaves nothing to train: said in one line, exit 0 (as zshard-train).
for steps in $((STEPS / 2)) 2; do
  if "$LOOP" --data "$DATA" --steps $steps "${FLAGS[@]}" --resume "$WORK/ck" >"$WORK/out" 2>"$WORK/err" &&
    grep -qx "own_loop: $WORK/ck is at step $((STEPS / 2)), the last is $steps: nothing to train" "$WORK/out" &&
    ! grep -q '^step ' "$WORK/out"; then echo "ok   resumed at step $((STEPS / 2)) with --steps $steps: nothing to train"
  else echo "FAIL resumed at step $((STEPS / 2)) with --steps $steps:"; cat "$WORK/out" "$WORK/err"; failures=$((failures + 1)); fi
done
finish
