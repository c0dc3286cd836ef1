# Checkpoints through the binaries: --save-every with --keep, resuming on another world size and
# strategy with the uninterrupted run's losses, zshard-export equal to the consolidated --save, and bad
# input: one line naming the file and the problem, a non-zero exit on every rank, nothing modified.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/checkpoint_lib.sh"
CK="$WORK/ck"

expect_ok "save zero3 np 4, every 2 steps, keep 2" "${MPIRUN[@]}" -np 4 "$TRAIN" --strategy zero3 \
  "${ARGS[@]}" --steps 6 --save-dir "$CK" --save-every 2 --keep 2 --log-json "$WORK/full.json" \
  --save "$WORK/final.safetensors"
expect_true "keep 2: step 4 and step 6 remain" \
  test "$(ls "$CK")" = "$(printf 'step-00000004\nstep-00000006')" -a -f "$CK/step-00000006/manifest.json"

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

# Damaged copies; every checkpoint file must be byte-identical after the failed runs.
for kind in missing corrupt truncated short-manifest; do cp -r "$CK/step-00000006" "$WORK/$kind"; done
rm "$WORK/missing/rank-00001.safetensors"
size=$(stat -c %s "$WORK/corrupt/rank-00002.safetensors")
printf '\x5a' | dd of="$WORK/corrupt/rank-00002.safetensors" bs=1 seek=$((size - 7)) conv=notrunc status=none
truncate -s -100 "$WORK/truncated/rank-00003.safetensors"
head -c 300 "$CK/step-00000006/manifest.json" >"$WORK/short-manifest/manifest.json"
mkdir "$WORK/empty"
snapshot() {
  find "$CK" "$WORK"/missing "$WORK"/corrupt "$WORK"/truncated "$WORK"/short-manifest -type f | sort |
    xargs sha256sum
}
snapshot >"$WORK/before"

RESUME=("${MPIRUN[@]}" -np 2 "$TRAIN" --strategy zero3 "${ARGS[@]}" --steps 8 --resume)
expect_failure "not a checkpoint" 1 "empty: not a checkpoint \(no manifest.json" -- \
  "${RESUME[@]}" "$WORK/empty"
expect_one_line "not a checkpoint" "not a checkpoint"
expect_failure "no such directory" 1 "nowhere: not a checkpoint \(no such directory\)" -- \
  "${RESUME[@]}" "$WORK/nowhere"
expect_failure "missing rank file" 1 "missing/rank-00001.safetensors: missing" -- \
  "${RESUME[@]}" "$WORK/missing"
expect_one_line "missing rank file" "rank-00001"
expect_failure "corrupt rank file" 1 "corrupt/rank-00002.safetensors: checksum mismatch" -- \
  "${RESUME[@]}" "$WORK/corrupt"
expect_one_line "corrupt rank file" "rank-00002"
expect_failure "truncated rank file" 1 "truncated/rank-00003.safetensors: .* bytes, the manifest records" -- \
  "${RESUME[@]}" "$WORK/truncated"
expect_one_line "truncated rank file" "rank-00003"
expect_failure "truncated manifest" 1 "short-manifest/manifest.json: truncated or not JSON" -- \
  "${RESUME[@]}" "$WORK/short-manifest"
expect_one_line "truncated manifest" "manifest.json"
expect_failure "model does not match the flags" 2 \
  "manifest.json: the checkpoint's model \(layers 2.*does not match the flags \(layers 3" -- \
  "${RESUME[@]}" "$CK/step-00000006" --layers 3
expect_one_line "model does not match the flags" "does not match"
expect_failure "save dir holds checkpoints" 2 "already holds checkpoints" -- \
  "${MPIRUN[@]}" -np 2 "$TRAIN" "${ARGS[@]}" --save-dir "$CK"
expect_failure "export of a corrupt checkpoint" 1 "corrupt/rank-00002.safetensors: checksum mismatch" -- \
  "$EXPORT" "$WORK/corrupt" "$WORK/never.safetensors"
expect_true "no export written" test ! -e "$WORK/never.safetensors"
snapshot >"$WORK/after"
expect_true "bad input modified no checkpoint" cmp -s "$WORK/before" "$WORK/after"
finish
