# shellcheck shell=bash
# LoRA adapters and frozen parameters train as an independent PyTorch implementation does: the torch peers
# (benchmarks/peers, plain torch with PEFT's LoRA semantics) train GPT-2 and Llama from the weights they
# write, adapters included, and zshard-train trains from the same file and tokens on 1, 2 and 4 ranks under
# every strategy; each step's loss must agree within 1e-5 relative (they agree to about 1e-7, float32's
# rounding). The adapters' B starts random, not zero as in PEFT, so that both adapter gradients shape the
# losses from the first step. The torch reference is trained once per case and compared with every run.
# And zshard-export --merge-lora's weights, loaded into the torch model without LoRA, give the eval loss
# zshard-train measured on the adapted model, within 1e-5 relative.
# zshard-test-seconds: 36
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/checkpoint_lib.sh"  # EXPORT, expect_ok
source "$ZSHARD_SRC/scripts/mpi-env.sh"
PYTHON=/usr/bin/python3  # Debian's python3-torch is installed for the system interpreter
PEERS=$ZSHARD_SRC/benchmarks/peers
if ! "$PYTHON" -c "import torch" 2>/dev/null; then
  echo "FAIL $PYTHON cannot import torch (python3-torch, installed by scripts/install-deps.sh)"
  exit 1
fi

COMMON=(--zshard-train "$TRAIN" --vocabs 256 --steps 20 --rtol 1e-5)
# LoRA trains with a larger step, as fine-tuning usually does, a weight decay large enough that an adapter
# left undecayed shows (1e-4), and a clipping norm the adapters' gradient norm exceeds at every step (0.08
# to 0.8): the norm then covers the adapters alone.
LORA=(--lora-rank 4 --lora-alpha 8 --lr 1e-2 --wd 1 --grad-clip 0.05)
EVERY_RUN=(1:ddp 1:zero2 1:zero3 2:ddp 2:zero2 2:zero3 2:hybrid:1 4:ddp 4:zero2 4:zero3 4:hybrid:2)
FROZEN_RUNS=(1:ddp 2:ddp 2:zero3 4:zero2 4:hybrid:2)

# parity NAME PEER ARGS...: the peer's parity mode passes; its per-run lines are printed either way.
parity() {
  local name=$1 peer=$2
  shift 2
  if timeout 300 "$PYTHON" "$PEERS/$peer" parity "${COMMON[@]}" "$@" >"$WORK/out" 2>"$WORK/err"; then
    echo "ok   $name"
    grep "^zshard .*max relative difference" "$WORK/out"
  else
    echo "FAIL $name"
    cat "$WORK/out" "$WORK/err"
    failures=$((failures + 1))
  fi
}

parity "GPT-2 LoRA on attention and MLP" gpt2_torch.py "${LORA[@]}" --lora-targets c_attn,c_proj,c_fc \
  --runs "${EVERY_RUN[@]}"
parity "Llama LoRA on attention and MLP" llama_torch.py "${LORA[@]}" \
  --lora-targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj --runs "${EVERY_RUN[@]}"
parity "GPT-2 with frozen embeddings" gpt2_torch.py --freeze wte.weight,wpe.weight --runs "${FROZEN_RUNS[@]}"
parity "Llama with a frozen embedding" llama_torch.py --freeze model.embed_tokens.weight --runs "${FROZEN_RUNS[@]}"
# Llama 3's rescaled rotary frequencies (llama-3.2-1b's rule) with a small original context, so that at head
# size 16 one wavelength is kept, two interpolated and five stretched.
parity "Llama with rope scaling, LoRA" llama_torch.py --rope-scaling 4,1,4,64 "${LORA[@]}" --runs 1:ddp 2:zero3

# ---- merged adapters in the model without LoRA ----
SHAPE=(--batch 8 --seq 32)
# Held-out text that both sides read: this script's own bytes (the runs train on zshard-train's embedded
# corpus, which the peers cannot read). The peer's loss mode over --batches 2 from the first takes the
# batches zshard-train's --eval-batches 2 evaluates on.
EVAL_TEXT=$0

# merged_loss NAME PEER MODEL TARGETS: a LoRA run of MODEL in zshard-train (zero3, 2 ranks) evaluates its
# adapted model after step 3 and checkpoints it; the torch peer's model without LoRA, on that checkpoint's
# zshard-export --merge-lora weights, has the same eval loss within 1e-5 relative.
merged_loss() {
  local name=$1 peer=$2 model=$3 targets=$4 zshard torch diff verdict=ok
  local d="$WORK/merged-$model"
  mkdir -p "$d"
  expect_ok "$name: LoRA, zero3 np 2, evaluated and checkpointed after step 3" "${MPIRUN[@]}" -np 2 "$TRAIN" \
    --strategy zero3 --model "$model" "${SHAPE[@]}" "${LORA[@]}" --lora-targets "$targets" --steps 3 \
    --save-dir "$d/ck" --save-every 3 --eval-every 3 --eval-data "$EVAL_TEXT" --eval-batches 2 --log-json "$d/log.json"
  expect_ok "$name: zshard-export --merge-lora" "$EXPORT" "$d/ck/step-00000003" "$d/merged.safetensors" --merge-lora
  expect_ok "$name: the torch model without LoRA on the merged weights" "$PYTHON" "$PEERS/$peer" loss \
    --weights "$d/merged.safetensors" --data "$EVAL_TEXT" "${SHAPE[@]}" --batches 2
  zshard=$(grep -o '"eval_loss":[^,}]*' "$d/log.json" | tail -1 | cut -d: -f2)
  torch=$(grep -o '"loss": [^,}]*' "$WORK/out" | cut -d' ' -f2)
  if [ -z "$zshard" ] || [ -z "$torch" ]; then
    echo "FAIL $name: eval losses zshard ${zshard:-none}, torch ${torch:-none}"
    failures=$((failures + 1))
    return
  fi
  diff=$(awk -v z="$zshard" -v t="$torch" 'BEGIN { d = (z - t) / t; printf "%.2e", d < 0 ? -d : d }')
  awk -v d="$diff" 'BEGIN { exit !(d <= 1e-5) }' || { verdict=FAIL; failures=$((failures + 1)); }
  printf '%-4s %s\n' $verdict \
    "$name: eval loss zshard $zshard, torch $torch, relative difference $diff (tolerance 1e-5)"
}

merged_loss "GPT-2 merged LoRA weights" gpt2_torch.py tiny c_attn,c_proj,c_fc
merged_loss "Llama merged LoRA weights" llama_torch.py llama-tiny \
  q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj
finish
