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

namespace zshard {

// A model's integer hyper-parameters by name, e.g. {"layers": 12, "dim": 768, ...}; each model has its
// own keys.
using ModelConfig = std::map<std::string, int64_t>;
// Builds the model of a configuration; throws zshard::Error naming the field for an invalid one.
using ModelBuilder = std::function<std::unique_ptr<Model>(const ModelConfig&)>;

// Adds (or replaces) the model `name`. Not thread-safe: register before building models.
void register_model(const std::string& name, ModelConfig defaults, ModelBuilder build);
// Every registered name, sorted.
std::vector<std::string> model_names();

// `name`'s configuration with `overrides` applied. Throws UsageError naming --model for an unknown
// name (listing the known ones) and --config for a key the model does not have.
ModelConfig model_config(const std::string& name, const ModelConfig& overrides = {});
// Builds `name` with `config` (from model_config); an invalid configuration is a UsageError naming it.
std::unique_ptr<Model> build_model(const std::string& name, const ModelConfig& config);

// "layers=12, dim=768": how messages and --help show a configuration.
std::string config_text(const ModelConfig& config);

}  // namespace zshard
