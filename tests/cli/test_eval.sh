# --eval-every: held-out losses printed and logged after every Nth step and after the last, the same on
# zero3 over 2 ranks as in one process, and on a step cut into other micro-batches; its flags refused alone or with bad values, in one line, on every
# rank.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/checkpoint_lib.sh"

EVAL=(--batch 4 --seq 32 --steps 5 --log-every 1000 --eval-data default --eval-every 2 --eval-batches 2)
expect_ok "eval single process" "$TRAIN" "${EVAL[@]}" --log-json "$WORK/single.json"
expect_true "eval lines after steps 2, 4 and 5" \
  test "$(grep -c "^step [245]: eval loss [0-9.]*$" "$WORK/out")" = 3
expect_ok "eval zero3 np 2" "${MPIRUN[@]}" -np 2 "$TRAIN" "${EVAL[@]}" --strategy zero3 --log-json "$WORK/zero3.json"
expect_true "eval losses logged at steps 2, 4 and 5, zero3 equal to one process (1e-5)" python3 -c "
import json
def evals(path):
    return {r['step']: r['eval_loss'] for r in map(json.loads, open(path)) if 'eval_loss' in r}
single, zero3 = evals('$WORK/single.json'), evals('$WORK/zero3.json')
assert sorted(single) == [2, 4, 5] and sorted(zero3) == [2, 4, 5], (single, zero3)
assert all(abs(zero3[s] - single[s]) <= 1e-5 * single[s] for s in single), (single, zero3)
assert single[5] < single[2], single"

# A step cut into other micro-batches evaluates the same tokens: --batch 8 against --batch 4 --grad-accum 2,
# whose training matches (the same step), and so must the held-out loss.
head -c 600 "$(dirname "$0")/../../README.md" >"$WORK/short.txt"
ONE_STEP=(--seq 32 --steps 1 --eval-data default --eval-every 1 --eval-batches 2)
expect_ok "eval at batch 8" "$TRAIN" "${ONE_STEP[@]}" --batch 8 --log-json "$WORK/b8.json"
expect_ok "eval at batch 4 x grad-accum 2" "$TRAIN" "${ONE_STEP[@]}" --batch 4 --grad-accum 2 --log-json "$WORK/b4x2.json"
expect_true "the same eval loss (1e-6)" python3 -c "
import json
a, b = (json.loads(open(p).readline())['eval_loss'] for p in ('$WORK/b8.json', '$WORK/b4x2.json'))
assert abs(a - b) <= 1e-6 * a, (a, b)"
expect_every_rank_fails "eval data shorter than its batches of several micro-steps" 2 \
  "error: --eval-data file .*short.txt: has 600 tokens, fewer than the 769 that --eval-batches 3 of 4x32 x grad-accum 2 reads" \
  -- --batch 4 --grad-accum 2 --seq 32 --eval-every 2 --eval-data "$WORK/short.txt" --eval-batches 3

expect_every_rank_fails "missing eval data" 2 "error: --eval-data .*no/such/eval.bin: no such file$" -- \
  "${ARGS[@]}" --eval-every 2 --eval-data "$WORK/no/such/eval.bin"
expect_every_rank_fails "eval data a directory" 2 "error: --eval-data .*: is a directory" -- \
  "${ARGS[@]}" --eval-every 2 --eval-data "$WORK"
mkfifo "$WORK/fifo"
expect_every_rank_fails "eval data a FIFO (was a hang before any collective)" 2 \
  "error: --eval-data .*fifo: is a FIFO \(named pipe\)" -- "${ARGS[@]}" --eval-every 2 --eval-data "$WORK/fifo"
expect_every_rank_fails "eval data alone" 2 "--eval-data is only for --eval-every" -- \
  "${ARGS[@]}" --eval-data default
expect_every_rank_fails "eval every without data" 2 "--eval-every needs --eval-data" -- "${ARGS[@]}" --eval-every 2
expect_every_rank_fails "eval batches 0" 2 "--eval-batches must be >= 1, got 0" -- \
  "${ARGS[@]}" --eval-every 2 --eval-data default --eval-batches 0
expect_every_rank_fails "eval data shorter than its batches" 2 \
  "error: --eval-data file .*short.txt: has 600 tokens, fewer than the 1025 that --eval-batches 4 of 8x32 reads; it would read some twice$" \
  -- "${ARGS[@]}" --eval-every 2 --eval-data "$WORK/short.txt"
# Training data wraps at its end, and within one step a token read twice weighs double: said, once.
expect_ok "training data shorter than one step" "$TRAIN" --seq 32 --steps 2 --data "$WORK/short.txt" --batch 16 \
  --grad-accum 2
expect_true "... with a warning" test "$(grep -c "^zshard-train: warning: --data file .*short.txt holds 600 tokens, fewer than the 1025 of one step: each step reads some twice$" "$WORK/err")" = 1
expect_failure "bench refuses eval" 2 "--eval-every" -- "$ZSHARD_BIN/zshard-bench" --eval-every 2
finish
