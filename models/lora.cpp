#include "models/lora.h"

#include <algorithm>
#include <filesystem>
#include <cmath>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include <zshard/error.h>

#include "kernels/option_names.h"

namespace zshard {

namespace {

constexpr const char* kRankKey = "lora_rank";
constexpr const char* kAlphaKey = "lora_alpha";
constexpr const char* kTargetsKey = "lora_targets";
constexpr std::string_view kASuffix = ".lora_A.weight", kBSuffix = ".lora_B.weight";

// The adapters' random streams start here, beyond any unit's parameter count, so that they are their own.
constexpr int64_t kAdapterStreams = int64_t(1) << 32;

std::vector<std::string> split_targets(const std::string& text) {
  std::vector<std::string> items;
  for (size_t begin = 0;;) {
    const size_t comma = text.find(',', begin);
    items.push_back(text.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin));
    if (comma == std::string::npos) return items;
    begin = comma + 1;
  }
}

// PEFT's suffix match: the whole name, or its end after a dot.
bool names(const std::string& target, const std::string& layer) {
  if (target == layer) return true;
  return layer.size() > target.size() && layer.ends_with(target) && layer[layer.size() - target.size() - 1] == '.';
}

// The indices of the layers `targets` name.
std::set<size_t> layers_named(const std::vector<std::string>& targets, const std::vector<LoraPlan::Layer>& layers) {
  std::set<size_t> named;
  for (const std::string& target : targets)
    for (size_t i = 0; i < layers.size(); ++i)
      if (names(target, layers[i].name)) named.insert(i);
  return named;
}

// The targets that name a layer: every layer's last name, then its whole name (the layers' names have one
// dot at most).
std::string valid_targets(const std::vector<LoraPlan::Layer>& layers) {
  std::vector<std::string> valid;
  const auto add = [&](const std::string& name) {
    if (std::find(valid.begin(), valid.end(), name) == valid.end()) valid.push_back(name);
  };
  for (const LoraPlan::Layer& layer : layers) add(layer.name.substr(layer.name.rfind('.') + 1));  // npos + 1 = 0
  for (const LoraPlan::Layer& layer : layers) add(layer.name);
  std::string text;
  for (const std::string& v : valid) text += (text.empty() ? "" : ", ") + v;
  return text;
}

}  // namespace

std::string adapter_config_path(const std::string& weights_path) {
  return (std::filesystem::path(weights_path).parent_path() / "adapter_config.json").string();
}

ModelConfig lora_config_defaults(std::string_view default_targets) {
  return {{kRankKey, 0}, {kAlphaKey, LoraSettings{}.alpha}, {kTargetsKey, std::string(default_targets)}};
}

LoraSettings lora_settings_from(const ModelConfig& config) {
  const auto rank = config.find(kRankKey), alpha = config.find(kAlphaKey), targets = config.find(kTargetsKey);
  if (rank == config.end() && alpha == config.end() && targets == config.end()) return {};
  const auto usage = [](Option option, const auto&... parts) {
    throw UsageError(detail::concat(option_name(option), parts...));
  };
  if (rank == config.end() || !rank->second.is_integer() || rank->second.integer() < 1)
    usage(Option::lora_rank, " must be at least 1 (the adapters' rank), got ",
          rank == config.end() ? "none" : rank->second.text());
  constexpr int64_t kMaxRank = int64_t(1) << 30;  // far beyond any layer, and an int
  if (rank->second.integer() > kMaxRank)
    usage(Option::lora_rank, " must be at most ", kMaxRank, ", got ", rank->second.text());
  LoraSettings lora;
  lora.rank = int(rank->second.integer());
  if (alpha != config.end()) {
    if (alpha->second.is_text() || !(std::isfinite(alpha->second.number()) && alpha->second.number() > 0))
      usage(Option::lora_alpha, " must be a positive finite number, got ", alpha->second.text());
    lora.alpha = alpha->second.number();
  }
  if (targets != config.end()) lora.targets = targets->second.text();
  if (lora.targets.empty()) usage(Option::lora_targets, " names no layer");
  return lora;
}

void add_lora_config(ModelConfig& config, const LoraSettings& lora) {
  if (!lora.enabled()) return;
  config[kRankKey] = lora.rank;
  config[kAlphaKey] = lora.alpha;
  config[kTargetsKey] = lora.targets;
}

LoraPlan::LoraPlan(const LoraSettings& settings, std::vector<Layer> layers, int block_params, ops::WeightLayout layout,
                   const std::string& model)
    : settings_(settings), layers_(std::move(layers)), layout_(layout) {
  if (!settings_.enabled()) return;
  const std::vector<std::string> targets = split_targets(settings_.targets);
  for (const std::string& target : targets)
    if (layers_named({target}, layers_).empty())
      throw UsageError(detail::concat(option_name(Option::lora_targets), ": ", model, " has no layer '", target,
                                      "' (valid: ", valid_targets(layers_), ")"));
  int next = block_params;
  adapter_.assign(layers_.size(), -1);
  for (size_t i : layers_named(targets, layers_)) {
    const Layer& layer = layers_[i];
    if (settings_.rank > std::min(layer.in, layer.out))
      throw UsageError(detail::concat(option_name(Option::lora_rank), " ", settings_.rank, " is larger than ", model,
                                      "'s ", layer.name, " allows (", layer.in, " in, ", layer.out, " out)"));
    adapter_[i] = next;
    next += 2;
  }
}

void LoraPlan::adapt_block(std::vector<ParamDef>& defs, const std::string& prefix) const {
  if (!enabled()) return;
  freeze(defs);
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (adapter_[i] < 0) continue;
    const Layer& layer = layers_[i];
    const std::string name = prefix + layer.name;
    const int64_t R = settings_.rank;
    // Decayed as matrices are: Hugging Face's Trainer decays every weight that is not a bias or a norm gain.
    // Appended rather than added with operator+, which GCC 12 warns about falsely here (-Wrestrict).
    std::string a_name = name, b_name = name;
    a_name += kASuffix;
    b_name += kBSuffix;
    ParamDef a{{a_name, {R, layer.in}, true}, 0.0, 0.0};
    a.init_bound = 1.0 / std::sqrt(double(layer.in));
    a.stream = kAdapterStreams + int64_t(i);
    defs.push_back(std::move(a));
    defs.push_back({{b_name, {layer.out, R}, true}, 0.0, 0.0});
  }
}

void LoraPlan::freeze(std::vector<ParamDef>& defs) const {
  if (!enabled()) return;
  for (ParamDef& def : defs) def.spec.frozen = true;
}

void LoraPlan::visit_hidden(std::vector<Tensor>& hidden, int B, int T, int64_t S, DType dtype,
                            const BufferVisitor& f) const {
  hidden.resize(layers_.size());
  for (size_t i = 0; i < layers_.size(); ++i)
    if (adapter(int(i)) >= 0) f(hidden[i], {S, B, T, settings_.rank}, dtype);
}

void LoraPlan::merge(std::vector<NamedWeight>& weights) const {
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < weights.size(); ++i) index[weights[i].name] = i;
  const auto partner = [&](const NamedWeight& adapter, std::string_view suffix, std::string_view wanted) {
    const std::string layer(std::string_view(adapter.name).substr(0, adapter.name.size() - suffix.size()));
    const auto it = index.find(layer + std::string(wanted));
    if (it == index.end()) fail(adapter.name, ": no ", layer, wanted, " beside it");
    return it->second;
  };
  const bool out_in = layout_ == ops::WeightLayout::out_in;
  for (const NamedWeight& a : weights) {
    if (a.name.ends_with(kBSuffix)) partner(a, kBSuffix, kASuffix);
    if (!a.name.ends_with(kASuffix)) continue;
    const NamedWeight& b = weights[partner(a, kASuffix, kBSuffix)];
    NamedWeight& w = weights[partner(a, kASuffix, ".weight")];
    const int64_t R = settings_.rank, in = a.shape.size() == 2 ? a.shape[1] : 0, out = b.shape.empty() ? 0 : b.shape[0];
    const Shape w_shape = out_in ? Shape{out, in} : Shape{in, out};
    if (a.shape != Shape{R, in} || b.shape != Shape{out, R} || w.shape != w_shape)
      fail(a.name, " ", shape_str(a.shape), " and ", b.name, " ", shape_str(b.shape), " do not fit rank ", R, " and ",
           w.name, " ", shape_str(w.shape));
    // Summed in double, as the adapted forward's two GEMMs accumulate each in fp32 at least.
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i) {
        double delta = 0;
        for (int64_t r = 0; r < R; ++r) delta += double(b.values[size_t(o * R + r)]) * a.values[size_t(r * in + i)];
        w.values[size_t(out_in ? o * in + i : i * out + o)] += float(scale() * delta);
      }
  }
  std::erase_if(weights, [](const NamedWeight& p) { return p.name.ends_with(kASuffix) || p.name.ends_with(kBSuffix); });
}

void LoraPlan::check_peft_config(const nlohmann::json& config, const std::string& path) const {
  const auto differ = [&](Option option, const char* key, const std::string& says, const std::string& gives) {
    throw UsageError(detail::concat(option_name(option), ": ", path, " says ", key, " ", says, ", the run gives ",
                                    gives, " (the adapters must be loaded as they were trained)"));
  };
  try {
    // PEFT's settings that compute another model than plain LoRA's x A^T B^T alpha / r on every targeted
    // layer: refused, as a differing alpha is, rather than loaded into the wrong math.
    const auto unsupported = [&](const char* key, const char* what) {
      throw UsageError(detail::concat("--init-from: ", path, " says ", key, " ",
                                      config.at(key).dump(), " (", what, "); zshard's adapters are plain LoRA"));
    };
    // Absent, null, false or empty: PEFT's defaults.
    const auto set = [&](const char* key) {
      const auto it = config.find(key);
      if (it == config.end() || it->is_null()) return false;
      return it->is_boolean() ? it->get<bool>() : !(it->is_structured() && it->empty());
    };
    if (const auto type = config.find("peft_type"); type != config.end() && *type != "LORA")
      unsupported("peft_type", "another kind of adapter");
    if (set("use_rslora")) unsupported("use_rslora", "scaled by alpha / sqrt(r)");
    if (set("use_dora")) unsupported("use_dora", "weight-decomposed");
    for (const char* key : {"rank_pattern", "alpha_pattern"})
      if (set(key)) unsupported(key, "another rank or alpha on some layers");
    if (set("layers_to_transform")) unsupported("layers_to_transform", "adapters on some blocks only");
    if (set("modules_to_save")) unsupported("modules_to_save", "whole modules trained beside the adapters");
    if (const auto bias = config.find("bias"); bias != config.end() && !bias->is_null() && *bias != "none")
      unsupported("bias", "biases trained beside the adapters");
    if (const auto r = config.find("r"); r != config.end() && r->get<int64_t>() != settings_.rank)
      differ(Option::lora_rank, "r", r->dump(), std::to_string(settings_.rank));
    if (const auto alpha = config.find("lora_alpha"); alpha != config.end() && alpha->get<double>() != settings_.alpha)
      differ(Option::lora_alpha, "lora_alpha", alpha->dump(), nlohmann::json(settings_.alpha).dump());
    // PEFT also takes a regular expression, or none: only a list of names can be compared, by the layers
    // they name (q_proj and self_attn.q_proj name the same ones).
    if (const auto targets = config.find("target_modules"); targets != config.end() && targets->is_array()) {
      const std::vector<std::string> saved = targets->get<std::vector<std::string>>();
      if (layers_named(saved, layers_) != layers_named(split_targets(settings_.targets), layers_)) {
        std::string text;
        for (const std::string& t : saved) text += (text.empty() ? "" : ",") + t;
        differ(Option::lora_targets, "target_modules", text, settings_.targets);
      }
    }
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(detail::concat(path, ": not PEFT's adapter_config.json (", e.what(), ")"));
  }
}

std::string LoraPlan::peft_config() const {
  const nlohmann::json config = {{"peft_type", "LORA"},
                                 {"r", settings_.rank},
                                 {"lora_alpha", settings_.alpha},
                                 {"target_modules", split_targets(settings_.targets)},
                                 {"fan_in_fan_out", layout_ == ops::WeightLayout::in_out},
                                 {"bias", "none"}};
  return config.dump(2) + "\n";
}

ModelConfig LoraPlan::with_targeted_layers(ModelConfig config) const {
  const auto targets = config.find(kTargetsKey);
  if (targets == config.end() || !targets->second.is_text()) return config;
  std::set<std::string> names;
  for (const std::string& target : split_targets(targets->second.text())) {
    const std::set<size_t> named = layers_named({target}, layers_);
    if (named.empty()) names.insert(target);
    for (size_t i : named) names.insert(layers_[i].name);
  }
  std::string text;
  for (const std::string& name : names) text += (text.empty() ? "" : ",") + name;
  targets->second = ConfigValue(text);
  return config;
}

}  // namespace zshard
