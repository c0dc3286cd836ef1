#include "models/gpt2.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include <zshard/error.h>

#include "kernels/cpu/ops.h"
#include "models/gpt2_layers.h"
#include "models/model_support.h"

namespace zshard {

namespace {

constexpr double kGPT2InitStd = 0.02;  // Hugging Face's initializer_range

std::vector<ParamDef> param_defs(const GPT2Config& c, const LoraPlan& lora, int unit) {
  const int final_unit = c.layers + 1;
  ZS_CHECK(unit >= 0 && unit <= final_unit, "GPT-2 has units 0..", final_unit, ", not ", unit);
  const int64_t C = c.dim;
  const auto mat = [](std::string name, Shape shape, double std) {
    return ParamDef{{std::move(name), std::move(shape), true}, 0.0, std};
  };
  const auto vec = [](std::string name, int64_t n, double value) {
    return ParamDef{{std::move(name), {n}, false}, value, 0.0};
  };
  std::vector<ParamDef> defs;
  if (unit == 0) defs = {mat("wte.weight", {c.vocab, C}, kGPT2InitStd), mat("wpe.weight", {c.ctx, C}, kGPT2InitStd)};
  if (unit == final_unit) defs = {vec("ln_f.weight", C, 1.0), vec("ln_f.bias", C, 0.0)};
  if (!defs.empty()) {
    lora.freeze(defs);
    return defs;
  }
  // The two projections into the residual stream start smaller, so that its variance does not grow
  // with depth (GPT-2 paper, Hugging Face init).
  const double proj_std = kGPT2InitStd / std::sqrt(2.0 * c.layers);
  const std::string h = "h." + std::to_string(unit - 1) + ".";
  defs = {
      vec(h + "ln_1.weight", C, 1.0),
      vec(h + "ln_1.bias", C, 0.0),
      mat(h + "attn.c_attn.weight", {C, 3 * C}, kGPT2InitStd),
      vec(h + "attn.c_attn.bias", 3 * C, 0.0),
      mat(h + "attn.c_proj.weight", {C, C}, proj_std),
      vec(h + "attn.c_proj.bias", C, 0.0),
      vec(h + "ln_2.weight", C, 1.0),
      vec(h + "ln_2.bias", C, 0.0),
      mat(h + "mlp.c_fc.weight", {C, 4 * C}, kGPT2InitStd),
      vec(h + "mlp.c_fc.bias", 4 * C, 0.0),
      mat(h + "mlp.c_proj.weight", {4 * C, C}, proj_std),
      vec(h + "mlp.c_proj.bias", C, 0.0),
  };
  ZS_CHECK(defs.size() == gpt2::kNumBlockParams, "GPT-2 block params out of step with gpt2::BlockParam");
  lora.adapt_block(defs, h);
  return defs;
}

std::string unit_name(const GPT2Config& c, int unit) {
  if (unit == 0) return "embed";
  if (unit == c.layers + 1) return "ln_f";
  return "h." + std::to_string(unit - 1);
}

}  // namespace

GPT2::GPT2(GPT2Config config) : config_(std::move(config)) {
  config_.validate();
  lora_ = config_.lora_plan();
}

GPT2::~GPT2() = default;

std::vector<UnitSpec> GPT2::units() const {
  return units_from_defs(
      num_units(), [&](int u) { return unit_name(config_, u); }, [&](int u) { return param_defs(config_, lora_, u); });
}

void GPT2::init_unit(int unit, const UnitTensors& params, uint64_t seed) const {
  init_params("GPT-2", param_defs(config_, lora_, unit), params, unit, seed);
}

double GPT2::flops_per_token(int T) const {
  return parameter_flops(units()) + 6.0 * config_.layers * double(T) * config_.dim;
}

std::unique_ptr<GPT2> make_gpt2(const ModelConfig& config) { return std::make_unique<GPT2>(gpt2_config_from(config)); }

void GPT2::set_attention(AttentionKernel kernel) { attention_ = decoder_attention(kernel); }

int64_t GPT2::activation_bytes(int B, int T, DType dtype) const {
  ZS_CHECK(B > 0 && T > 0, "GPT-2 activation_bytes: B and T must be positive, got B=", B, " T=", T);
  return decoder_activation_bytes<gpt2::Activations>(config_, B, T, dtype, recompute_, attention_,
                                                          defers_head_gradient(B, T));
}

WorkspaceBytes GPT2::workspace_bytes(int B, int T, DType dtype, Device device) const {
  const bool fused = uses_fused_epilogues(fused_, device, dtype);
  const bool through_gelu = fused && lora_.adapter(gpt2::kFcOut) < 0;  // as block_backward
  const int64_t gelu = through_gelu ? 0 : cpu::bf16_gelu_backward_scratch_bytes(size_t(B) * T * 4 * config_.dim);
  return decoder_workspace_bytes(lora_, B, T, config_.dim, config_.heads, config_.vocab, dtype, device, attention_,
                                 fused, defers_head_gradient(B, T), gelu);
}

double GPT2::forward_backward(ParamContext& ctx, const Batch& batch, float loss_scale) {
  return run(ctx, batch, true, loss_scale);
}

double GPT2::forward(ParamContext& ctx, const Batch& batch) { return run(ctx, batch, false, 0.0f); }

double GPT2::run(ParamContext& ctx, const Batch& batch, bool backward, float loss_scale) {
  check_batch("GPT-2", batch, config_.vocab, config_.ctx);
  return with_compute_type("GPT-2", ctx, [&](auto type) {
    return run_as<decltype(type)>(ctx, batch, backward, loss_scale);
  });
}

template <class T>
double GPT2::run_as(ParamContext& ctx, const Batch& batch, bool backward, float loss_scale) {
  const bool defer = defers_head_gradient(batch.B, batch.T);
  gpt2::Activations& acts = activations_for(acts_, config_, batch, dtype_of<T>(), ctx.device(), recompute_,
                                            attention_, defer);
  const gpt2::Layers<T> layers{config_, lora_, acts, uses_fused_epilogues(fused_, ctx.device(), dtype_of<T>())};
  const int L = config_.layers, final_unit = L + 1;

  run_blocks_forward(ctx, layers, L);
  const double loss =
      run_final_norm_and_tied_head(ctx, layers, final_unit, gpt2::kWte, backward, defer, loss_scale);
  if (!backward) return loss;
  run_blocks_backward(ctx, layers, L, recompute_ == Recompute::blocks);
  run_embedding_backward(ctx, layers, gpt2::kWte, defer);
  return loss;
}

}  // namespace zshard
