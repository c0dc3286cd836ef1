#include "models/weights_file.h"

#include <set>
#include <string_view>

namespace zshard {

namespace {

// What Hugging Face's *LMHeadModel / *ForCausalLM put in front of the base model's names.
constexpr std::string_view kPrefixes[] = {"transformer.", "model."};

std::string_view strip_prefix(std::string_view name) {
  for (std::string_view prefix : kPrefixes)
    if (name.starts_with(prefix)) return name.substr(prefix.size());
  return name;
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
  fail("safetensors file ", file.path(), ": no tensor named '", name, "' (nor with a ", kPrefixes[0], " or ",
       kPrefixes[1], " prefix)");
}

std::vector<std::string> unmatched_tensors(const SafetensorsFile& file,
                                           const std::vector<std::string>& expected) {
  const std::set<std::string_view> wanted(expected.begin(), expected.end());
  std::vector<std::string> out;
  for (const std::string& name : file.names())
    if (!wanted.count(name) && !wanted.count(strip_prefix(name)) && !is_ignored(name)) out.push_back(name);
  return out;
}

}  // namespace zshard
