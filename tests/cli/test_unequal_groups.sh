# shellcheck shell=bash
# Hybrid sharding over groups of unequal sizes on one host (--shard-group 4,2: a node of 4 beside a node
# of 2): the single process's losses, each rank's model states as predicted for its own group, and
# checkpoints that move between unequal groups and a plain strategy on another world, both ways; the
# banner names the groups, and says when the default ones (a prime world on one host) shard nothing.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/checkpoint_lib.sh"
ARGS=(--steps 6 --batch 12 --seq 32 --log-every 1000)
NP6=("${MPIRUN[@]}" -np 6 -x OPENBLAS_NUM_THREADS=1)

for model in tiny llama-tiny; do
  expect_ok "$model: one process" "$TRAIN" --model "$model" "${ARGS[@]}" --log-json "$WORK/$model.json"
  expect_ok "$model: hybrid 4,2 np 6" "${NP6[@]}" "$TRAIN" --model "$model" "${ARGS[@]}" --strategy hybrid \
    --shard-group 4,2 --log-json "$WORK/$model-42.json"
  same_losses "$model: hybrid 4,2 has the single process's losses within 1e-5" "$WORK/$model.json" \
    "$WORK/$model-42.json" 1e-5
  expect_true "$model: the report names the groups" grep -q "hybrid, world 6, shard group 4,2," "$WORK/out"
  # Each group's ranks hold a 1/4 or a 1/2 shard, and reduce and gather over 4 or 2 ranks: measured against
  # the prediction for that size.
  for g in 4 2; do
    expect_true "$model: model states of the groups of $g as predicted" \
      grep -Eq "^model states per rank \(shard groups of $g\): .* ratio 1\.000$" "$WORK/out"
  done
  expect_true "$model: a communication line for ranks 0-3 and one for 4, 5" \
    eval 'grep -q "^communication per step per rank (ranks 0-3): " "$WORK/out" &&
          grep -q "^communication per step per rank (ranks 4, 5): " "$WORK/out"'
  expect_true "$model: communication of each as predicted" comm_as_theory
done
expect_true "the banner names hybrid 4,2's groups" grep -q "^zshard-train: hybrid (shard groups 4,2) on 6 rank(s)" \
  "$WORK/out"
# On 3 ranks of one host the default groups are of one: the banner says they shard nothing.
# They run as ddp: with accumulation one reduction a step, not one a micro-step, and no gathered copies.
for s in hybrid ddp; do
  expect_ok "tiny: $s on 3 ranks, --grad-accum 3" "${MPIRUN[@]}" -np 3 "$TRAIN" --steps 2 --batch 6 --seq 32 \
    --grad-accum 3 --strategy "$s"
  grep -E "^([0-9]|step|model states|communication)" "$WORK/out" | sed 's/ *[0-9]* tok\/s.*//' >"$WORK/ones-$s.txt"
  [ "$s" = hybrid ] && cp "$WORK/out" "$WORK/ones-banner.txt"
done
expect_true "... the banner says every rank holds the whole model, run as ddp" grep -q \
  "^zshard-train: hybrid (shard groups of 1: every rank holds the whole model, run as ddp, the default where" \
  "$WORK/ones-banner.txt"
expect_true "... losses, memory and communication per step are ddp's" cmp -s "$WORK/ones-hybrid.txt" "$WORK/ones-ddp.txt"
# The optimizer offloaded: each group's host share measured against its own prediction.
expect_ok "tiny: hybrid 2,1 np 3, optimizer offloaded" "${MPIRUN[@]}" -np 3 "$TRAIN" --steps 2 --batch 6 --seq 32 \
  --strategy hybrid --shard-group 2,1 --offload optimizer
for g in 2 1; do
  expect_true "... the offloaded optimizer of the groups of $g as predicted" \
    grep -Eq "^offloaded optimizer \(host\) \(shard groups of $g\): measured ([0-9.]+) MiB, predicted \1 MiB" "$WORK/out"
done
# Three groups whose pieces nest unevenly (units padded to a multiple of 6), gradient accumulation and
# clipping on.
expect_ok "tiny: hybrid 3,2,1 np 6, grad-accum 2" "${NP6[@]}" "$TRAIN" --model tiny --steps 6 --batch 6 \
  --grad-accum 2 --seq 32 --grad-clip 0.5 --strategy hybrid --shard-group 3,2,1 --log-json "$WORK/321.json"
expect_ok "tiny: one process, grad-accum 2" "$TRAIN" --model tiny --steps 6 --batch 6 --grad-accum 2 --seq 32 \
  --grad-clip 0.5 --log-json "$WORK/accum.json"
same_losses "tiny: hybrid 3,2,1 has the single process's losses within 1e-5" "$WORK/accum.json" \
  "$WORK/321.json" 1e-5

# Checkpoints: saved by the 4,2 hybrid, resumed by zero2 on 3 ranks, and the other way round; also from
# 3,2,1, whose first group's files are padded to a multiple of 6, not 3.
CK="$WORK/ck"
expect_ok "save hybrid 4,2 np 6 at step 3" "${NP6[@]}" "$TRAIN" "${ARGS[@]}" --strategy hybrid --shard-group 4,2 \
  --save-dir "$CK/42" --save-every 3 --log-json "$WORK/42.json"
expect_ok "resume as zero2 np 3" "${MPIRUN[@]}" -np 3 "$TRAIN" "${ARGS[@]}" --strategy zero2 \
  --resume "$CK/42/step-00000003" --log-json "$WORK/42-to-zero2.json"
same_losses "zero2 np 3 after hybrid 4,2: losses within 1e-6" "$WORK/42.json" "$WORK/42-to-zero2.json" 1e-6
expect_true "the resume names the groups it was saved by" \
  grep -q "resumed from .*step-00000003 at step 3 (saved by hybrid on 6 rank(s))" "$WORK/out"
expect_ok "save zero2 np 3 at step 3" "${MPIRUN[@]}" -np 3 "$TRAIN" "${ARGS[@]}" --strategy zero2 \
  --save-dir "$CK/zero2" --save-every 3 --log-json "$WORK/zero2.json"
expect_ok "resume as hybrid 4,2 np 6" "${NP6[@]}" "$TRAIN" "${ARGS[@]}" --strategy hybrid --shard-group 4,2 \
  --resume "$CK/zero2/step-00000003" --log-json "$WORK/zero2-to-42.json"
same_losses "hybrid 4,2 after zero2 np 3: losses within 1e-6" "$WORK/zero2.json" "$WORK/zero2-to-42.json" 1e-6
expect_ok "save hybrid 3,2,1 np 6 at step 3" "${NP6[@]}" "$TRAIN" "${ARGS[@]}" --strategy hybrid \
  --shard-group 3,2,1 --save-dir "$CK/321" --save-every 3 --log-json "$WORK/321-full.json"
expect_true "its manifest records the padding" grep -Eq '"pad_multiple": ?6' "$CK/321/step-00000003/manifest.json"
expect_ok "resume as zero2 np 3" "${MPIRUN[@]}" -np 3 "$TRAIN" "${ARGS[@]}" --strategy zero2 \
  --resume "$CK/321/step-00000003" --log-json "$WORK/321-to-zero2.json"
same_losses "zero2 np 3 after hybrid 3,2,1: losses within 1e-6" "$WORK/321-full.json" "$WORK/321-to-zero2.json" 1e-6

# Bad lists: one line, exit 2 on every rank.
expect_every_rank_fails "a list that does not hold the world" 2 \
  "error: --shard-group 2,1: the groups hold 3 ranks, the world has 2" -- --strategy hybrid --shard-group 2,1
expect_every_rank_fails "a group of no ranks" 2 "zshard-train: error: --shard-group: must be node, a group size >= 0 or a list of sizes >= 1, got '0'" \
  -- --strategy hybrid --shard-group 2,0
expect_every_rank_fails "a list without hybrid" 2 "error: --shard-group is only for --strategy hybrid" -- \
  --strategy zero3 --shard-group 1,1

finish
