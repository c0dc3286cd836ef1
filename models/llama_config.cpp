#include "models/llama_config.h"

#include <array>
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
    {"llama-tiny", {2, 64, 4, 2, 192, 256, 128, 10000, false, {}}},
    {"tinyllama-1.1b", {22, 2048, 32, 4, 5632, 32000, 2048, 10000, false, {}}},
    {"llama-3.2-1b", {16, 2048, 32, 8, 8192, 128256, 131072, 500000, true, {}}},
}};

}  // namespace

void LlamaConfig::validate() const {
  if (!(layers > 0 && dim > 0 && heads > 0 && kv_heads > 0 && ffn_dim > 0 && vocab > 0 && ctx > 0))
    fail("Llama config: layers, dim, heads, kv_heads, ffn_dim, vocab and ctx must all be positive");
  if (dim % heads != 0) fail("Llama config: dim ", dim, " is not divisible by heads ", heads);
  if (heads % kv_heads != 0) fail("Llama config: heads ", heads, " is not divisible by kv_heads ", kv_heads);
  if (head_dim() % 2 != 0) fail("Llama config: the head size ", head_dim(), " must be even (rotary pairs)");
  if (!(rope_theta > 1)) fail("Llama config: rope_theta must be > 1, got ", rope_theta);
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
  return config;
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
                lora_settings_from(config)};
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
