// Models by name. A family registers each of its named configurations with the function that builds a
// model from a configuration (GPT-2's: tiny, gpt2, ..., gpt2-xl); a user's binary registers its own
// model the same way (<zshard/train.h>). Every tool finds its model here (--model NAME, with
// --config overrides), and a checkpoint records the name and configuration it was trained with.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <zshard/model.h>
#include <zshard/model_config.h>

namespace zshard {

// Builds the model of a configuration; throws zshard::Error naming the field for an invalid one.
using ModelBuilder = std::function<std::unique_ptr<Model>(const ModelConfig&)>;

// Adds (or replaces) the model `name`. Not thread-safe: register before building models.
void register_model(const std::string& name, ModelConfig defaults, ModelBuilder build);
// Every registered name, sorted.
std::vector<std::string> model_names();

// `name`'s configuration with `overrides` applied, each in the type of the default it replaces (an integer
// given for a real number becomes one). Throws UsageError for an unknown name (listing the known ones), a
// key the model does not have, or a real number where it needs an integer.
ModelConfig model_config(const std::string& name, const ModelConfig& overrides = {});
// Builds `name` with `config` (from model_config); an invalid configuration is a UsageError naming it.
std::unique_ptr<Model> build_model(const std::string& name, const ModelConfig& config);

}  // namespace zshard
