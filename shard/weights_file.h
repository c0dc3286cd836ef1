// Matching a model's parameter names (for GPT-2 the Hugging Face names: wte.weight, h.0.attn.c_attn.weight,
// ...) with the tensors of a safetensors file. Files saved from Hugging Face's causal-LM classes carry a
// "transformer." or "model." prefix; buffers (attention masks, rotary frequencies) and a tied lm_head.weight
// are not parameters.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include <zshard/model.h>

#include "kernels/io/safetensors.h"
#include "shard/flat_unit.h"

namespace zshard {

// The file's name for parameter `name`: `name` itself or with one of the prefixes; an error naming the
// file and the parameter when none is present.
std::string resolve_name(const SafetensorsFile& file, const std::string& name);

// Tensors of `file` that match none of `expected` (with or without the prefix) and are not known
// buffers: a non-empty result means the file was saved from another model (e.g. more layers).
std::vector<std::string> unmatched_tensors(const SafetensorsFile& file,
                                           const std::vector<std::string>& expected);

// LoRA adapters (PEFT's names: "<module>.lora_A.weight", "<module>.lora_B.weight") may come in a file of
// their own, and a base model's file has none.
bool is_adapter(std::string_view name);
enum class WeightsCoverage {
  everything,  // every parameter
  base,        // every parameter but the adapters, which keep their values
  adapters,    // the adapters alone, beside the base weights the model has
};
// Which of those `file` is for a model of `units`; an error naming the first missing parameter otherwise.
WeightsCoverage weights_coverage(const SafetensorsFile& file, const std::vector<UnitSpec>& units);
// Writes the adapters among `units`' parameters (F32) from full flat unit buffers (FlatLayout(unit, 1); a unit
// without adapters may have none) under PEFT's names, "base_model.model." in front of the model's: the
// adapter_model.safetensors of PEFT's save_pretrained.
void save_adapters(const std::string& path, const std::vector<UnitSpec>& units,
                   const std::vector<FlatValues>& flat_units);

// Reads the header of `path` and checks that it holds the parameters of `model` (every one, or a base
// or adapter file's share) with their shapes and nothing from another model: the errors a load would
// meet, found before anything is allocated or changed.
// A FIFO or a device is refused before it is opened. Returns which share it holds.
WeightsCoverage check_weights_file(const std::string& path, const Model& model);

}  // namespace zshard
