#include "models/gpt2_config.h"

#include <array>

#include <zshard/error.h>

#include "models/gpt2_layers.h"
#include "models/model_support.h"

namespace zshard {

namespace {
struct NamedGPT2Config {
  std::string_view name;
  GPT2Config config;
};

constexpr int kGPT2Vocab = 50257;
constexpr int kGPT2Ctx = 1024;

const std::array<NamedGPT2Config, 5> kGPT2Configs = {{
    {"tiny", {2, 64, 4, 256, 128, {}}},
    {"gpt2", {12, 768, 12, kGPT2Vocab, kGPT2Ctx, {}}},
    {"gpt2-medium", {24, 1024, 16, kGPT2Vocab, kGPT2Ctx, {}}},
    {"gpt2-large", {36, 1280, 20, kGPT2Vocab, kGPT2Ctx, {}}},
    {"gpt2-xl", {48, 1600, 25, kGPT2Vocab, kGPT2Ctx, {}}},
}};
}  // namespace

void GPT2Config::validate() const {
  if (!(layers > 0 && dim > 0 && heads > 0 && vocab > 0 && ctx > 0))
    fail("GPT-2 config: layers, dim, heads, vocab and ctx must all be positive, got layers=", layers, " dim=", dim,
         " heads=", heads, " vocab=", vocab, " ctx=", ctx);
  if (dim % heads != 0) fail("GPT-2 config: dim ", dim, " is not divisible by heads ", heads);
  // In double: the int64 count overflows first.
  const double C = dim;
  const double params = double(vocab) * C + double(ctx) * C + double(layers) * (12 * C * C + 13 * C) + 2 * C;
  check_model_size("GPT-2 config", layers, params);
  lora_plan();
}

LoraPlan GPT2Config::lora_plan() const {
  const int64_t C = dim;
  return LoraPlan(lora, {{"attn.c_attn", C, 3 * C}, {"attn.c_proj", C, C}, {"mlp.c_fc", C, 4 * C}, {"mlp.c_proj", 4 * C, C}},
                  gpt2::kNumBlockParams, ops::WeightLayout::in_out, "GPT-2");
}

int64_t GPT2Config::num_params() const {
  const int64_t C = dim;
  const int64_t per_block = 12 * C * C + 13 * C;  // 4 matrices (3C^2, C^2, 4C^2, 4C^2) + biases + 2 LNs
  return int64_t(vocab) * C + int64_t(ctx) * C + layers * per_block + 2 * C;
}

GPT2Config gpt2_config(std::string_view name) {
  for (const NamedGPT2Config& named : kGPT2Configs)
    if (named.name == name) return named.config;
  std::string valid;
  for (const std::string& n : gpt2_config_names()) valid += (valid.empty() ? "" : ", ") + n;
  fail("unknown GPT-2 config '", name, "' (valid: ", valid, ")");
}

std::vector<std::string> gpt2_config_names() {
  std::vector<std::string> names;
  for (const NamedGPT2Config& named : kGPT2Configs) names.emplace_back(named.name);
  return names;
}

ModelConfig to_model_config(const GPT2Config& c) {
  ModelConfig config = {{"layers", c.layers}, {"dim", c.dim}, {"heads", c.heads}, {"vocab", c.vocab}, {"ctx", c.ctx}};
  add_lora_config(config, c.lora);
  return config;
}

GPT2Config gpt2_config_from(const ModelConfig& config) {
  const auto field = [&](const char* key) {
    const auto it = config.find(key);
    if (it == config.end()) fail("GPT-2 config: no '", key, "'");
    const int64_t v = it->second.is_integer() ? it->second.integer() : 0;
    if (!(it->second.is_integer() && v > 0 && v <= (int64_t(1) << 30)))
      fail("GPT-2 config: ", key, " must be an integer in [1, 2^30], got ", it->second.text());
    return int(v);
  };
  GPT2Config c{field("layers"), field("dim"), field("heads"), field("vocab"), field("ctx"), lora_settings_from(config)};
  c.validate();
  return c;
}

std::vector<std::pair<std::string, ModelConfig>> gpt2_named_configs() {
  std::vector<std::pair<std::string, ModelConfig>> out;
  for (const NamedGPT2Config& named : kGPT2Configs) out.emplace_back(named.name, to_model_config(named.config));
  return out;
}

}  // namespace zshard
