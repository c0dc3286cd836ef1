#include "models/gpt2_weights.h"

#include <set>
#include <string_view>

namespace zshard {

namespace {

constexpr std::string_view kPrefix = "transformer.";

std::string_view strip_prefix(std::string_view name) {
  return name.starts_with(kPrefix) ? name.substr(kPrefix.size()) : name;
}

// Causal-mask buffers and the tied output head: present in some files, never loaded.
bool is_ignored(std::string_view name) {
  name = strip_prefix(name);
  return name == "lm_head.weight" || name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias");
}

}  // namespace

std::string resolve_name(const SafetensorsFile& file, const std::string& name) {
  if (file.contains(name)) return name;
  const std::string prefixed = std::string(kPrefix) + name;
  if (file.contains(prefixed)) return prefixed;
  fail("safetensors file ", file.path(), ": no tensor named '", name, "' or '", prefixed, "'");
}

std::vector<std::string> unmatched_tensors(const SafetensorsFile& file,
                                           const std::vector<std::string>& expected) {
  const std::set<std::string_view> wanted(expected.begin(), expected.end());
  std::vector<std::string> out;
  for (const std::string& name : file.names())
    if (!wanted.count(strip_prefix(name)) && !is_ignored(name)) out.push_back(name);
  return out;
}

}  // namespace zshard
