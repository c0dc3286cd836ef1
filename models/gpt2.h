// GPT-2 (Radford et al. 2019) as a zshard Model, numerically the Hugging Face GPT2LMHeadModel: pre-LN
// blocks, tanh GELU, LayerNorm eps 1e-5, the LM head tied to wte.
//
// Units, in order (parameter names are the Hugging Face names, layouts the Conv1D (in, out) ones):
//   0        "embed"  wte.weight (V,C), wpe.weight (ctx,C)
//   1..L     "h.{i}"  ln_1.{weight,bias}, attn.c_attn.{weight (C,3C), bias},
//                     attn.c_proj.{weight (C,C), bias}, ln_2.{weight,bias},
//                     mlp.c_fc.{weight (C,4C), bias}, mlp.c_proj.{weight (4C,C), bias}
//   L+1      "ln_f"   ln_f.{weight,bias}
// With LoRA (GPT2Config::lora, models/lora.h) each block unit adds, after its own, an adapter for each
// targeted layer, h.{i}.attn.c_attn.lora_A.weight (R,C) and .lora_B.weight (3C,R) and so on, and every
// other parameter is frozen.
#pragma once
#include <memory>

#include <zshard/model.h>

#include "models/gpt2_config.h"
#include "models/lm_head.h"

namespace zshard {

namespace gpt2 {
struct Activations;
}

class GPT2 final : public Model, public LoraModel {
 public:
  explicit GPT2(GPT2Config config);  // validates the config
  ~GPT2() override;

  const GPT2Config& config() const { return config_; }
  int num_units() const { return config_.layers + 2; }
  const LoraPlan& lora_plan() const override { return lora_; }

  std::vector<UnitSpec> units() const override;
  // Hugging Face init: matrices and embeddings N(0, 0.02), the residual projections (c_proj weights)
  // N(0, 0.02/sqrt(2*layers)), biases 0, LayerNorm gains 1; LoRA adapters as PEFT's (LoraPlan). Values
  // depend on (seed, unit, param index) only; f32 tensors get the f64 values rounded.
  void init_unit(int unit, const UnitTensors& params, uint64_t seed) const override;
  // Computes in ctx.compute_dtype() on ctx.device(): f32 or bf16 (f64 too on cpu), where the
  // batch's tokens are copied to the device first. forward_backward gathers every unit twice: forward
  // and backward, except unit 0, whose second gather serves the tied head (the logits, the gradient into
  // lnf and, unless deferred, dwte); the embedding backward needs no parameters. With
  // Recompute::blocks a block's forward runs again under its backward's gather: the same
  // gathers, the same results. grads_ready runs from unit L+1 down to unit 0; unit 0's grads() comes at the
  // head or, with the head's dwte deferred (set_head_gradient), at the embedding's backward only.
  // On cuda the ops are only queued on the compute stream (<zshard/ops.h>): at release(u) and
  // grads_ready(u), u's work is queued, not necessarily finished; the returned loss is final.
  double forward_backward(ParamContext& ctx, const Batch& batch, float loss_scale) override;
  double forward(ParamContext& ctx, const Batch& batch) override;
  int64_t activation_bytes(int B, int T, DType dtype) const override;
  // The decoder's (decoder_workspace_bytes), its layers' own op the GELU's backward where no fused c_proj
  // takes it (on the cpu in bf16).
  WorkspaceBytes workspace_bytes(int B, int T, DType dtype, Device device) const override;
  // Unit 0's, when the head's dwte is added at the head (defers_head_gradient is false).
  bool keeps_gradients_open(int B, int T) const override { return !defers_head_gradient(B, T); }
  void set_recompute(Recompute mode) override { recompute_ = mode; }
  void set_attention(AttentionKernel kernel) override;
  void set_fused_epilogues(FusedEpilogues mode) override { fused_ = mode; }
  int vocab_size() const override { return config_.vocab; }
  int context_length() const override { return config_.ctx; }
  // 6 per parameter for the matmuls (the tied head included; 4 per frozen parameter, whose weight gradient
  // is skipped: parameter_flops), plus attention's scores and weighted values, 6 * layers * T * dim:
  // PaLM's 12 * layers * T * dim halved, as a causal mask needs only the lower triangle. LoRA adapters are
  // parameters and count as such. No recomputation is counted.
  double flops_per_token(int T) const override;

  // When the tied head adds dwte = dlogits^T lnf to unit 0's gradients (models/lm_head.h).
  void set_head_gradient(HeadGradient when) { head_gradient_ = when; }
  bool defers_head_gradient(int B, int T) const {
    return zshard::defers_head_gradient(head_gradient_, B, T, config_.dim);
  }

 private:
  double run(ParamContext& ctx, const Batch& batch, bool backward, float loss_scale);
  template <class T>
  double run_as(ParamContext& ctx, const Batch& batch, bool backward, float loss_scale);

  GPT2Config config_;
  LoraPlan lora_;
  Recompute recompute_ = Recompute::none;
  AttentionKernel attention_ = AttentionKernel::blocks;
  FusedEpilogues fused_ = FusedEpilogues::automatic;
  HeadGradient head_gradient_ = HeadGradient::by_tokens;
  // Kept between steps; reallocated only when (B, T), dtype or device change.
  std::unique_ptr<gpt2::Activations> acts_;
};

// The registry's builder (<zshard/model_registry.h>).
std::unique_ptr<GPT2> make_gpt2(const ModelConfig& config);

}  // namespace zshard
