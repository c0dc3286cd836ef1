#include "models/llama_config.h"

#include <array>
#include <cmath>
#include <string_view>

#include <zshard/error.h>

#include "models/llama_layers.h"
#include "models/model_support.h"

namespace zshard {

namespace {

struct NamedLlamaConfig {
  std::string_view name;
  LlamaConfig config;
};

// TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T and meta-llama/Llama-3.2-1B config.json.
const std::array<NamedLlamaConfig, 3> kLlamaConfigs = {{
    {"llama-tiny", {2, 64, 4, 2, 192, 256, 128, 10000, false, {}, {}}},
    {"tinyllama-1.1b", {22, 2048, 32, 4, 5632, 32000, 2048, 10000, false, {}, {}}},
    {"llama-3.2-1b", {16, 2048, 32, 8, 8192, 128256, 131072, 500000, true, {}, {32, 1, 4, 8192}}},
}};

}  // namespace

void LlamaConfig::validate() const {
  if (!(layers > 0 && dim > 0 && heads > 0 && kv_heads > 0 && ffn_dim > 0 && vocab > 0 && ctx > 0))
    fail("Llama config: layers, dim, heads, kv_heads, ffn_dim, vocab and ctx must all be positive");
  if (dim % heads != 0) fail("Llama config: dim ", dim, " is not divisible by heads ", heads);
  if (heads % kv_heads != 0) fail("Llama config: heads ", heads, " is not divisible by kv_heads ", kv_heads);
  if (head_dim() % 2 != 0) fail("Llama config: the head size ", head_dim(), " must be even (rotary pairs)");
  if (!(rope_theta > 1)) fail("Llama config: rope_theta must be > 1, got ", rope_theta);
  if (const ops::RopeScaling& s = rope_scaling; s.factor != 0) {
    // The interpolation divides by high - low; HF's checks, and a context the wavelengths are measured by.
    if (!(s.factor >= 1)) fail("Llama config: rope_scaling_factor must be >= 1 (0: none), got ", s.factor);
    if (!(s.low_freq_factor > 0 && s.high_freq_factor > s.low_freq_factor))
      fail("Llama config: rope_high_freq_factor must exceed rope_low_freq_factor, which must be > 0, got ",
           s.high_freq_factor, " and ", s.low_freq_factor);
    if (!(s.original_ctx >= 1)) fail("Llama config: rope_original_ctx must be >= 1, got ", s.original_ctx);
  }
  // In double: the int64 count overflows first.
  const double C = dim, KV = kv_dim(), F = ffn_dim, V = vocab;
  const double params = V * C * (tie_embeddings ? 1 : 2) + double(layers) * (2 * C + 2 * C * C + 2 * C * KV + 3 * C * F) + C;
  check_model_size("Llama config", layers, params);
  lora_plan();
}

LoraPlan LlamaConfig::lora_plan() const {
  const int64_t C = dim, KV = kv_dim(), F = ffn_dim;
  return LoraPlan(lora,
                  {{"self_attn.q_proj", C, C}, {"self_attn.k_proj", C, KV}, {"self_attn.v_proj", C, KV},
                   {"self_attn.o_proj", C, C}, {"mlp.gate_proj", C, F}, {"mlp.up_proj", C, F}, {"mlp.down_proj", F, C}},
                  llama::kNumLayerParams, ops::WeightLayout::out_in, "Llama");
}

int64_t LlamaConfig::num_params() const {
  const int64_t C = dim, KV = kv_dim(), F = ffn_dim, V = vocab;
  const int64_t per_layer = 2 * C + 2 * C * C + 2 * C * KV + 3 * C * F;  // 2 norms, q o, k v, gate up down
  return V * C + layers * per_layer + C + (tie_embeddings ? 0 : V * C);
}

ModelConfig to_model_config(const LlamaConfig& c) {
  ModelConfig config = {{"layers", c.layers},   {"dim", c.dim},     {"heads", c.heads},
                        {"kv_heads", c.kv_heads}, {"ffn_dim", c.ffn_dim}, {"vocab", c.vocab},
                        {"ctx", c.ctx},         {"rope_theta", c.rope_theta}, {"tie_embeddings", c.tie_embeddings}};
  add_lora_config(config, c.lora);
  if (c.rope_scaling.factor != 0) {
    const ops::RopeScaling& s = c.rope_scaling;
    config[kRopeScalingKeys[0]] = s.factor;
    config[kRopeScalingKeys[1]] = s.low_freq_factor;
    config[kRopeScalingKeys[2]] = s.high_freq_factor;
    config[kRopeScalingKeys[3]] = int64_t(s.original_ctx);
  }
  return config;
}

ModelConfig rope_scaling_config_defaults() {
  const ops::RopeScaling none;
  return {{kRopeScalingKeys[0], none.factor},
          {kRopeScalingKeys[1], none.low_freq_factor},
          {kRopeScalingKeys[2], none.high_freq_factor},
          {kRopeScalingKeys[3], int64_t(none.original_ctx)}};
}

LlamaConfig llama_config_from(const ModelConfig& config) {
  const auto value = [&](const char* key) -> const ConfigValue& {
    const auto it = config.find(key);
    if (it == config.end()) fail("Llama config: no '", key, "'");
    return it->second;
  };
  const auto field = [&](const char* key, int64_t lo, int64_t hi) {
    const ConfigValue& v = value(key);
    if (!(v.is_integer() && v.integer() >= lo && v.integer() <= hi))
      fail("Llama config: ", key, " must be an integer in [", lo, ", ", hi, "], got ", v.text());
    return v.integer();
  };
  constexpr int64_t kBig = int64_t(1) << 30;
  const double theta = value("rope_theta").number();
  if (!(theta >= 2 && theta <= double(kBig)))
    fail("Llama config: rope_theta must be in [2, ", kBig, "], got ", value("rope_theta").text());
  LlamaConfig c{int(field("layers", 1, kBig)),      int(field("dim", 1, kBig)),   int(field("heads", 1, kBig)),
                int(field("kv_heads", 1, kBig)),    int(field("ffn_dim", 1, kBig)), int(field("vocab", 1, kBig)),
                int(field("ctx", 1, kBig)),         theta, field("tie_embeddings", 0, 1) == 1,
                lora_settings_from(config), {}};
  if (config.count(kRopeScalingKeys[0])) {
    const auto real = [&](const char* key) {
      const ConfigValue& v = value(key);
      if (v.is_text() || !std::isfinite(v.number())) fail("Llama config: ", key, " must be a number, got ", v.text());
      return v.number();
    };
    c.rope_scaling = {real(kRopeScalingKeys[0]), real(kRopeScalingKeys[1]), real(kRopeScalingKeys[2]),
                      double(field(kRopeScalingKeys[3], 1, kBig))};
    const ops::RopeScaling& s = c.rope_scaling;
    const ops::RopeScaling none;
    if (s.factor == 0 && (s.low_freq_factor != none.low_freq_factor || s.high_freq_factor != none.high_freq_factor ||
                          s.original_ctx != none.original_ctx))
      fail("Llama config: the rope_* scaling keys rescale nothing without rope_scaling_factor (>= 1)");
  }
  c.validate();
  return c;
}

std::vector<std::pair<std::string, ModelConfig>> llama_named_configs() {
  std::vector<std::pair<std::string, ModelConfig>> out;
  for (const NamedLlamaConfig& named : kLlamaConfigs) out.emplace_back(named.name, to_model_config(named.config));
  return out;
}

LlamaConfig llama_config(const std::string& name) {
  for (const NamedLlamaConfig& named : kLlamaConfigs)
    if (named.name == name) return named.config;
  fail("unknown Llama config '", name, "'");
}

}  // namespace zshard
