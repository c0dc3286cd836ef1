// GPT-2 family hyperparameters, with the named sizes of the released models.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <zshard/model_config.h>

#include "models/lora.h"

namespace zshard {

struct GPT2Config {
  int layers = 0;  // transformer blocks
  int dim = 0;     // channels C
  int heads = 0;   // attention heads; dim % heads == 0
  int vocab = 0;   // V
  int ctx = 0;     // maximum sequence length (rows of wpe)
  LoraSettings lora;  // none by default

  // Throws zshard::Error naming the offending field (UsageError for the LoRA settings).
  void validate() const;
  int head_dim() const { return dim / heads; }
  // Parameter elements, the tied wte counted once; no LoRA adapters.
  int64_t num_params() const;
  // The blocks' LoRA adapters (none without lora.rank); the layers in gpt2::BlockLinear order.
  LoraPlan lora_plan() const;
};

// "tiny" (tests, byte-level default data), "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl".
// Throws zshard::Error listing the valid names for any other name.
GPT2Config gpt2_config(std::string_view name);
std::vector<std::string> gpt2_config_names();

// The registry's form (<zshard/model_config.h>): keys layers, dim, heads, vocab, ctx, and with adapters
// lora_rank, lora_alpha, lora_targets (models/lora.h).
ModelConfig to_model_config(const GPT2Config& config);
// Throws zshard::Error naming a missing key or a value out of range.
GPT2Config gpt2_config_from(const ModelConfig& config);
// Every named size, in the registry's form.
std::vector<std::pair<std::string, ModelConfig>> gpt2_named_configs();

}  // namespace zshard
