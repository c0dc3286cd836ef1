#include "shard/weights_file.h"

#include <algorithm>
#include <filesystem>
#include <set>
#include <string_view>

#include "kernels/io/file_kind.h"
#include "shard/flat_unit.h"

namespace zshard {

namespace {

// What Hugging Face's *LMHeadModel / *ForCausalLM put in front of the base model's names, and PEFT in
// front of those in an adapter file; the longest that matches is stripped.
constexpr std::string_view kPeftPrefix = "base_model.model.";
constexpr std::string_view kPrefixes[] = {"base_model.model.transformer.", kPeftPrefix, "transformer.", "model."};

std::string_view strip_prefix(std::string_view name) {
  for (std::string_view prefix : kPrefixes)
    if (name.starts_with(prefix)) return name.substr(prefix.size());
  return name;
}

bool has_tensor(const SafetensorsFile& file, const std::string& name) {
  if (file.contains(name)) return true;
  for (std::string_view prefix : kPrefixes)
    if (file.contains(std::string(prefix) + name)) return true;
  return false;
}

// Buffers (causal masks, rotary frequencies) and a tied output head: present in some files, loaded only
// where the model declares them as parameters.
bool is_ignored(std::string_view name) {
  name = strip_prefix(name);
  return name == "lm_head.weight" || name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias") ||
         name.ends_with(".rotary_emb.inv_freq");
}

}  // namespace

std::string resolve_name(const SafetensorsFile& file, const std::string& name) {
  if (file.contains(name)) return name;
  for (std::string_view prefix : kPrefixes)
    if (const std::string prefixed = std::string(prefix) + name; file.contains(prefixed)) return prefixed;
  fail("safetensors file ", file.path(), ": no tensor named '", name, "' (nor with a ", kPrefixes[2], " or ",
       kPrefixes[3], " prefix) nor with PEFT's ", kPrefixes[1]);
}

bool is_adapter(std::string_view name) {
  return name.find(".lora_A.") != std::string_view::npos || name.find(".lora_B.") != std::string_view::npos;
}

WeightsCoverage weights_coverage(const SafetensorsFile& file, const std::vector<UnitSpec>& units) {
  bool any_adapter = false, all_adapters = true, any_base = false, all_base = true;
  std::string first_missing, first_missing_adapter;
  for (const UnitSpec& unit : units)
    for (const ParamSpec& p : unit.params) {
      const bool present = has_tensor(file, p.name), adapter = is_adapter(p.name);
      (adapter ? any_adapter : any_base) |= present;
      (adapter ? all_adapters : all_base) &= present;
      if (!present && first_missing.empty()) first_missing = p.name;
      if (!present && adapter && first_missing_adapter.empty()) first_missing_adapter = p.name;
    }
  if (all_base && all_adapters) return WeightsCoverage::everything;
  if (all_base && !any_adapter) return WeightsCoverage::base;
  if (all_adapters && any_adapter && !any_base) return WeightsCoverage::adapters;
  const std::vector<std::string> names = file.names();
  if (!any_base && !any_adapter && !names.empty() && std::all_of(names.begin(), names.end(), [](const std::string& n) {
        return is_adapter(n);
      }))
    fail(file.path(), ": holds LoRA adapters (", names.front(), ", ...) of none of this model's layers: ",
         all_adapters ? "it has no adapters (trained with --lora-rank?)" : "trained on another model?");
  // Adapters of some of the run's layers: the missing adapter is the one to name, not a base tensor.
  if (any_adapter && !any_base)
    fail(file.path(), ": holds LoRA adapters of some of this model's layers, not ", first_missing_adapter,
         " (trained on other --lora-targets?)");
  resolve_name(file, first_missing);  // throws, naming the file and the parameter
  return WeightsCoverage::everything;
}

void save_adapters(const std::string& path, const std::vector<UnitSpec>& units,
                   const std::vector<FlatValues>& flat_units) {
  std::vector<SafetensorsArray> arrays;
  for (size_t u = 0; u < units.size(); ++u) {
    const FlatLayout layout(units[u], 1);
    for (size_t i = 0; i < units[u].params.size(); ++i) {
      const ParamSpec& p = units[u].params[i];
      if (!is_adapter(p.name)) continue;
      ZS_CHECK(int64_t(flat_units[u].size()) >= layout.numel(), "unit ", units[u].name, ": ", flat_units[u].size(),
               " elements, the layout needs ", layout.numel());
      arrays.push_back({std::string(kPeftPrefix) + p.name, flat_units[u].data() + layout.offset(int(i)), p.shape});
    }
  }
  save_safetensors(path, arrays, {{"format", "pt"}, {"producer", "zshard"}});
}

std::vector<std::string> unmatched_tensors(const SafetensorsFile& file,
                                           const std::vector<std::string>& expected) {
  const std::set<std::string_view> wanted(expected.begin(), expected.end());
  std::vector<std::string> out;
  for (const std::string& name : file.names())
    if (!wanted.count(name) && !wanted.count(strip_prefix(name)) && !is_ignored(name)) out.push_back(name);
  return out;
}

WeightsCoverage check_weights_file(const std::string& path, const Model& model) {
  // Before the open, which would wait for a FIFO's writer; the open names a missing file and a directory.
  std::error_code ec;
  const std::filesystem::file_type type = std::filesystem::status(path, ec).type();
  if (const std::string_view what = unreadable_kind(type); !what.empty() && type != std::filesystem::file_type::directory)
    fail(path, ": is ", what, ", not a safetensors file");
  const SafetensorsFile file = SafetensorsFile::open(path);
  const std::vector<UnitSpec> units = model.units();
  const WeightsCoverage coverage = weights_coverage(file, units);
  std::vector<std::string> expected;
  for (const UnitSpec& unit : units) {
    for (const ParamSpec& p : unit.params) {
      if (!has_tensor(file, p.name)) continue;  // an adapter of a base file, or the base of an adapter file
      const SafetensorsEntry& e = file.entry(resolve_name(file, p.name));
      if (e.shape != p.shape)
        fail(path, ": tensor ", e.name, " has shape ", shape_str(e.shape), ", the model needs ", shape_str(p.shape),
             is_adapter(p.name) ? " (adapters of another --lora-rank or model size?)" : "");
      expected.push_back(p.name);
    }
  }
  const std::vector<std::string> extra = unmatched_tensors(file, expected);
  if (!extra.empty())
    fail(path, ": tensor ", extra.front(), " (and ", extra.size() - 1,
         " more) belongs to no parameter of this model; was it saved from another size",
         is_adapter(extra.front()) ? ", or for other LoRA targets?" : "?");
  return coverage;
}

}  // namespace zshard
