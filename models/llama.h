// A Llama-family decoder (Touvron et al. 2023) as a zshard Model, numerically Hugging Face's
// LlamaForCausalLM: pre-norm RMSNorm (eps 1e-5), rotary position embeddings (rotate_half layout), grouped-
// query attention, a SwiGLU MLP, no biases, the output head tied to the embedding or not.
//
// Units, in order (parameter names and layouts are Hugging Face's, nn.Linear weights (out, in)):
//   0        "embed"      model.embed_tokens.weight (V,C)
//   1..L     "layers.{i}" model.layers.{i}.input_layernorm.weight, self_attn.{q,k,v,o}_proj.weight,
//                         post_attention_layernorm.weight, mlp.{gate,up,down}_proj.weight
//   L+1      "final"      model.norm.weight, and lm_head.weight (V,C) when the head is untied
// With LoRA (LlamaConfig::lora, models/lora.h) each layer unit adds, after its own, an adapter for each
// targeted projection, model.layers.{i}.self_attn.q_proj.lora_A.weight (R,C) and .lora_B.weight (C,R) and so
// on, and every other parameter is frozen.
#pragma once
#include <memory>

#include <zshard/model.h>

#include "models/llama_config.h"
#include "models/lm_head.h"

namespace zshard {

namespace llama {
struct Activations;
}

class Llama final : public Model, public LoraModel {
 public:
  explicit Llama(LlamaConfig config);  // validates the config
  ~Llama() override;

  const LlamaConfig& config() const { return config_; }
  int num_units() const { return config_.layers + 2; }
  const LoraPlan& lora_plan() const override { return lora_; }

  std::vector<UnitSpec> units() const override;
  // Hugging Face init: matrices and the embedding N(0, 0.02), RMSNorm gains 1; LoRA adapters as PEFT's.
  void init_unit(int unit, const UnitTensors& params, uint64_t seed) const override;
  // Gathers every layer for forward and again for backward, the embedding for forward only (its backward
  // reads only the tokens). Untied, the final unit (norm and head) is gathered once: the logits, their
  // backward and the norm's backward run under that gather. Tied, the embedding is gathered a second time
  // for the logits and their backward, and the final norm again for its backward. grads_ready runs from
  // the final unit down to unit 0; a tied head opens unit 0's grads() at the head or, with its weight
  // gradient deferred (set_head_gradient), at the embedding's backward only. With
  // Recompute::blocks a layer's forward runs again under its backward's gather.
  double forward_backward(ParamContext& ctx, const Batch& batch, float loss_scale) override;
  double forward(ParamContext& ctx, const Batch& batch) override;
  int64_t activation_bytes(int B, int T, DType dtype) const override;
  // The decoder's (decoder_workspace_bytes), its layers' own ops the SwiGLU's backward and the grouped-query
  // packing's (on the cpu in bf16).
  WorkspaceBytes workspace_bytes(int B, int T, DType dtype, Device device) const override;
  // Unit 0's, when a tied head adds its weight gradient at the head (defers_head_gradient is false); an
  // untied head's is in the final unit, made ready first.
  bool keeps_gradients_open(int B, int T) const override {
    return config_.tie_embeddings && !defers_head_gradient(B, T);
  }
  void set_recompute(Recompute mode) override { recompute_ = mode; }
  void set_attention(AttentionKernel kernel) override;
  void set_fused_epilogues(FusedEpilogues mode) override { fused_ = mode; }
  int vocab_size() const override { return config_.vocab; }
  int context_length() const override { return config_.ctx; }
  // 6 per parameter (a tied matrix once, for the head; 4 per frozen one, whose weight gradient is skipped:
  // parameter_flops), plus attention's scores and weighted values, halved by the causal mask:
  // 6 * layers * T * dim. LoRA adapters are parameters and count as such.
  double flops_per_token(int T) const override;

  // When a tied head adds its weight gradient to unit 0's gradients, as GPT-2's (models/lm_head.h). An
  // untied head never defers.
  void set_head_gradient(HeadGradient when) { head_gradient_ = when; }
  bool defers_head_gradient(int B, int T) const {
    return config_.tie_embeddings && zshard::defers_head_gradient(head_gradient_, B, T, config_.dim);
  }

 private:
  template <class T>
  double run_as(ParamContext& ctx, const Batch& batch, bool backward, float loss_scale);
  double run(ParamContext& ctx, const Batch& batch, bool backward, float loss_scale);

  LlamaConfig config_;
  LoraPlan lora_;
  Recompute recompute_ = Recompute::none;
  AttentionKernel attention_ = AttentionKernel::blocks;
  FusedEpilogues fused_ = FusedEpilogues::automatic;
  HeadGradient head_gradient_ = HeadGradient::by_tokens;
  // Reallocated only when (B, T), dtype, device or the head's deferral change.
  std::unique_ptr<llama::Activations> acts_;
};

// The registry's builder (<zshard/model_registry.h>).
std::unique_ptr<Llama> make_llama(const ModelConfig& config);

}  // namespace zshard
