#include <zshard/model_registry.h>

#include <sstream>

#include <zshard/error.h>

#include "kernels/option_names.h"
#include "models/gpt2.h"
#include "models/llama.h"
#include "models/lora.h"

namespace zshard {

namespace {

// Keys a configuration holds only once an override names one of them, and then all of them, at these
// values before the overrides: the LoRA settings (models/lora.h) and Llama's rope scaling, so that a model
// without them keeps the configuration, and the checkpoints, it had before they existed. A group whose
// values are "off" goes again where the overrides leave it so (rope_scaling_factor=0); LoRA's stays, for
// its rank 0 to be refused rather than train nothing.
struct OptionalKeys {
  ModelConfig values;
  bool dropped_when_unchanged = false;
};

struct Entry {
  ModelConfig defaults;
  ModelBuilder build;
  std::vector<OptionalKeys> optional = {};
};

// The built-in families are registered on first use, so that no static initialisation order matters.
std::map<std::string, Entry>& registry() {
  static std::map<std::string, Entry> models = [] {
    std::map<std::string, Entry> builtin;
    for (const auto& [name, config] : gpt2_named_configs())
      builtin[name] = {config, [](const ModelConfig& c) -> std::unique_ptr<Model> { return make_gpt2(c); },
                       {{lora_config_defaults(kGPT2LoraDefaultTargets)}}};
    for (const auto& [name, config] : llama_named_configs())
      builtin[name] = {config, [](const ModelConfig& c) -> std::unique_ptr<Model> { return make_llama(c); },
                       {{lora_config_defaults(kLlamaLoraDefaultTargets)}, {rope_scaling_config_defaults(), true}}};
    return builtin;
  }();
  return models;
}

const Entry& find(const std::string& name) {
  const auto it = registry().find(name);
  if (it != registry().end()) return it->second;
  std::string known;
  for (const std::string& n : model_names()) known += (known.empty() ? "" : ", ") + n;
  throw UsageError(detail::concat(option_name(Option::model), ": unknown model '", name, "' (known: ", known, ")"));
}

}  // namespace

void register_model(const std::string& name, ModelConfig defaults, ModelBuilder build) {
  ZS_CHECK(!name.empty() && build, "register_model: a model needs a name and a builder");
  registry()[name] = {std::move(defaults), std::move(build)};
}

std::vector<std::string> model_names() {
  std::vector<std::string> names;
  for (const auto& [name, entry] : registry()) names.push_back(name);
  return names;
}

ModelConfig model_config(const std::string& name, const ModelConfig& overrides) {
  const Entry& entry = find(name);
  ModelConfig config = entry.defaults;
  for (const auto& [key, value] : overrides)
    for (const OptionalKeys& group : entry.optional)
      if (group.values.count(key)) config.insert(group.values.begin(), group.values.end());
  // Every key is checked before any is applied, so that the listing shows the model's own values rather
  // than some of the overrides.
  for (const auto& [key, value] : overrides)
    if (!config.count(key)) {
      ModelConfig known = config;
      for (const OptionalKeys& group : entry.optional) known.insert(group.values.begin(), group.values.end());
      throw UsageError(detail::concat(option_name(Option::config), ": model '", name, "' has no '", key,
                                      "' (it has, by default: ", config_text(known), ")"));
    }
  for (const auto& [key, value] : overrides) {
    const auto it = config.find(key);
    if (it->second.is_text()) {
      it->second = ConfigValue(value.text());
      continue;
    }
    if (value.is_text())
      throw UsageError(detail::concat(option_name(Option::config), ": ", key, " of model '", name, "' is a number, got '",
                                      value.text(), "'"));
    if (it->second.is_integer() && !value.is_integer())
      throw UsageError(detail::concat(option_name(Option::config), ": ", key, " of model '", name, "' is an integer, got ", value.text()));
    it->second = it->second.is_integer() ? value : ConfigValue(value.number());
  }
  for (const OptionalKeys& group : entry.optional) {
    const auto unchanged = [&](const auto& kv) {
      const auto it = config.find(kv.first);
      return it != config.end() && it->second == kv.second;
    };
    if (group.dropped_when_unchanged && std::all_of(group.values.begin(), group.values.end(), unchanged))
      for (const auto& [key, value] : group.values) config.erase(key);
  }
  return config;
}

std::unique_ptr<Model> build_model(const std::string& name, const ModelConfig& config) {
  std::unique_ptr<Model> model;
  try {
    model = find(name).build(config);
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {
    throw UsageError(detail::concat("model '", name, "' (", config_text(config), "): ", e.what()));
  }
  // A registered builder is the user's code: one that returns nothing is named, not dereferenced later.
  if (!model) throw Error(detail::concat("model '", name, "': its registered builder returned no model"));
  return model;
}

}  // namespace zshard
