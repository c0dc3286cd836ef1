// Matching GPT-2 parameter names (Hugging Face names: wte.weight, h.0.attn.c_attn.weight, ...) with the
// tensors of a safetensors file. Files saved from GPT2LMHeadModel carry a "transformer." prefix; buffers
// (h.N.attn.bias, h.N.attn.masked_bias) and lm_head.weight (tied to wte) are not parameters.
#pragma once
#include <string>
#include <vector>

#include "models/safetensors.h"

namespace zshard {

// The file's name for parameter `name`: `name` itself or "transformer." + name; an error naming the
// file and the parameter when neither is present.
std::string resolve_name(const SafetensorsFile& file, const std::string& name);

// Tensors of `file` that match none of `expected` (with or without the prefix) and are not known
// buffers: a non-empty result means the file was saved from another model (e.g. more layers).
std::vector<std::string> unmatched_tensors(const SafetensorsFile& file,
                                           const std::vector<std::string>& expected);

}  // namespace zshard
