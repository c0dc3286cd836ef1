// Matching a model's parameter names (for GPT-2 the Hugging Face names: wte.weight, h.0.attn.c_attn.weight,
// ...) with the tensors of a safetensors file. Files saved from Hugging Face's causal-LM classes carry a
// "transformer." or "model." prefix; buffers (attention masks, rotary frequencies) and a tied lm_head.weight
// are not parameters.
#pragma once
#include <string>
#include <vector>

#include <zshard/model.h>

#include "kernels/io/safetensors.h"

namespace zshard {

// The file's name for parameter `name`: `name` itself or with one of the prefixes; an error naming the
// file and the parameter when none is present.
std::string resolve_name(const SafetensorsFile& file, const std::string& name);

// Tensors of `file` that match none of `expected` (with or without the prefix) and are not known
// buffers: a non-empty result means the file was saved from another model (e.g. more layers).
std::vector<std::string> unmatched_tensors(const SafetensorsFile& file,
                                           const std::vector<std::string>& expected);

// Reads the header of `path` and checks that it holds every parameter of `model` with its shape and
// nothing from another model: the errors a load would meet, found before anything is allocated or changed.
// A FIFO or a device is refused before it is opened.
void check_weights_file(const std::string& path, const Model& model);

}  // namespace zshard
