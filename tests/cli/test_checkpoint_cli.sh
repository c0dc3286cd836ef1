# Checkpoints through the binaries: --save-every with --keep, resuming on another world size and
# strategy with the uninterrupted run's losses, zshard-export equal to the consolidated --save, and bad
# input: one line naming the file and the problem, a non-zero exit on every rank, nothing modified.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/checkpoint_lib.sh"
CK="$WORK/ck"

expect_ok "save zero3 np 4, every 2 steps, keep 2" "${MPIRUN[@]}" -np 4 "$TRAIN" --strategy zero3 \
  "${ARGS[@]}" --steps 6 --save-dir "$CK" --save-every 2 --keep 2 --log-json "$CK/full.json" \
  --save "$WORK/final.safetensors"
mv "$CK/full.json" "$WORK/full.json"  # written into the --save-dir the run created
expect_ok "outputs in a new --save-dir, named with a trailing slash and two levels deep" "$TRAIN" "${ARGS[@]}" \
  --steps 1 --save-dir "$WORK/new/deep/" --log-json "$WORK/new/deep/log.json"
expect_true "the log is in the directory the run made" test -s "$WORK/new/deep/log.json"
expect_true "keep 2: step 4 and step 6 remain" \
  test "$(ls "$CK")" = "$(printf 'step-00000004\nstep-00000006')" -a -f "$CK/step-00000006/manifest.json"

# ---- a checkpoint --keep drops that cannot be removed (a read-only mount): nothing is lost ----
# Its files go on a background thread; the end of the run waits for it and warns, and a later prune
# fails the run in one line, after its own checkpoint has committed.
RO="$WORK/ro"
expect_ok "a checkpoint at step 2" "$TRAIN" "${ARGS[@]}" --steps 2 --save-dir "$RO" --save-every 2
if mount --bind "$RO/step-00000002" "$RO/step-00000002" 2>"$WORK/mount.err" &&
  mount -o remount,ro,bind "$RO/step-00000002" 2>"$WORK/mount.err"; then
  trap 'umount "$RO/step-00000002" 2>/dev/null; rm -rf "$WORK"' EXIT
  expect_ok "--keep 1 over a read-only checkpoint, to step 4" "$TRAIN" "${ARGS[@]}" --steps 4 --save-dir "$RO" \
    --save-every 2 --keep 1 --resume latest
  expect_true "the end of the run warns, naming it" \
    grep -q "^zshard-train: warning: .*ro/step-00000002: cannot remove (Read-only file system)$" "$WORK/out"
  expect_failure "a prune after the one that failed, at step 8" 1 \
    "^zshard-train: error: .*ro/step-00000002: cannot remove \(Read-only file system\)$" -- \
    "$TRAIN" "${ARGS[@]}" --steps 8 --save-dir "$RO" --save-every 2 --keep 1 --resume latest
  expect_one_line "a prune that failed" "cannot remove"
  expect_true "step 8 committed before the prune failed" test -f "$RO/step-00000008/manifest.json"
  umount "$RO/step-00000002"
else
  echo "skip read-only checkpoint: cannot bind-mount ($(cat "$WORK/mount.err"))"
fi

# ---- a pruned checkpoint's rank files are written over by a later save instead of allocated anew ----
# One rank saves step 2; zero3 on 2 ranks goes on to step 6 with --keep 1. Step 4's prune makes step 2
# the spare directory, and step 6 writes over its larger rank-00000 (cut to length). The result must
# equal a save into fresh files, byte for byte.
RC="$WORK/recycle"
expect_ok "a checkpoint at step 2, one rank" "$TRAIN" "${ARGS[@]}" --steps 2 --save-dir "$RC" --save-every 2
cp -r "$RC" "$WORK/fresh"
exec 9<"$RC/step-00000002/rank-00000.safetensors"  # held open, its inode number cannot be reused
old_inode=$(stat -c %i "$RC/step-00000002/rank-00000.safetensors")
expect_ok "zero3 np 2 to step 6, --keep 1" "${MPIRUN[@]}" -np 2 "$TRAIN" --strategy zero3 "${ARGS[@]}" \
  --steps 6 --save-dir "$RC" --save-every 2 --keep 1 --resume latest
expect_ok "the same, keeping every checkpoint" "${MPIRUN[@]}" -np 2 "$TRAIN" --strategy zero3 "${ARGS[@]}" \
  --steps 6 --save-dir "$WORK/fresh" --save-every 2 --resume latest
expect_true "step 6's rank-00000 is step 2's, written over" \
  test "$(stat -c %i "$RC/step-00000006/rank-00000.safetensors")" = "$old_inode"
exec 9<&-
expect_true "only step 6 remains: the spare directory goes at the end of the run" test "$(ls "$RC")" = step-00000006
for f in rank-00000.safetensors rank-00001.safetensors manifest.json; do
  expect_true "$f equals the one saved into fresh files" cmp -s "$RC/step-00000006/$f" "$WORK/fresh/step-00000006/$f"
done
expect_ok "export verifies the recycled files" "$EXPORT" "$RC/step-00000006" "$WORK/recycled.safetensors"
# A resume at or past --steps trains nothing, and says so rather than ending without a word.
echo '{"step": 1}' >"$WORK/earlier-log.json"
expect_ok "resume at step 6 with --steps 4" "$TRAIN" "${ARGS[@]}" --steps 4 --save-dir "$WORK/fresh" --resume latest \
  --log-json "$WORK/earlier-log.json"
expect_true "... says nothing is left to train" \
  grep -q "^zshard-train: note: the checkpoint is at step 6 and --steps is 4: nothing is left to train" "$WORK/out" "$WORK/err"
expect_true "... and leaves the --log-json it would replace as it was" grep -q '^{"step": 1}$' "$WORK/earlier-log.json"
# Hybrid on 4 ranks: only the first shard group writes. Saves from step 4 on write over the files of the
# save --keep dropped two steps before; resuming one repeats the uninterrupted run bit for bit.
HY="$WORK/hybrid"
expect_ok "hybrid np 4, a save every step, --keep 2" "${MPIRUN[@]}" -np 4 "$TRAIN" --strategy hybrid \
  --shard-group 2 "${ARGS[@]}" --steps 8 --save-dir "$HY" --save-every 1 --keep 2 --log-json "$WORK/hybrid.json"
expect_true "steps 7 and 8 remain, each with the first group's two rank files" \
  test "$(ls "$HY")" = "$(printf 'step-00000007\nstep-00000008')" -a \
  "$(ls "$HY/step-00000007")" = "$(printf 'manifest.json\nrank-00000.safetensors\nrank-00001.safetensors')"
expect_ok "resume the recycled step 7" "${MPIRUN[@]}" -np 4 "$TRAIN" --strategy hybrid --shard-group 2 \
  "${ARGS[@]}" --steps 8 --resume "$HY/step-00000007" --log-json "$WORK/hybrid-resumed.json"
same_losses "step 8 after it: bit-identical" "$WORK/hybrid.json" "$WORK/hybrid-resumed.json" 0

expect_ok "resume zero3 np 4" "${MPIRUN[@]}" -np 4 "$TRAIN" --strategy zero3 "${ARGS[@]}" --steps 6 \
  --resume "$CK/step-00000004" --log-json "$WORK/same.json"
same_losses "same world and strategy: bit-identical losses" "$WORK/full.json" "$WORK/same.json" 0
expect_ok "resume as ddp np 2" "${MPIRUN[@]}" -np 2 "$TRAIN" --strategy ddp "${ARGS[@]}" --steps 6 \
  --resume "$CK/step-00000004" --log-json "$WORK/ddp.json"
same_losses "ddp np 2 after zero3 np 4: losses within 1e-6" "$WORK/full.json" "$WORK/ddp.json" 1e-6
expect_true "the resume says what it loaded" \
  grep -q "resumed from .*step-00000004 at step 4 (saved by zero3 on 4 rank(s))" "$WORK/out"

expect_ok "export" "$EXPORT" "$CK/step-00000006" "$WORK/exported.safetensors"
expect_true "export equals the consolidated --save, byte for byte" \
  cmp -s "$WORK/exported.safetensors" "$WORK/final.safetensors"
expect_ok "export loads with --init-from" "$TRAIN" "${ARGS[@]}" --steps 0 \
  --init-from "$WORK/exported.safetensors" --save "$WORK/reloaded.safetensors"
expect_true "and holds the same weights" cmp -s "$WORK/exported.safetensors" "$WORK/reloaded.safetensors"

# The same for llama-tiny (an untied head, grouped-query attention): no model has a case of its own.
LK="$WORK/llama-ck"
expect_ok "llama-tiny: save zero3 np 4" "${MPIRUN[@]}" -np 4 "$TRAIN" --model llama-tiny --strategy zero3 \
  "${ARGS[@]}" --steps 6 --save-dir "$LK" --save-every 2 --log-json "$WORK/llama-full.json" \
  --save "$WORK/llama-final.safetensors"
expect_ok "llama-tiny: resume as ddp np 2" "${MPIRUN[@]}" -np 2 "$TRAIN" --model llama-tiny --strategy ddp \
  "${ARGS[@]}" --steps 6 --resume "$LK/step-00000004" --log-json "$WORK/llama-ddp.json"
same_losses "llama-tiny: ddp np 2 after zero3 np 4, losses within 1e-6" "$WORK/llama-full.json" \
  "$WORK/llama-ddp.json" 1e-6
expect_ok "llama-tiny: export" "$EXPORT" "$LK/step-00000006" "$WORK/llama-exported.safetensors"
expect_true "llama-tiny: export equals the consolidated --save" \
  cmp -s "$WORK/llama-exported.safetensors" "$WORK/llama-final.safetensors"

# Damaged copies, each the newest checkpoint of its own save directory. The failing runs resume with
# --save-dir and --keep 1, so a run that went on before checking would save and prune there; every file
# and directory must be as it was after them. The corrupt file is one rank 1 checksums (rank r checks
# files r, r + 2, ...), so rank 0 must fail for a problem it did not see itself.
BAD=(missing corrupt truncated short-manifest)
for kind in "${BAD[@]}"; do mkdir "$WORK/$kind" && cp -r "$CK/step-00000006" "$WORK/$kind/"; done
rm "$WORK/missing/step-00000006/rank-00001.safetensors"
corrupt="$WORK/corrupt/step-00000006/rank-00003.safetensors"
printf '\x5a' | dd of="$corrupt" bs=1 seek=$(($(stat -c %s "$corrupt") - 7)) conv=notrunc status=none
truncate -s -100 "$WORK/truncated/step-00000006/rank-00002.safetensors"
head -c 300 "$CK/step-00000006/manifest.json" >"$WORK/short-manifest/step-00000006/manifest.json"
mkdir "$WORK/empty"
snapshot() {
  local dirs=("$CK" "$WORK/empty")
  for kind in "${BAD[@]}"; do dirs+=("$WORK/$kind"); done
  find "${dirs[@]}" | sort
  find "${dirs[@]}" -type f | sort | xargs sha256sum
}
snapshot >"$WORK/before"

RESUME=(--strategy zero3 "${ARGS[@]}" --steps 8 --keep 1)
expect_every_rank_fails "not a checkpoint" 2 "^zshard-train: error: --resume .*empty: not a checkpoint \(no manifest.json" -- \
  "${RESUME[@]}" --save-dir "$CK" --resume "$WORK/empty"
expect_every_rank_fails "no such directory" 2 "^zshard-train: error: --resume $WORK/nowhere: no such directory$" -- \
  "${RESUME[@]}" --save-dir "$CK" --resume "$WORK/nowhere"
expect_every_rank_fails "missing rank file" 3 "missing/step-00000006/rank-00001.safetensors: missing" -- \
  "${RESUME[@]}" --save-dir "$WORK/missing" --resume latest
expect_every_rank_fails "corrupt rank file" 3 "corrupt/step-00000006/rank-00003.safetensors: checksum mismatch" \
  -- "${RESUME[@]}" --save-dir "$WORK/corrupt" --resume latest
expect_every_rank_fails "truncated rank file" 3 \
  "truncated/step-00000006/rank-00002.safetensors: .* bytes, the manifest records" -- \
  "${RESUME[@]}" --save-dir "$WORK/truncated" --resume latest
expect_every_rank_fails "truncated manifest" 3 "short-manifest/step-00000006/manifest.json: truncated or not JSON" \
  -- "${RESUME[@]}" --save-dir "$WORK/short-manifest" --resume latest
expect_every_rank_fails "model does not match the flags" 2 \
  "manifest.json: the checkpoint holds model tiny with .*layers=2.*, the flags ask for tiny with .*layers=3" -- \
  "${RESUME[@]}" --save-dir "$CK" --resume "$CK/step-00000006" --layers 3
expect_every_rank_fails "another model" 2 \
  "manifest.json: the checkpoint holds model tiny with .*, the flags ask for gpt2 with" -- \
  "${RESUME[@]}" --save-dir "$CK" --resume "$CK/step-00000006" --model gpt2 --layers 1 --dim 64 --heads 4
expect_every_rank_fails "save dir holds checkpoints" 2 "already holds checkpoints" -- \
  "${RESUME[@]}" --save-dir "$CK"
expect_failure "export of a corrupt checkpoint" 3 "corrupt/step-00000006/rank-00003.safetensors: checksum mismatch" \
  -- "$EXPORT" "$WORK/corrupt/step-00000006" "$WORK/never.safetensors"
expect_true "no export written" test ! -e "$WORK/never.safetensors"
# A unit edited out of the manifest was exported as a file without its weights.
cp -r "$CK/step-00000006" "$WORK/dropped-unit"
python3 -c "
import json, sys
path = sys.argv[1] + '/manifest.json'
m = json.load(open(path))
m['units'] = m['units'][:-1]
json.dump(m, open(path, 'w'))" "$WORK/dropped-unit"
expect_failure "export of a manifest without one of the model's units" 2 \
  "dropped-unit/manifest.json: [0-9]+ units, the model has [0-9]+" -- "$EXPORT" "$WORK/dropped-unit" "$WORK/never.safetensors"
expect_true "no export written" test ! -e "$WORK/never.safetensors"
snapshot >"$WORK/after"
expect_true "bad input modified no checkpoint" cmp -s "$WORK/before" "$WORK/after"
# A constant schedule does not read --steps: a resume that raises it repeats the uninterrupted run, and
# says nothing of it; under cosine, whose decay it sets, it notes the change.
for schedule in constant cosine; do
  D="$WORK/schedule-$schedule"
  expect_ok "$schedule schedule: 2 steps saved" "$TRAIN" "${ARGS[@]}" --lr-schedule "$schedule" --steps 2 --save-dir "$D"
  expect_ok "... resumed to 3 steps" "$TRAIN" "${ARGS[@]}" --lr-schedule "$schedule" --steps 3 --save-dir "$D" --resume latest
  if [ "$schedule" = constant ]; then
    expect_true "... without a note" eval '! grep -q "when saved" "$WORK/out" "$WORK/err"'
  else
    expect_true "... noting --steps" grep -q "note: --steps was 2 when saved" "$WORK/out"
  fi
done
finish
