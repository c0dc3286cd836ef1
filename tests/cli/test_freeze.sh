# --freeze: a run with frozen parameters trains, logs and resumes on another world like any run (with the
# same --freeze: other frozen parameters are refused), and zshard-mem shows the frozen share in a column of its own. A pattern that freezes nothing, or that leaves
# nothing to train (LoRA's adapters included), is refused in one line on every rank.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/checkpoint_lib.sh"

FREEZE=(--freeze 'wte.weight,h.0.*')
expect_ok "frozen zero3 np 2, saved every 2 steps" "${MPIRUN[@]}" -np 2 "$TRAIN" "${ARGS[@]}" "${FREEZE[@]}" \
  --strategy zero3 --steps 4 --save-dir "$WORK/ck" --save-every 2 --log-json "$WORK/whole.json"
expect_true "the checkpoint names its frozen parameters' source" \
  grep -q '"source": "seed 1337"' "$WORK"/ck/step-00000002/manifest.json
expect_ok "step 2 resumed at np 1 under ddp" "$TRAIN" "${ARGS[@]}" "${FREEZE[@]}" --steps 4 \
  --resume "$WORK/ck/step-00000002" --log-json "$WORK/resumed.json"
same_losses "steps 3 and 4 resumed equal the uninterrupted run's" "$WORK/whole.json" "$WORK/resumed.json" 1e-5
expect_every_rank_fails "resumed beside other frozen weights" 2 \
  "saved beside frozen parameters from seed 1337 .* but this model's are from seed 5" -- \
  "${ARGS[@]}" "${FREEZE[@]}" --steps 4 --resume "$WORK/ck/step-00000002" --seed 5
# Other frozen parameters change what the checkpoint trained: bad input (2, not relaunched by zshard-run),
# naming the parameter and the flags.
expect_every_rank_fails "resumed without the --freeze it was saved with" 2 \
  "step-00000002/manifest.json: this run trains wte.weight, which the checkpoint froze \(--freeze and the LoRA" -- \
  "${ARGS[@]}" --steps 4 --resume "$WORK/ck/step-00000002"
expect_every_rank_fails "resumed freezing more than it was saved with" 2 \
  "step-00000002/manifest.json: the checkpoint trained h.1.ln_1.weight, which this run freezes" -- \
  "${ARGS[@]}" --freeze 'wte.weight,h.*' --steps 4 --resume "$WORK/ck/step-00000002"
expect_every_rank_fails "--resume given the manifest's file" 2 \
  "error: --resume .*step-00000002/manifest.json: not a directory \(a checkpoint is the directory" -- \
  "${ARGS[@]}" "${FREEZE[@]}" --steps 4 --resume "$WORK/ck/step-00000002/manifest.json"

# In bf16 a frozen parameter lives in bf16 alone: zshard-export writes what the run's --save wrote.
expect_ok "frozen zero3 np 2 in bf16, --save beside its last checkpoint" "${MPIRUN[@]}" -np 2 "$TRAIN" "${ARGS[@]}" \
  "${FREEZE[@]}" --strategy zero3 --param-dtype bf16 --steps 2 --save-dir "$WORK/ck-bf16" --save "$WORK/bf16.safetensors"
expect_ok "zshard-export of the bf16 checkpoint" "$EXPORT" "$WORK/ck-bf16/step-00000002" "$WORK/bf16-export.safetensors"
expect_true "the export is --save's, byte for byte" cmp -s "$WORK/bf16.safetensors" "$WORK/bf16-export.safetensors"

expect_ok "zshard-mem with --freeze" "$ZSHARD_BIN/zshard-mem" --model tiny --world 2 "${FREEZE[@]}"
expect_true "zshard-mem has a frozen column" grep -q "frozen" "$WORK/out"

expect_every_rank_fails "a pattern that freezes nothing" 2 \
  "error: --freeze: pattern 'h.9.\*' matches no parameter of the model$" -- "${ARGS[@]}" --freeze 'wte.weight,h.9.*'
expect_every_rank_fails "a pattern that freezes everything" 2 "error: --freeze: every parameter is frozen" -- \
  "${ARGS[@]}" --freeze '*'
expect_every_rank_fails "everything frozen, LoRA adapters too" 2 "error: --freeze: every parameter is frozen" -- \
  "${ARGS[@]}" --lora-rank 2 --freeze '*lora*'
expect_failure "zshard-mem: a pattern that freezes nothing" 2 "--freeze: pattern 'nope' matches no parameter" -- \
  "$ZSHARD_BIN/zshard-mem" --model tiny --freeze nope
finish
