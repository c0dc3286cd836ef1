#include "runtime/cli/model_options.h"

#include <atomic>
#include <cmath>
#include <map>
#include <memory>
#include <ostream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "runtime/cli/flags.h"

namespace zshard {

namespace {

// KEY=VALUE's value: an integer when it spells one whole, else a finite real number (rope_theta=5e5).
std::optional<ConfigValue> config_number(const std::string& text) {
  size_t used = 0;
  try {
    const long long i = std::stoll(text, &used);
    if (used == text.size()) return ConfigValue(int64_t(i));
    const double d = std::stod(text, &used);
    if (used == text.size() && std::isfinite(d)) return ConfigValue(d);
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

// --config's items as KEY=VALUE pairs. A value that is not a number is a text, which a list continues: in
// lora_targets=q_proj,v_proj,layers=4 the item v_proj, having no '=', is the text's next element.
std::vector<std::pair<std::string, std::string>> config_pairs(const std::vector<std::string>& items) {
  std::vector<std::pair<std::string, std::string>> pairs;
  for (const std::string& item : items) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos && !pairs.empty() && !config_number(pairs.back().second)) {
      pairs.back().second += "," + item;
      continue;
    }
    if (eq == 0 || eq == std::string::npos || eq + 1 == item.size())
      throw CLI::ValidationError("--config", "expected KEY=VALUE, got '" + item + "'");
    pairs.emplace_back(item.substr(0, eq), item.substr(eq + 1));
  }
  return pairs;
}


}  // namespace

std::string_view recompute_flag(Recompute mode) { return mode == Recompute::blocks ? "blocks" : "none"; }

std::string_view fused_epilogues_flag(FusedEpilogues mode) {
  return mode == FusedEpilogues::on ? "on" : mode == FusedEpilogues::off ? "off" : "auto";
}

void add_model_flags(CLI::App& app, std::string& model, ModelConfig& overrides) {
  std::string known;
  for (const std::string& name : model_names()) known += (known.empty() ? "" : ", ") + name;
  app.add_option("--model", model, "model: " + known);
  // A key set twice (--layers 2 --config layers=3, or layers=3,layers=4) is refused: otherwise the order
  // CLI11 runs the flags' callbacks in, not the command line's, would settle it.
  const auto set_by = std::make_shared<std::map<std::string, std::string>>();
  const auto set = [&overrides, set_by](const std::string& flag, const std::string& key, ConfigValue value) {
    const auto [first, fresh] = set_by->emplace(key, flag);
    if (!fresh) throw CLI::ValidationError(flag, key + " is set twice (also by " + first->second + ")");
    overrides.insert_or_assign(key, value);
  };
  app.preparse_callback([set_by](std::size_t) { set_by->clear(); });  // each parse starts afresh
  add_list_option(
         app, "--config",
         [set](const std::vector<std::string>& items) {
           for (const auto& [key, text] : config_pairs(items))
             set("--config", key, config_number(text).value_or(ConfigValue(text)));
         },
         "override the model's configuration: KEY=VALUE, comma separated (e.g. layers=4,dim=128; a list as "
         "lora_targets=q_proj,v_proj)");
  // Shorthands for --config of the keys the transformer families share (a model without the key refuses it).
  for (const auto& [flag, key] : {std::pair{"--layers", "layers"}, std::pair{"--dim", "dim"},
                                  std::pair{"--heads", "heads"}, std::pair{"--vocab", "vocab"},
                                  std::pair{"--ctx", "ctx"}, std::pair{"--kv-heads", "kv_heads"},
                                  std::pair{"--ffn-dim", "ffn_dim"}})
    app.add_option_function<int64_t>(
        flag, [set, flag, key](int64_t value) { set(flag, key, ConfigValue(value)); },
        std::string("the model's ") + key + " (--config " + key + "=VALUE)");
  app.add_option_function<double>(
      "--rope-theta", [set](double theta) { set("--rope-theta", "rope_theta", ConfigValue(theta)); },
      "the model's rotary base, e.g. 500000 (--config rope_theta=VALUE)");
  app.add_option_function<bool>(
      "--tie-embeddings", [set](bool tied) { set("--tie-embeddings", "tie_embeddings", ConfigValue(tied)); },
      "the output head reuses the token embedding: true or false (--config tie_embeddings=1|0)");
  // LoRA (PEFT's semantics): every other parameter frozen. Each a shorthand of --config.
  app.add_option_function<int64_t>(
      "--lora-rank", [set](int64_t rank) { set("--lora-rank", "lora_rank", ConfigValue(rank)); },
      "LoRA adapters of this rank on the targeted layers, every other parameter frozen (--config lora_rank=R)");
  app.add_option_function<double>(
      "--lora-alpha", [set](double alpha) { set("--lora-alpha", "lora_alpha", ConfigValue(alpha)); },
      "LoRA's alpha: the adapters' output scaled by alpha / rank; default 8, as PEFT's (--config lora_alpha=A)");
  add_list_option(
      app, "--lora-targets",
      [set](const std::vector<std::string>& targets) {
        std::string text;
        for (size_t i = 0; i < targets.size(); ++i) {
          refuse_repeat("--lora-targets", targets, i);
          text += (text.empty() ? "" : ",") + targets[i];
        }
        set("--lora-targets", "lora_targets", ConfigValue(text));
      },
      "the layers LoRA adapts, by their names' ends as PEFT's target_modules (c_attn,c_proj,c_fc for GPT-2; "
      "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj for Llama); default PEFT's: c_attn, q_proj,v_proj");
  app.parse_complete_callback([set_by, &model, &overrides] {
    // A key the model lacks, set by a shorthand (--layers for a model without layers), is named by the
    // shorthand the user gave rather than by --config. An unknown --model is left to its own check.
    for (const auto& [key, flag] : *set_by) {
      if (flag == "--config") continue;
      try {
        model_config(model, {{key, overrides.at(key)}});
      } catch (const UsageError& e) {
        const std::string message = e.what(), by_config = "--config: ";
        if (message.starts_with(by_config)) throw CLI::ValidationError(flag, message.substr(by_config.size()));
      }
    }
    // An alpha or targets without a rank would adapt nothing: refused here, naming the flag that set it.
    if (set_by->count("lora_rank")) return;
    for (const char* key : {"lora_alpha", "lora_targets"})
      if (const auto it = set_by->find(key); it != set_by->end())
        throw CLI::ValidationError(it->second, std::string(key) + " needs --lora-rank");
  });
}

void add_recompute_flag(CLI::App& app, Recompute& mode) {
  Choices<Recompute> modes;
  for (Recompute m : {Recompute::none, Recompute::blocks}) modes.emplace_back(std::string(recompute_flag(m)), m);
  add_choice(app, "--activation-checkpointing", mode, modes,
             "none, or blocks: keep each block's input only and recompute the block inside its backward "
             "(less activation memory, one more block forward per step, the same results)");
}

std::string_view attention_flag(AttentionKernel kernel) {
  switch (kernel) {
    case AttentionKernel::fused: return "fused";
    case AttentionKernel::blocks: return "blocks";
    default: return "auto";
  }
}

void add_attention_flag(CLI::App& app, AttentionKernel& kernel) {
  Choices<AttentionKernel> kernels;
  for (AttentionKernel k : {AttentionKernel::automatic, AttentionKernel::fused, AttentionKernel::blocks})
    kernels.emplace_back(std::string(attention_flag(k)), k);
  add_choice(app, "--attention", kernel, kernels,
             "auto: fused where it runs, else blocks; fused: keep each query row's softmax statistics only and "
             "recompute the probabilities in backward (on cpu in every dtype; on cuda in bf16 only, through "
             "cuDNN loaded at run time, so fp32 on cuda keeps blocks); blocks: keep the (batch, heads, seq, seq) "
             "probabilities. The same results but for rounding");
}

void add_freeze_flag(CLI::App& app, std::vector<std::string>& patterns) {
  add_list_option(app, "--freeze", patterns,
                  "parameters to freeze, by name, '*' matching any characters: e.g. 'wte.weight,h.*.ln_*' (no "
                  "gradient, master weight or optimizer state; held and gathered as the compute copy is)");
}

void add_model_flags(CLI::App& app, ModelOptions& o) {
  add_model_flags(app, o.name, o.overrides);
  add_list_option(
      app, "--init-from",
      [&o](const std::vector<std::string>& files) {
        if (files.size() > 2)
          throw CLI::ValidationError("--init-from", "takes a weights file and at most one adapter file, got " +
                                                        std::to_string(files.size()) + " files");
        o.init_from = files[0];
        o.init_adapters = files.size() == 2 ? files[1] : "";
      },
      "initial weights (safetensors with the model's parameter names); BASE,ADAPTERS: a base model's weights "
      "and LoRA adapters (PEFT's names) loaded over them (a path cannot hold a comma)");
  // An unsigned flag would take -1 as 2^64-1, and anything past 2^64-1 as 2^64-1.
  app.add_option("--seed", o.seed, "initialisation seed")
      ->check(CLI::Validator(
          [](const std::string& v) {
            if (v.rfind('-', 0) == 0) return "must be >= 0, got " + v;
            try {
              std::stoull(v);
            } catch (const std::out_of_range&) {
              return "must be below 2^64, got " + v;
            } catch (const std::exception&) {
            }
            return std::string();
          },
          ""));
  add_recompute_flag(app, o.recompute);
  add_attention_flag(app, o.attention);
  add_freeze_flag(app, o.freeze);
  add_fused_epilogues_flag(app, o.fused_epilogues);
  add_choice<bool>(app, "--cuda-graphs", o.cuda_graphs, {{"on", true}, {"off", false}},
                   "on or off: after one plain step, record a step as a CUDA graph and replay it, one launch a "
                   "step instead of hundreds (cuda, one rank, no --offload; an evaluation or a load records "
                   "anew). The same results");
}

void add_fused_epilogues_flag(CLI::App& app, FusedEpilogues& mode) {
  Choices<FusedEpilogues> fused;
  for (FusedEpilogues m : kFusedEpilogueModes) fused.emplace_back(std::string(fused_epilogues_flag(m)), m);
  add_choice(app, "--fused-epilogues", mode, fused,
             "auto, on or off: the linear layers' bias, GELU and bias gradient inside their GEMMs (cuBLASLt on "
             "cuda), the residual add inside the norm after it, activation gradients set rather than zeroed "
             "and added to. The same results in f32; in bf16 a fused layer rounds once where the separate ops "
             "round up to three times. auto: on, except in bf16 on the cpu (the reference of cuda's "
             "rounding)");
}

bool freezes_parameters(const ModelOptions& o) { return !o.freeze.empty() || o.overrides.count("lora_rank"); }

ModelConfig resolve_model_config(const ModelOptions& o) { return model_config(o.name, o.overrides); }

AttentionKernel configure_model(Model& model, const ModelOptions& o, const Placement& placement, std::ostream* note) {
  model.set_recompute(o.recompute);
  model.set_fused_epilogues(o.fused_epilogues);
  std::string fallback;
  const AttentionKernel kernel =
      choose_attention(model, o.attention, placement.device, placement.param_dtype, &fallback);
  // Once per process: a run may build its model again (--batch auto's attempts, zshard-bench's strategies).
  static std::atomic<bool> said{false};
  if (note && !fallback.empty() && !said.exchange(true))
    *note << "zshard: --attention auto: blocks, not fused (" << fallback << ")\n";
  return kernel;
}

}  // namespace zshard
