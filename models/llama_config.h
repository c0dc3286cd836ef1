// Llama family hyper-parameters (RMSNorm, rotary embeddings, grouped-query attention, SwiGLU, no biases),
// with named sizes: llama-tiny (tests and the embedded corpus), TinyLlama-1.1B and Llama-3.2-1B (their
// published configs, Llama 3.2's "llama3" rotary frequency scaling included).
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <zshard/model_config.h>
#include <zshard/ops.h>

#include "models/lora.h"

namespace zshard {

struct LlamaConfig {
  int layers = 0;
  int dim = 0;       // C
  int heads = 0;     // query heads
  int kv_heads = 0;  // key/value heads, dividing heads (grouped-query attention)
  int ffn_dim = 0;   // the SwiGLU MLP's hidden width
  int vocab = 0;
  int ctx = 0;       // maximum sequence length
  double rope_theta = 10000;
  bool tie_embeddings = false;  // the output head reuses the token embedding
  LoraSettings lora;            // none by default
  ops::RopeScaling rope_scaling;  // Llama 3's rescaled long wavelengths; none by default

  ops::RopeFrequencies rope() const { return {rope_theta, rope_scaling}; }
  // Throws zshard::Error naming the offending field (UsageError for the LoRA settings).
  void validate() const;
  int head_dim() const { return dim / heads; }
  int kv_dim() const { return kv_heads * head_dim(); }
  int64_t num_params() const;  // no LoRA adapters
  // The layers' LoRA adapters (none without lora.rank); the projections in llama::LayerLinear order.
  LoraPlan lora_plan() const;
};

constexpr float kRmsNormEps = 1e-5f;  // every named size's rms_norm_eps

// The registry's form (keys layers, dim, heads, kv_heads, ffn_dim, vocab, ctx, rope_theta, tie_embeddings,
// with adapters lora_rank, lora_alpha, lora_targets (models/lora.h), and with rope scaling the
// kRopeScalingKeys), and back (throws zshard::Error naming a missing key or a value out of range).
ModelConfig to_model_config(const LlamaConfig& config);
LlamaConfig llama_config_from(const ModelConfig& config);
std::vector<std::pair<std::string, ModelConfig>> llama_named_configs();
// Hugging Face's rope_scaling fields as config keys, present only where a configuration rescales, so that
// one without keeps the configuration, and the checkpoints, it had before they existed: factor,
// low_freq_factor, high_freq_factor, original_max_position_embeddings.
inline constexpr const char* kRopeScalingKeys[] = {"rope_scaling_factor", "rope_low_freq_factor",
                                                  "rope_high_freq_factor", "rope_original_ctx"};
ModelConfig rope_scaling_config_defaults();  // their values when an override names one
LlamaConfig llama_config(const std::string& name);  // a named size; throws for an unknown name

}  // namespace zshard
