#include "shard/weights_file.h"

#include <filesystem>
#include <set>
#include <string_view>

#include "kernels/io/file_kind.h"

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

void check_weights_file(const std::string& path, const Model& model) {
  // Before the open, which would wait for a FIFO's writer; the open names a missing file and a directory.
  std::error_code ec;
  const std::filesystem::file_type type = std::filesystem::status(path, ec).type();
  if (const std::string_view what = unreadable_kind(type); !what.empty() && type != std::filesystem::file_type::directory)
    fail(path, ": is ", what, ", not a safetensors file");
  const SafetensorsFile file = SafetensorsFile::open(path);
  std::vector<std::string> expected;
  for (const UnitSpec& unit : model.units()) {
    for (const ParamSpec& p : unit.params) {
      const SafetensorsEntry& e = file.entry(resolve_name(file, p.name));
      if (e.shape != p.shape)
        fail(path, ": tensor ", e.name, " has shape ", shape_str(e.shape), ", the model needs ",
             shape_str(p.shape));
      expected.push_back(p.name);
    }
  }
  const std::vector<std::string> extra = unmatched_tensors(file, expected);
  if (!extra.empty())
    fail(path, ": tensor ", extra.front(), " (and ", extra.size() - 1,
         " more) belongs to no parameter of this model; was it saved from another size?");
}

}  // namespace zshard
