// LoRA adapters (Hu et al. 2021) on the hand-written decoders' linear layers, with PEFT's semantics: the
// settings a model's configuration carries (lora_rank, lora_alpha, lora_targets), which layers a target
// names, the adapters' parameters beside their layer's in its block unit, their init, and the freezing of
// every other parameter (PEFT's default, bias="none"), and the adapters folded into their layers' weights
// (PEFT's merge_and_unload). The math is ops::lora_linear_forward/backward.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include <zshard/model_config.h>
#include <zshard/ops.h>
#include <zshard/tensor.h>

#include "kernels/allocator.h"
#include "models/model_support.h"

namespace zshard {

// The LoRA keys of a model's configuration. rank 0: no adapters, and the configuration holds none of the
// keys (models/model_registry.cpp adds them, at lora_config_defaults, once one is set).
struct LoraSettings {
  int rank = 0;
  double alpha = 8;     // PEFT's LoraConfig default
  std::string targets;  // module-name suffixes, comma separated ("c_attn", "q_proj,v_proj")
  bool enabled() const { return rank > 0; }
};

// PEFT's default targets for the two families (its TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING).
inline constexpr std::string_view kGPT2LoraDefaultTargets = "c_attn";
inline constexpr std::string_view kLlamaLoraDefaultTargets = "q_proj,v_proj";

// lora_rank 0, lora_alpha 8.0 and lora_targets `default_targets`: the keys' values before the overrides.
// A rank left at 0 beside another key is refused (lora_settings_from), so lora_alpha alone adapts nothing
// unnoticed.
ModelConfig lora_config_defaults(std::string_view default_targets);
// The settings in `config`: none when it has no LoRA key. UsageError naming the key for a rank below 1 or an
// alpha that is not a positive finite number.
LoraSettings lora_settings_from(const ModelConfig& config);
// Adds the keys to `config` when the settings adapt anything.
void add_lora_config(ModelConfig& config, const LoraSettings& lora);

// A parameter's name, shape and values (fp32, in its saved layout).
struct NamedWeight {
  std::string name;
  Shape shape;
  TrackedFloats values;
};

// The adapter_config.json in the directory of adapter file `weights_path`: PEFT loads a directory.
std::string adapter_config_path(const std::string& weights_path);

// Which of a block's linear layers the settings adapt, and where each adapter's two parameters sit in the
// block unit: after the block's own parameters, lora_A.weight (R, in) then lora_B.weight (out, R), in the
// order of the layers. The layers' weights are stored in `layout`: GPT-2's Conv1D (in, out), Llama's
// nn.Linear (out, in).
class LoraPlan {
 public:
  // A linear layer of a block: its name inside the block as the model's parameter names write it
  // ("attn.c_proj", "self_attn.q_proj"), and its sizes.
  struct Layer {
    std::string name;
    int64_t in, out;
  };

  LoraPlan() = default;  // no adapters
  // UsageError for a target that names no layer (listing the valid ones) or a rank above a targeted layer's
  // min(in, out); `model` ("GPT-2") starts the message. A target names every layer whose name it ends, at a
  // dot: c_proj names attn.c_proj and mlp.c_proj, as PEFT's target_modules; attn.c_proj names one.
  LoraPlan(const LoraSettings& settings, std::vector<Layer> layers, int block_params, ops::WeightLayout layout,
           const std::string& model);

  bool enabled() const { return settings_.enabled(); }
  int rank() const { return settings_.rank; }
  float scale() const { return float(settings_.alpha / settings_.rank); }  // PEFT's scaling, alpha / r
  ops::WeightLayout layout() const { return layout_; }
  const std::vector<Layer>& layers() const { return layers_; }  // adapted or not
  // Index of layer i's lora_A.weight in the block unit (its lora_B.weight is the next), or -1: not adapted.
  int adapter(int layer) const { return adapter_.empty() ? -1 : adapter_[size_t(layer)]; }

  // A block's definitions, named after `prefix` ("h.0."): with LoRA every one frozen and the adapters added.
  // A: Kaiming-uniform as PEFT's (uniform within 1/sqrt(in)) from streams of their own, so that adding
  // adapters changes no other parameter's values; B: zeros, so that the adapted model starts as the base.
  void adapt_block(std::vector<ParamDef>& defs, const std::string& prefix) const;
  // The embedding's or final unit's definitions: with LoRA every one frozen.
  void freeze(std::vector<ParamDef>& defs) const;
  // The adapted layers' saved inp @ A^T, (S, B, T, R) each, kept in `hidden` (one entry per layer, those
  // not adapted left empty).
  void visit_hidden(std::vector<Tensor>& hidden, int B, int T, int64_t S, DType dtype, const BufferVisitor& f) const;
  // `weights` (every parameter of the adapted model, or of one of its units, where each adapter sits beside
  // its layer; any order) become the weights of the same model without
  // adapters, which compute what it computes: each `<layer>.weight` plus scale * B @ A (transposed into an
  // (in, out) layout), and every `<layer>.lora_A.weight` and `.lora_B.weight` dropped. Error naming the
  // parameter for an adapter without its partner or layer, or with shapes that do not fit them.
  void merge(std::vector<NamedWeight>& weights) const;
  // PEFT's adapter_config.json of these adapters (peft_type, r, lora_alpha, target_modules, fan_in_fan_out
  // for an (in, out) layout, bias): what PeftModel.from_pretrained reads beside adapter_model.safetensors.
  std::string peft_config() const;
  // `config` with its LoRA targets written as the layers they name here, each once, sorted
  // ("attn.c_attn,mlp.c_proj"): PEFT's target_modules is a set of name suffixes, so targets naming the same
  // layers in another order or spelling are the same model. A target that names no layer is kept as written.
  ModelConfig with_targeted_layers(ModelConfig config) const;
  // UsageError naming the flag when PEFT's adapter_config.json `config`, read from `path`, describes other
  // adapters than these: another r, lora_alpha or set of target_modules (a key it lacks, or target_modules
  // that is not a list of names, is not checked).
  // Another alpha would scale loaded adapters silently.
  void check_peft_config(const nlohmann::json& config, const std::string& path) const;

 private:
  LoraSettings settings_;
  std::vector<Layer> layers_;
  ops::WeightLayout layout_ = ops::WeightLayout::out_in;
  std::vector<int> adapter_;
};

// What a model with LoRA adapters tells the tools that handle its weights (zshard-export --merge-lora).
class LoraModel {
 public:
  virtual ~LoraModel() = default;
  virtual const LoraPlan& lora_plan() const = 0;  // adapting nothing without LoRA settings
};

}  // namespace zshard
