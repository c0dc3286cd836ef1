#include "models/llama.h"

#include <algorithm>
#include <string>
#include <utility>

#include <zshard/error.h>

#include "kernels/cpu/ops.h"
#include "models/llama_layers.h"
#include "models/model_support.h"

namespace zshard {

namespace {

constexpr double kLlamaInitStd = 0.02;  // Hugging Face's initializer_range

std::vector<ParamDef> param_defs(const LlamaConfig& c, const LoraPlan& lora, int unit) {
  const int final_unit = c.layers + 1;
  ZS_CHECK(unit >= 0 && unit <= final_unit, "Llama has units 0..", final_unit, ", not ", unit);
  const int64_t C = c.dim, KV = c.kv_dim(), F = c.ffn_dim;
  const auto mat = [](std::string name, Shape shape) { return ParamDef{{std::move(name), std::move(shape), true}, 0.0, kLlamaInitStd}; };
  const auto gain = [](std::string name, int64_t n) { return ParamDef{{std::move(name), {n}, false}, 1.0, 0.0}; };
  std::vector<ParamDef> defs;
  if (unit == 0) defs = {mat("model.embed_tokens.weight", {c.vocab, C})};
  if (unit == final_unit) {
    defs = {gain("model.norm.weight", C)};
    if (!c.tie_embeddings) defs.push_back(mat("lm_head.weight", {c.vocab, C}));
  }
  if (!defs.empty()) {
    lora.freeze(defs);
    return defs;
  }
  const std::string p = "model.layers." + std::to_string(unit - 1) + ".";
  defs = {
      gain(p + "input_layernorm.weight", C),
      mat(p + "self_attn.q_proj.weight", {C, C}),
      mat(p + "self_attn.k_proj.weight", {KV, C}),
      mat(p + "self_attn.v_proj.weight", {KV, C}),
      mat(p + "self_attn.o_proj.weight", {C, C}),
      gain(p + "post_attention_layernorm.weight", C),
      mat(p + "mlp.gate_proj.weight", {F, C}),
      mat(p + "mlp.up_proj.weight", {F, C}),
      mat(p + "mlp.down_proj.weight", {C, F}),
  };
  ZS_CHECK(defs.size() == llama::kNumLayerParams, "Llama layer params out of step with llama::LayerParam");
  lora.adapt_block(defs, p);
  return defs;
}

std::string unit_name(const LlamaConfig& c, int unit) {
  if (unit == 0) return "embed";
  if (unit == c.layers + 1) return "final";
  return "layers." + std::to_string(unit - 1);
}

}  // namespace

Llama::Llama(LlamaConfig config) : config_(std::move(config)) {
  config_.validate();
  lora_ = config_.lora_plan();
}

Llama::~Llama() = default;

std::vector<UnitSpec> Llama::units() const {
  return units_from_defs(
      num_units(), [&](int u) { return unit_name(config_, u); }, [&](int u) { return param_defs(config_, lora_, u); });
}

void Llama::init_unit(int unit, const UnitTensors& params, uint64_t seed) const {
  init_params("Llama", param_defs(config_, lora_, unit), params, unit, seed);
}

void Llama::set_attention(AttentionKernel kernel) { attention_ = decoder_attention(kernel); }

int64_t Llama::activation_bytes(int B, int T, DType dtype) const {
  ZS_CHECK(B > 0 && T > 0, "Llama activation_bytes: B and T must be positive, got B=", B, " T=", T);
  return decoder_activation_bytes<llama::Activations>(config_, B, T, dtype, recompute_, attention_,
                                                          defers_head_gradient(B, T));
}

WorkspaceBytes Llama::workspace_bytes(int B, int T, DType dtype, Device device) const {
  const LlamaConfig& c = config_;
  const int64_t layer_ops = std::max(cpu::bf16_swiglu_backward_scratch_bytes(size_t(B) * T * c.ffn_dim),
                                     cpu::bf16_gqa_pack_backward_scratch_bytes(B, T, c.heads, c.kv_heads, c.head_dim()));
  // Its linear layers have no bias and no fused form (its fused ops are the norm's and the SwiGLU's).
  return decoder_workspace_bytes(lora_, B, T, c.dim, c.heads, c.vocab, dtype, device, attention_, false,
                                 defers_head_gradient(B, T), layer_ops);
}

double Llama::flops_per_token(int T) const {
  // Tied, the one matrix counts once, as GPT-2's does: for the head's matmul (the lookup is no matmul).
  return parameter_flops(units()) + 6.0 * config_.layers * double(T) * config_.dim;
}

std::unique_ptr<Llama> make_llama(const ModelConfig& config) { return std::make_unique<Llama>(llama_config_from(config)); }

double Llama::forward_backward(ParamContext& ctx, const Batch& batch, float loss_scale) {
  return run(ctx, batch, true, loss_scale);
}

double Llama::forward(ParamContext& ctx, const Batch& batch) { return run(ctx, batch, false, 0.0f); }

double Llama::run(ParamContext& ctx, const Batch& batch, bool backward, float loss_scale) {
  check_batch("Llama", batch, config_.vocab, config_.ctx);
  return with_compute_type("Llama", ctx, [&](auto type) {
    return run_as<decltype(type)>(ctx, batch, backward, loss_scale);
  });
}

template <class T>
double Llama::run_as(ParamContext& ctx, const Batch& batch, bool backward, float loss_scale) {
  const bool defer = defers_head_gradient(batch.B, batch.T);
  llama::Activations& acts = activations_for(acts_, config_, batch, dtype_of<T>(), ctx.device(), recompute_,
                                             attention_, defer);
  const llama::Layers<T> layers{config_, lora_, acts, uses_fused_epilogues(fused_, ctx.device(), dtype_of<T>())};
  const int L = config_.layers, final_unit = L + 1;
  const bool tied = config_.tie_embeddings;

  run_blocks_forward(ctx, layers, L);
  double loss = 0;
  if (tied) {
    loss = run_final_norm_and_tied_head(ctx, layers, final_unit, llama::kEmbed, backward, defer, loss_scale);
    if (!backward) return loss;
  } else {
    // The head lives in the final unit: the logits, their backward and the final norm's backward all run
    // under one gather, so this unit (as large as the embedding) is gathered once per step, not twice.
    const UnitTensors& p = ctx.gather(final_unit);
    layers.final_norm_forward(p);
    const auto head = layers.head();
    loss = head.forward(p[llama::kLmHead], backward, loss_scale, ctx.loss_sum());
    if (backward) {
      const UnitTensors& g = ctx.grads(final_unit);
      head.input_grad(p[llama::kLmHead]);
      head.weight_grad(g[llama::kLmHead]);
      layers.final_norm_backward(p, g);
    }
    ctx.release(final_unit);
    if (!backward) return loss;
    ctx.grads_ready(final_unit);
  }
  run_blocks_backward(ctx, layers, L, recompute_ == Recompute::blocks);
  run_embedding_backward(ctx, layers, llama::kEmbed, defer);
  return loss;
}

}  // namespace zshard
