# --rank-batches auto from the command line: bad input fails on every rank in one line; a run whose rank 1
# reports 4x its compute time (the ZSHARD_TEST_SLOW_RANK hook) re-splits, prints and logs the split and
# equals the single process; a checkpoint keeps the split and the resume continues with it.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/checkpoint_lib.sh"

expect_every_rank_fails "auto with sizes" 2 "--rank-batches auto takes no sizes beside it" -- \
  "${ARGS[@]}" --rank-batches auto,2
expect_every_rank_fails "auto twice" 2 "--rank-batches: auto is given twice" -- "${ARGS[@]}" --rank-batches auto,auto
expect_every_rank_fails "auto batch below world" 2 "--batch 1 is smaller than the world size 2" -- \
  --batch 1 --rank-batches auto
expect_every_rank_fails "negative rebalance" 2 "--rebalance-every must be >= 0" -- \
  "${ARGS[@]}" --rank-batches auto --rebalance-every -1
expect_every_rank_fails "rebalance without auto" 2 "--rebalance-every is only for --rank-batches auto" -- \
  "${ARGS[@]}" --rebalance-every 2
TRAIN="$ZSHARD_BIN/zshard-bench" expect_every_rank_fails "bench rebalance without auto" 2 \
  "--rebalance-every is only for the auto split" -- --strategies ddp --rank-batches even --rebalance-every 2
expect_every_rank_fails "max rank batch 0" 2 "--max-rank-batch must be >= 1, got 0" -- \
  "${ARGS[@]}" --rank-batches auto --max-rank-batch 0
expect_every_rank_fails "not a size" 2 "--rank-batches: expected integers or 'auto', got 'fast'" -- \
  "${ARGS[@]}" --rank-batches fast

RUN=(--batch 12 --seq 32 --steps 8 --log-every 1000 --eps 1e-6)
expect_ok "single process" "$TRAIN" "${RUN[@]}" --log-json "$WORK/single.json"
ZSHARD_TEST_SLOW_RANK=1:4 expect_ok "auto np 3" "${MPIRUN[@]}" -np 3 -x ZSHARD_TEST_SLOW_RANK "$TRAIN" "${RUN[@]}" \
  --rank-batches auto --rebalance-every 2 --log-json "$WORK/auto.json" --save-dir "$WORK/ckpt" --save-every 4
grep -Eq "^step 2: rank batches [0-9]+,[0-9]+,[0-9]+ \(measured seq/s " "$WORK/out" ||
  { echo "FAIL auto np 3: no re-split line"; cat "$WORK/out"; failures=$((failures + 1)); }
ZSHARD_TEST_SLOW_RANK=1:4 expect_ok "auto resume" "${MPIRUN[@]}" -np 3 -x ZSHARD_TEST_SLOW_RANK "$TRAIN" "${RUN[@]}" \
  --rank-batches auto --rebalance-every 2 --log-json "$WORK/resumed.json" --resume "$WORK/ckpt/step-00000004"
expect_ok "losses and splits" python3 -c "
import json
def steps(name): return [json.loads(l) for l in open('$WORK/' + name)]
single, auto, resumed = steps('single.json'), steps('auto.json'), steps('resumed.json')
for s, a in zip(single, auto):
    assert abs(a['loss'] - s['loss']) <= 1e-5 * abs(s['loss']), (s['step'], a['loss'], s['loss'])
splits = [a['rank_batches'] for a in auto]
assert splits[0] == [4, 4, 4] and splits[-1][1] < splits[-1][0] and all(sum(x) == 12 for x in splits), splits
saved = json.load(open('$WORK/ckpt/step-00000004/manifest.json'))['run']['rank_batches']
assert saved == splits[4] and resumed[0]['rank_batches'] == saved, (saved, splits, resumed[0])
for a, r in zip(auto[4:], resumed):
    assert abs(a['loss'] - r['loss']) <= 1e-5 * abs(a['loss']), (a['step'], a['loss'], r['loss'])
"
finish
