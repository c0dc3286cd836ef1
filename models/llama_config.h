// Llama family hyper-parameters (RMSNorm, rotary embeddings, grouped-query attention, SwiGLU, no biases),
// with named sizes: llama-tiny (tests and the embedded corpus), TinyLlama-1.1B and Llama-3.2-1B (their
// published configs; Llama 3.2's "llama3" rotary frequency scaling is not modelled).
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <zshard/model_config.h>

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
// and with adapters lora_rank, lora_alpha, lora_targets: models/lora.h), and back (throws zshard::Error naming a missing key or a value out of range).
ModelConfig to_model_config(const LlamaConfig& config);
LlamaConfig llama_config_from(const ModelConfig& config);
std::vector<std::pair<std::string, ModelConfig>> llama_named_configs();
LlamaConfig llama_config(const std::string& name);  // a named size; throws for an unknown name

}  // namespace zshard
