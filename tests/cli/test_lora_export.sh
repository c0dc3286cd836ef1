# LoRA weights files through the binaries, for GPT-2 and Llama: --save and zshard-export write the adapters
# alone under PEFT's names with adapter_config.json beside them; zshard-export --merge-lora's weights give the
# model without LoRA the adapted model's eval loss; the adapters load back beside the base from the seed,
# and an export finds the base from a file; a checkpoint saved at np 4 zero3 resumes at np 2 ddp, its
# targets named in another order, with the uninterrupted run's losses; bad input: one line, exit 2, on every rank.
# zshard-test-seconds: 40
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/checkpoint_lib.sh"
EVAL=(--eval-data default --eval-batches 2)

# eval_loss FILE: the eval_loss of the last record of a --log-json.
eval_loss() { grep -o '"eval_loss":[^,}]*' "$1" | tail -1 | cut -d: -f2; }

# same_eval NAME A.json B.json: the two runs' last eval losses agree within 1e-5.
same_eval() {
  local a b
  a=$(eval_loss "$2") b=$(eval_loss "$3")
  if [ -n "$a" ] && [ -n "$b" ] && awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; exit !(d < 1e-5 && d > -1e-5) }'; then
    echo "ok   $1 ($a, $b)"
  else
    echo "FAIL $1: eval losses ${a:-none} and ${b:-none}"
    failures=$((failures + 1))
  fi
}

# tensor_names FILE: the tensors of a safetensors file, one a line (its JSON header, after 8 bytes of length).
tensor_names() {
  local n
  n=$(od -An -t u8 -N8 "$1" | tr -d ' ')
  tail -c +9 "$1" | head -c "$n" | grep -o '"[^"]*":{' | sed 's/^"//; s/":{$//' | grep -v '^__metadata__$'
}

for model in tiny llama-tiny; do
  # The same layers named in another order and spelling (PEFT's target_modules is a set of name suffixes):
  # the resume below takes them.
  if [ $model = tiny ]; then
    targets=c_attn,c_proj respelled=mlp.c_proj,attn.c_proj,c_attn
  else
    targets=q_proj,o_proj,down_proj respelled=down_proj,self_attn.o_proj,self_attn.q_proj
  fi
  LORA=(--model $model --lora-rank 2 --lora-alpha 4 --lora-targets $targets)
  REORDERED=(--model $model --lora-rank 2 --lora-alpha 4 --lora-targets $respelled)
  D="$WORK/$model"
  mkdir -p "$D/adapters" "$D/exported"
  expect_ok "$model: LoRA, zero3 np 4, a checkpoint every 2 steps" "${MPIRUN[@]}" -np 4 "$TRAIN" --strategy zero3 \
    "${ARGS[@]}" "${LORA[@]}" --steps 4 --lr 1e-2 --save-dir "$D/ck" --save-every 2 --log-json "$D/full.json" \
    --eval-every 4 "${EVAL[@]}" --save "$D/adapters/adapter_model.safetensors"
  tensor_names "$D/adapters/adapter_model.safetensors" >"$D/names"
  expect_true "$model: --save writes the adapters alone, under PEFT's names" \
    test -s "$D/names" -a -z "$(grep -Ev '^base_model\.model\..*\.lora_[AB]\.weight$' "$D/names")"
  expect_true "$model: adapter_config.json beside them" \
    grep -q '"r": 2' "$D/adapters/adapter_config.json"
  expect_ok "$model: zshard-export of the checkpoint" "$EXPORT" "$D/ck/step-00000004" \
    "$D/exported/adapter_model.safetensors"
  for f in adapter_model.safetensors adapter_config.json; do
    expect_true "$model: $f equals --save's" cmp -s "$D/exported/$f" "$D/adapters/$f"
  done

  # Merged: the model without LoRA, on the merged weights, computes what the adapted model does. A step at
  # --lr 0 changes no weight; its evaluation follows it.
  expect_ok "$model: --merge-lora, the base from the seed" "$EXPORT" "$D/ck/step-00000004" "$D/merged.safetensors" \
    --merge-lora
  expect_ok "$model: the merged weights in the model without LoRA" "$TRAIN" --model $model "${ARGS[@]}" --steps 1 \
    --lr 0 --init-from "$D/merged.safetensors" --eval-every 1 "${EVAL[@]}" --log-json "$D/merged.json"
  same_eval "$model: the merged model's eval loss is the adapted one's" "$D/full.json" "$D/merged.json"
  expect_ok "$model: the adapters back beside the base from the seed" "$TRAIN" "${LORA[@]}" "${ARGS[@]}" --steps 1 \
    --lr 0 --init-from "$D/adapters/adapter_model.safetensors" --eval-every 1 "${EVAL[@]}" --log-json "$D/back.json"
  same_eval "$model: the same eval loss" "$D/full.json" "$D/back.json"

  expect_ok "$model: resume step 2 as ddp np 2, its targets respelled" "${MPIRUN[@]}" -np 2 "$TRAIN" --strategy ddp \
    "${ARGS[@]}" "${REORDERED[@]}" --steps 4 --lr 1e-2 --resume "$D/ck/step-00000002" --eval-every 4 "${EVAL[@]}" \
    --log-json "$D/resumed.json"
  same_losses "$model: every later loss the uninterrupted run's (within 1e-6)" "$D/full.json" "$D/resumed.json" 1e-6
done

# ---- the base from a file: an export names it, and other frozen weights are refused ----
D="$WORK/tiny"
LORA=(--model tiny --lora-rank 2 --lora-alpha 4 --lora-targets c_attn,c_proj)
expect_ok "a base file: the model without LoRA at step 0" "$TRAIN" "${ARGS[@]}" --steps 0 --save "$D/base.safetensors"
expect_ok "another base file: another seed" "$TRAIN" "${ARGS[@]}" --steps 0 --seed 7 --save "$D/other.safetensors"
expect_ok "LoRA on the base file" "$TRAIN" "${ARGS[@]}" "${LORA[@]}" --steps 4 --lr 1e-2 --init-from "$D/base.safetensors" \
  --save-dir "$D/ck-file" --save-every 2 --eval-every 4 "${EVAL[@]}" --log-json "$D/file.json" \
  --save "$D/file-adapters.safetensors"
expect_failure "--merge-lora of it without the base" 2 \
  "^zshard-export: error: .*ck-file/step-00000004 was trained beside frozen parameters from .*base.safetensors, which it does not hold: give them as --init-from$" \
  -- "$EXPORT" "$D/ck-file/step-00000004" "$D/never.safetensors" --merge-lora
expect_one_line "--merge-lora without the base" "--init-from"
expect_failure "--merge-lora beside other frozen weights" 2 \
  "^zshard-export: error: .*ck-file/step-00000004: saved beside frozen parameters from .*base.safetensors \(fingerprint [0-9a-f]+\), but this model's are from .*other.safetensors" \
  -- "$EXPORT" "$D/ck-file/step-00000004" "$D/never.safetensors" --merge-lora --init-from "$D/other.safetensors"
expect_one_line "--merge-lora beside other frozen weights" "fingerprint"
expect_true "nothing written" test ! -e "$D/never.safetensors"
expect_ok "--merge-lora with the base file" "$EXPORT" "$D/ck-file/step-00000004" "$D/merged-file.safetensors" \
  --merge-lora --init-from "$D/base.safetensors"
expect_ok "in the model without LoRA" "$TRAIN" "${ARGS[@]}" --steps 1 --lr 0 --init-from "$D/merged-file.safetensors" \
  --eval-every 1 "${EVAL[@]}" --log-json "$D/merged-file.json"
same_eval "the adapted model's eval loss" "$D/file.json" "$D/merged-file.json"
# The checkpoint holds the adapters: a resume takes the base from --init-from again, checked against it.
expect_ok "resumed at step 2 beside the base file, as zero2 np 2" "${MPIRUN[@]}" -np 2 "$TRAIN" --strategy zero2 \
  "${ARGS[@]}" "${LORA[@]}" --steps 4 --lr 1e-2 --init-from "$D/base.safetensors" --resume "$D/ck-file/step-00000002" \
  --eval-every 4 "${EVAL[@]}" --log-json "$D/file-resumed.json"
same_losses "every later loss the uninterrupted run's (within 1e-6)" "$D/file.json" "$D/file-resumed.json" 1e-6
expect_every_rank_fails "resumed beside another base file" 2 \
  "saved beside frozen parameters from .*base.safetensors .* but this model's are from .*other.safetensors" -- \
  "${ARGS[@]}" "${LORA[@]}" --steps 4 --init-from "$D/other.safetensors" --resume "$D/ck-file/step-00000002"
expect_ok "--init-from BASE,ADAPTERS" "$TRAIN" "${ARGS[@]}" "${LORA[@]}" --steps 1 --lr 0 \
  --init-from "$D/base.safetensors,$D/file-adapters.safetensors" --eval-every 1 "${EVAL[@]}" --log-json "$D/file-back.json"
same_eval "the base and its adapters give the adapted model's eval loss" "$D/file.json" "$D/file-back.json"
expect_every_rank_fails "--resume and --init-from without anything frozen" 2 "--resume and --init-from exclude each other" \
  -- "${ARGS[@]}" --steps 4 --init-from "$D/base.safetensors" --resume "$D/ck-file/step-00000002"

# ---- bad input ----
expect_ok "a checkpoint without LoRA" "$TRAIN" "${ARGS[@]}" --steps 1 --save-dir "$WORK/plain"
expect_failure "--merge-lora without adapters" 2 \
  "^zshard-export: error: --merge-lora: .*plain/step-00000001 holds a model without LoRA adapters: nothing to merge$" \
  -- "$EXPORT" "$WORK/plain/step-00000001" "$WORK/never.safetensors" --merge-lora
expect_one_line "--merge-lora without adapters" "merge"
ADAPTERS="$D/adapters/adapter_model.safetensors"
expect_every_rank_fails "adapters of another rank" 2 \
  "--init-from .*adapter_model.safetensors: tensor base_model.model.h.0.attn.c_attn.lora_A.weight has shape \(2, 64\), the model needs \(4, 64\) \(adapters of another --lora-rank or model size\?\)" \
  -- "${ARGS[@]}" --lora-rank 4 --lora-alpha 4 --lora-targets c_attn,c_proj --steps 1 --init-from "$ADAPTERS"
expect_every_rank_fails "adapters of another model" 2 \
  "--init-from .*tiny/adapters/adapter_model.safetensors: holds LoRA adapters \(base_model.model.h.0.attn.c_attn.lora_A.weight, ...\) of none of this model's layers: trained on another model\?" \
  -- "${ARGS[@]}" --model llama-tiny --lora-rank 2 --steps 1 --init-from "$ADAPTERS"
expect_every_rank_fails "adapters for a model without LoRA" 2 \
  "--init-from .*adapter_model.safetensors: holds LoRA adapters .* of none of this model's layers: it has no adapters \(trained with --lora-rank\?\)" \
  -- "${ARGS[@]}" --steps 1 --init-from "$ADAPTERS"
expect_every_rank_fails "BASE,ADAPTERS whose ADAPTERS is a base file" 2 \
  "error: --init-from .*other.safetensors: the second file of BASE,ADAPTERS holds base weights, not LoRA adapters alone$" \
  -- "${ARGS[@]}" "${LORA[@]}" --steps 1 --init-from "$D/base.safetensors,$D/other.safetensors"
expect_every_rank_fails "adapters of fewer layers than the run's targets" 2 \
  "error: --init-from .*adapter_model.safetensors: holds LoRA adapters of some of this model's layers, not h.0.mlp.c_fc.lora_A.weight \(trained on other --lora-targets\?\)$" \
  -- "${ARGS[@]}" --lora-rank 2 --lora-alpha 4 --lora-targets c_attn,c_proj,c_fc --steps 1 \
  --init-from "$D/base.safetensors,$ADAPTERS"
expect_every_rank_fails "BASE,ADAPTERS whose BASE is an adapter file" 2 \
  "error: --init-from .*file-adapters.safetensors: the first file of BASE,ADAPTERS holds LoRA adapters alone, not a base's weights$" \
  -- "${ARGS[@]}" "${LORA[@]}" --steps 1 --init-from "$D/file-adapters.safetensors,$D/file-adapters.safetensors"
expect_failure "zshard-export --init-from BASE,ADAPTERS" 2 \
  "^zshard-export: error: --init-from .*base.safetensors,.*: takes the base's weights file alone \(the checkpoint holds the adapters; a path cannot hold a comma\)$" \
  -- "$EXPORT" "$WORK/plain/step-00000001" "$WORK/never.safetensors" --init-from "$D/base.safetensors,$ADAPTERS"
expect_every_rank_fails "adapters loaded with another alpha than their adapter_config.json's" 2 \
  "error: --lora-alpha: .*tiny/adapter_config.json says lora_alpha 4.0, the run gives 8.0 \(the adapters must be loaded as they were trained\)$" \
  -- "${ARGS[@]}" --lora-rank 2 --lora-targets c_attn,c_proj --steps 1 --init-from "$D/base.safetensors,$D/file-adapters.safetensors"
expect_every_rank_fails "adapters alone loaded with another alpha than their adapter_config.json's" 2 \
  "error: --lora-alpha: .*tiny/adapter_config.json says lora_alpha 4.0, the run gives 8.0 \(the adapters must be loaded as they were trained\)$" \
  -- "${ARGS[@]}" --lora-rank 2 --lora-targets c_attn,c_proj --steps 1 --init-from "$D/file-adapters.safetensors"
expect_every_rank_fails "--save's adapter_config.json over the loaded adapters' own" 2 \
  "error: --save's adapter_config.json .*tiny/adapter_config.json names the same file as --init-from: refusing to overwrite it$" \
  -- "${ARGS[@]}" "${LORA[@]}" --steps 1 --init-from "$D/base.safetensors,$D/file-adapters.safetensors" \
  --save "$D/new-adapters.safetensors"
expect_every_rank_fails "--lora-rank 0" 2 "--lora-rank must be at least 1" -- "${ARGS[@]}" --lora-rank 0 --steps 1
expect_every_rank_fails "a frozen adapter beside a base file" 2 \
  "error: .*base.safetensors: holds some of unit h.0's parameters and not others that share their buffer .*start such a run from the seed$" \
  -- "${ARGS[@]}" "${LORA[@]}" --freeze '*lora_A*' --steps 1 --init-from "$D/base.safetensors"
# A directory's adapter_config.json describes its adapter_model.safetensors: another file of other adapters
# saved beside it would relabel them.
mkdir -p "$WORK/cfg"
cp "$ADAPTERS" "$D/adapters/adapter_config.json" "$WORK/cfg/"
expect_every_rank_fails "--save beside another adapter's adapter_config.json" 2 \
  "error: --save's adapter_config.json .*cfg/adapter_config.json describes other adapters .*refusing to overwrite it; save into another directory, or as adapter_model.safetensors to replace them$" \
  -- "${ARGS[@]}" --model tiny --lora-rank 2 --lora-alpha 99 --lora-targets c_attn,c_proj --steps 1 \
  --save "$WORK/cfg/adapter_model3.safetensors"
expect_true "the other adapter's adapter_config.json as it was" cmp "$D/adapters/adapter_config.json" "$WORK/cfg/adapter_config.json"
expect_ok "--save beside an adapter_config.json of the same adapters" "$TRAIN" "${ARGS[@]}" "${LORA[@]}" --steps 1 \
  --save "$WORK/cfg/adapter_model3.safetensors"
expect_ok "--save replacing the directory's adapters" "$TRAIN" "${ARGS[@]}" --model tiny --lora-rank 2 \
  --lora-alpha 99 --lora-targets c_attn,c_proj --steps 1 --save "$WORK/cfg/adapter_model.safetensors"
expect_true "their adapter_config.json with them" grep -q '"lora_alpha": 99' "$WORK/cfg/adapter_config.json"
# PEFT's settings of another math than plain LoRA's are refused, not loaded into it.
mkdir -p "$WORK/rslora"
cp "$ADAPTERS" "$WORK/rslora/"
sed 's/"r": 2,/"r": 2, "use_rslora": true,/' "$D/adapters/adapter_config.json" >"$WORK/rslora/adapter_config.json"
expect_every_rank_fails "adapters trained with rsLoRA's scale" 2 \
  "error: --init-from: .*rslora/adapter_config.json says use_rslora true \(scaled by alpha / sqrt\(r\)\); zshard's adapters are plain LoRA$" \
  -- "${ARGS[@]}" "${LORA[@]}" --steps 1 --init-from "$D/base.safetensors,$WORK/rslora/adapter_model.safetensors"
finish
